// SPDX-License-Identifier: MIT
// The file-page probe: at creation the importer imports one page of a memfd mapping, so that a
// driver that refuses file-backed host pointers (RADV: libdrm's amdgpu_create_bo_from_user_mem
// passes AMDGPU_GEM_USERPTR_ANONONLY) is known before the planner counts on it. Lavapipe takes
// file pages, so the refusal is injected into the probe's driver calls through the recording
// vkGetDeviceProcAddr; lavapipe's own answer is checked too, with what the probe leaves behind.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "support/temp_file.hpp"
#include "vulkan/vk_test_device.hpp"
#include "weightmap/backends/vulkan.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::DriverCall;
using wm::test::TempFile;
using wm::test::VkTestDevice;
namespace recorder = wm::test::recorder;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;
constexpr const char* probe_memfd = "memfd:weightmap-vulkan-probe";

std::size_t open_fds() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
        ++n;
    return n;
}

bool probe_fd_open() {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
        std::error_code ignored;
        if (std::filesystem::read_symlink(entry.path(), ignored).string().find(probe_memfd) !=
            std::string::npos)
            return true;
    }
    return false;
}

// Shared mappings only (the probe maps its memfd page MAP_SHARED): private ones come and go
// with malloc arenas of lavapipe's worker threads, which made a count of every line fail about
// one run in four (253 before, 259 after, six arena lines).
std::size_t mapping_count() {
    std::ifstream maps("/proc/self/maps");
    std::size_t n = 0;
    for (std::string line; std::getline(maps, line);) {
        const std::size_t perms = line.find(' ');
        if (perms != std::string::npos && perms + 4 < line.size() && line[perms + 4] == 's') ++n;
    }
    return n;
}

bool probe_mapped() {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);)
        if (line.find(probe_memfd) != std::string::npos) return true;
    return false;
}

// Captures the importer's log (the probe's debug line says what it took and how long).
struct LogCapture {
    std::mutex mutex;
    std::vector<std::string> lines;
    LogCallback callback() {
        return [this](LogLevel, std::string_view message) {
            std::lock_guard lock(mutex);
            lines.emplace_back(message);
        };
    }
    std::string find(std::string_view what) {
        std::lock_guard lock(mutex);
        for (const std::string& line : lines)
            if (line.find(what) != std::string::npos) return line;
        return {};
    }
};

// An importer whose probe was refused with `result` at the driver call `kind`.
std::unique_ptr<Importer> refusing_importer(VkTestDevice& dev, DriverCall::Kind kind,
                                            VkResult result) {
    recorder::reset();
    recorder::inject(kind, result);
    auto made = make_vulkan_importer(dev.importer_params(VK_BUFFER_USAGE_TRANSFER_SRC_BIT));
    REQUIRE(made.ok());
    return std::move(made).value();
}

// Anonymous, aligned, writable memory: the pages a RADV-like driver still imports.
struct AnonymousPages {
    std::uint64_t size;
    void* reservation;
    std::byte* base;
    AnonymousPages(std::uint64_t bytes, std::uint64_t alignment) : size(bytes + alignment) {
        reservation = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(reservation != MAP_FAILED);
        const auto address = reinterpret_cast<std::uintptr_t>(reservation);
        base = reinterpret_cast<std::byte*>((address + alignment - 1) & ~(alignment - 1));
        for (std::uint64_t i = 0; i < bytes; i += 4096) base[i] = std::byte{1};
    }
    ~AnonymousPages() { munmap(reservation, size); }
};
} // namespace

TEST_CASE("on lavapipe the file-page probe imports one page and leaves nothing behind") {
    auto dev = VkTestDevice::create_or_skip();
    LogCapture log;
    VulkanImporterParams params = dev->importer_params(VK_BUFFER_USAGE_TRANSFER_SRC_BIT);
    params.log = log.callback();
    recorder::reset();
    const std::int64_t live_before = recorder::live_objects();
    const std::size_t fds_before = open_fds();
    const std::size_t mappings_before = mapping_count();

    auto made = make_vulkan_importer(params);
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    const ImporterCaps caps = importer.caps();
    const std::string probe_line = log.find("file-page probe");
    WARN("device '" << dev->device_name << "': " << probe_line);

    // The probe's driver calls: one page of a memfd mapping, imported, then freed.
    const auto properties = recorder::calls_of(DriverCall::Kind::host_pointer_properties);
    const auto allocations = recorder::calls_of(DriverCall::Kind::allocate_memory);
    const auto frees = recorder::calls_of(DriverCall::Kind::free_memory);
    REQUIRE(properties.size() == 1);
    REQUIRE(allocations.size() == 1);
    CHECK(allocations[0].import);
    CHECK(allocations[0].host_pointer == properties[0].host_pointer);
    CHECK(allocations[0].size == caps.alignment);
    CHECK(reinterpret_cast<std::uintptr_t>(allocations[0].host_pointer) % caps.alignment == 0);
    CHECK(recorder::live_objects() == live_before);
    CHECK(open_fds() == fds_before);
    CHECK(mapping_count() == mappings_before);
    CHECK_FALSE(probe_fd_open());
    CHECK_FALSE(probe_mapped());
    CHECK_FALSE(probe_line.empty());

    if (dev->is_lavapipe()) {
        // Measured: lavapipe imports file-backed pages (it records the pointer, pins nothing).
        CHECK_FALSE(caps.refuses_file_pages);
        CHECK(importer.notes().file_pages.empty());
        CHECK(allocations[0].result == VK_SUCCESS);
        REQUIRE(frees.size() == 1);
        CHECK(frees[0].handle == allocations[0].handle);
        CHECK_THAT(probe_line, Catch::Contains("VK_DRIVER_ID_MESA_LLVMPIPE") &&
                                   Catch::Contains("imported in"));
    } else {
        // Another driver answers for itself; its caps must agree with what it answered.
        CHECK(caps.refuses_file_pages == (allocations[0].result != VK_SUCCESS));
        CHECK(importer.notes().file_pages.empty() == !caps.refuses_file_pages);
    }
}

TEST_CASE("the default importer probes file pages too, and keeps no probe mapping") {
    auto reference = VkTestDevice::create_or_skip();
    Result<std::unique_ptr<Importer>> created = create_importer("vulkan");
    REQUIRE(created.ok());
    Importer& importer = *created.value();
    INFO(importer.available().reason);
    REQUIRE(importer.available().available);
    auto facts = vulkan_importer_facts(importer);
    REQUIRE(facts.ok());
    CHECK_FALSE(probe_fd_open());
    CHECK_FALSE(probe_mapped());
    if (facts->driver_id == VK_DRIVER_ID_MESA_LLVMPIPE) {
        CHECK_FALSE(importer.caps().refuses_file_pages);
        CHECK(importer.notes().file_pages.empty());
    } else {
        CHECK(importer.notes().file_pages.empty() == !importer.caps().refuses_file_pages);
    }
}

TEST_CASE("a driver that refuses file pages: caps say so with the driver and the VkResult") {
    auto dev = VkTestDevice::create_or_skip();
    struct Case {
        DriverCall::Kind kind;
        VkResult result;
        const char* says;
    };
    // Newer RADV turns every amdgpu_create_bo_from_user_mem failure into INVALID_EXTERNAL_HANDLE,
    // older RADV turns the kernel's -EPERM into VK_ERROR_UNKNOWN (radv_amdgpu_winsys_bo_from_ptr).
    const Case cases[] = {
        {DriverCall::Kind::allocate_memory, VK_ERROR_INVALID_EXTERNAL_HANDLE,
         "vkAllocateMemory returned VK_ERROR_INVALID_EXTERNAL_HANDLE"},
        {DriverCall::Kind::allocate_memory, VK_ERROR_UNKNOWN,
         "vkAllocateMemory returned VK_ERROR_UNKNOWN"},
        {DriverCall::Kind::host_pointer_properties, VK_ERROR_INVALID_EXTERNAL_HANDLE,
         "vkGetMemoryHostPointerPropertiesEXT returned VK_ERROR_INVALID_EXTERNAL_HANDLE"},
    };
    for (const Case& c : cases) {
        INFO(c.says);
        const std::int64_t live_before = recorder::live_objects();
        const std::size_t fds_before = open_fds();
        std::unique_ptr<Importer> importer = refusing_importer(*dev, c.kind, c.result);
        // Not broken: file pages just cannot be imported.
        CHECK(importer->available().available);
        const ImporterCaps caps = importer->caps();
        const std::string note(importer->notes().file_pages);
        CHECK(caps.refuses_file_pages);
        CHECK_THAT(note,
                   Catch::Contains("refuses host-pointer imports of file-backed pages: ") &&
                       Catch::Contains(c.says) &&
                       Catch::Contains("(probe of a " + std::to_string(caps.alignment) +
                                       "-byte memfd mapping)") &&
                       Catch::Contains("'" + dev->device_name + "'"));
        if (dev->is_lavapipe())
            CHECK_THAT(note,
                       Catch::StartsWith("llvmpipe (VK_DRIVER_ID_MESA_LLVMPIPE) on 'llvmpipe"));
        CHECK(recorder::live_objects() == live_before);
        CHECK(open_fds() == fds_before);
        CHECK_FALSE(probe_mapped());
    }
}

TEST_CASE("after a refused probe, import() refuses file pages without a driver call") {
    auto dev = VkTestDevice::create_or_skip();
    std::unique_ptr<Importer> importer = refusing_importer(
        *dev, DriverCall::Kind::allocate_memory, VK_ERROR_INVALID_EXTERNAL_HANDLE);
    const ImporterCaps caps = importer->caps();
    REQUIRE(caps.refuses_file_pages);
    TempFile file(MiB);
    MappedModel mapped = wm::test::map_file(file.path());

    recorder::reset();
    Result<ImportedBuffer> refused = importer->import(mapped.files()[0].base, MiB);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().kind == ErrorKind::unsupported);
    CHECK_THAT(refused.error().message, Catch::Contains(std::string(importer->notes().file_pages)));
    CHECK(recorder::calls().empty());

    // Anonymous pages are what such a driver does import: they still reach it.
    AnonymousPages anonymous(MiB, caps.alignment);
    Result<ImportedBuffer> imported = importer->import(anonymous.base, MiB);
    REQUIRE(imported.ok());
    CHECK(recorder::calls_of(DriverCall::Kind::allocate_memory).size() == 1);
    REQUIRE(importer->release(imported.value()).ok());
}

TEST_CASE("a device lost during the probe makes the importer unavailable, not file-refusing") {
    auto dev = VkTestDevice::create_or_skip();
    const std::int64_t live_before = recorder::live_objects();
    std::unique_ptr<Importer> importer =
        refusing_importer(*dev, DriverCall::Kind::allocate_memory, VK_ERROR_DEVICE_LOST);
    Availability a = importer->available();
    CHECK_FALSE(a.available);
    CHECK_THAT(a.reason, Catch::Contains("VK_ERROR_DEVICE_LOST"));
    CHECK_FALSE(importer->caps().refuses_file_pages);
    CHECK(importer->notes().file_pages.empty());
    CHECK(recorder::live_objects() == live_before);
}

// Needs the planner's part (every region of a target whose caps refuse file pages falls back with
// file_pages_note as its reason), landing separately in lib/planner/planner.cpp.
TEST_CASE("every region of a target that refuses file pages falls back with the probe's note") {
    auto dev = VkTestDevice::create_or_skip();
    std::unique_ptr<Importer> importer = refusing_importer(
        *dev, DriverCall::Kind::allocate_memory, VK_ERROR_INVALID_EXTERNAL_HANDLE);
    const std::string note(importer->notes().file_pages);
    REQUIRE_FALSE(note.empty());

    TempFile file_a(2 * MiB), file_b(2 * MiB);
    std::vector<std::string> paths{file_a.path(), file_b.path()};
    MappedModel mapped = MappedModel::open(paths, MappingAccess::read_only).value();
    ModelDesc model;
    model.files = {{file_a.path(), file_a.size()}, {file_b.path(), file_b.size()}};
    model.targets = {target_for("Vulkan0", *importer)};
    model.tensors = {{"a", 0, 4096, MiB, 0}, {"a2", 0, MiB + 4096, 4096, 0}, {"b", 1, 0, MiB, 0}};
    PlanOptions options;
    options.import_enabled = true;
    Result<Plan> plan = make_plan(model, options);
    REQUIRE(plan.ok());
    REQUIRE(plan->regions.size() == 2);
    for (const PlanRegion& region : plan->regions) {
        INFO("region of file " << region.file << ": " << region.reason);
        CHECK(region.decision == Decision::fallback);
        CHECK(region.runs.empty());
        CHECK_THAT(region.reason, Catch::Contains(note));
    }
    CHECK(plan->totals.imports == 0);

    recorder::reset();
    std::vector<Importer*> importers{importer.get()};
    ExecuteOptions quiet;
    quiet.log = [](LogLevel, std::string_view) {};
    auto placement =
        execute_plan(model, std::move(plan).value(), mapped.files(), importers, quiet);
    REQUIRE(placement.ok());
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
        INFO("tensor " << model.tensors[i].name);
        CHECK_FALSE(placement->locate(i).imported);
        CHECK_THAT(std::string(placement->locate(i).reason), Catch::Contains(note));
    }
    CHECK(recorder::calls().empty()); // nothing reached the driver
}
