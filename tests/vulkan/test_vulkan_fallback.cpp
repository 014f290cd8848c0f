// SPDX-License-Identifier: MIT
// Failure is a fallback, never a crash: a device without the extension, a lost device and every
// failing VkResult turn into the region's fallback reason with the result's name, and nothing
// the importer made stays allocated.
#include <catch2/catch.hpp>

#include <vector>

#include "support/temp_file.hpp"
#include "vulkan/vk_test_device.hpp"
#include "weightmap/backends/vulkan.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/planner.hpp"

using namespace wm;
using wm::test::DriverCall;
using wm::test::TempFile;
using wm::test::VkTestDevice;
namespace recorder = wm::test::recorder;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

struct TwoRegionModel {
    TempFile file_a{2 * MiB};
    TempFile file_b{2 * MiB};
    std::vector<std::string> paths{file_a.path(), file_b.path()};
    MappedModel mapped = MappedModel::open(paths, MappingAccess::read_only).value();
    ModelDesc model;
    explicit TwoRegionModel(const Importer& importer) {
        model.files = {{file_a.path(), file_a.size()}, {file_b.path(), file_b.size()}};
        model.targets = {target_for("Vulkan0", importer)};
        model.tensors = {{"a", 0, 4096, MiB, 0}, {"b", 1, 0, MiB, 0}};
    }
    Result<Placement> execute(Importer& importer) {
        PlanOptions options;
        options.import_enabled = true;
        auto plan = make_plan(model, options);
        REQUIRE(plan.ok());
        std::vector<Importer*> importers{&importer};
        ExecuteOptions quiet;
        quiet.log = [](LogLevel, std::string_view) {};
        return execute_plan(model, std::move(plan).value(), mapped.files(), importers, quiet);
    }
};
} // namespace

TEST_CASE("make_vulkan_importer names the required handles that are missing") {
    Result<std::unique_ptr<Importer>> refused = make_vulkan_importer(VulkanImporterParams{});
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(refused.error().message,
               Catch::Contains("instance, physical_device, device, get_instance_proc_addr"));
}

TEST_CASE("a device created without the extension gives an unavailable importer with the reason") {
    auto dev = VkTestDevice::create_or_skip({/*enable_external_memory_host=*/false});
    recorder::reset();

    SECTION("the engine says it did not enable it") {
        auto made = make_vulkan_importer(dev->importer_params());
        REQUIRE(made.ok());
        Availability a = made.value()->available();
        CHECK_FALSE(a.available);
        CHECK_THAT(a.reason, Catch::Contains(
                                 "VK_EXT_external_memory_host was not enabled at vkCreateDevice"));
        TwoRegionModel m(*made.value());
        auto placement = m.execute(*made.value());
        REQUIRE(placement.ok());
        for (std::uint32_t i = 0; i < 2; ++i) {
            CHECK_FALSE(placement->locate(i).imported);
            CHECK_THAT(std::string(placement->locate(i).reason),
                       Catch::Contains("was not enabled"));
        }
    }
    SECTION("the engine claims it did, but the device does not expose the entry point") {
        VulkanImporterParams params = dev->importer_params();
        params.external_memory_host_enabled = true;
        auto made = make_vulkan_importer(params);
        REQUIRE(made.ok());
        Availability a = made.value()->available();
        CHECK_FALSE(a.available);
        CHECK_THAT(a.reason, Catch::Contains("vkGetMemoryHostPointerPropertiesEXT"));
        TempFile file(MiB);
        MappedModel mapped = wm::test::map_file(file.path());
        Result<ImportedBuffer> refused = made.value()->import(mapped.files()[0].base, MiB);
        REQUIRE_FALSE(refused.ok());
        CHECK(refused.error().kind == ErrorKind::unsupported);
        CHECK_THAT(refused.error().message, Catch::Contains("vkGetMemoryHostPointerPropertiesEXT"));
    }
    CHECK(recorder::calls().empty());
}

TEST_CASE("a lost device becomes the fallback reason, and later imports do not reach the driver") {
    auto dev = VkTestDevice::create_or_skip();
    auto made = make_vulkan_importer(dev->importer_params(VK_BUFFER_USAGE_TRANSFER_SRC_BIT));
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    TwoRegionModel m(importer);

    recorder::reset();
    const std::int64_t live_before = recorder::live_objects();
    // The driver reports the device lost at the first import's allocation.
    recorder::inject(DriverCall::Kind::allocate_memory, VK_ERROR_DEVICE_LOST);
    auto placement = m.execute(importer);
    REQUIRE(placement.ok());
    TensorLocation first = placement->locate(0), second = placement->locate(1);
    CHECK_FALSE(first.imported);
    CHECK_THAT(std::string(first.reason), Catch::Contains("vkAllocateMemory"));
    CHECK_THAT(std::string(first.reason), Catch::Contains("VK_ERROR_DEVICE_LOST"));
    CHECK_FALSE(second.imported);
    CHECK_THAT(std::string(second.reason), Catch::Contains("was lost"));
    CHECK_THAT(std::string(second.reason), Catch::Contains("VK_ERROR_DEVICE_LOST"));
    // One allocation attempt in all: the second region never reached the driver.
    CHECK(recorder::calls_of(DriverCall::Kind::allocate_memory).size() == 1);
    CHECK(recorder::live_objects() == live_before); // the first import's buffer was destroyed

    Availability a = importer.available();
    CHECK_FALSE(a.available);
    CHECK_THAT(a.reason, Catch::Contains("VK_ERROR_DEVICE_LOST"));
    std::uint8_t byte = 0;
    ImportedBuffer copy; // a copy's read_back reaches the importer, which says the device is lost
    copy.imported = false;
    copy.size = 1;
    CHECK(importer.read_back(copy, 0, 1, &byte).error().kind == ErrorKind::unsupported);
}

TEST_CASE("every failing VkResult is the import's error by name, and nothing stays allocated") {
    auto dev = VkTestDevice::create_or_skip();
    auto made = make_vulkan_importer(dev->importer_params(VK_BUFFER_USAGE_TRANSFER_SRC_BIT));
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    TempFile file(MiB);
    MappedModel mapped = wm::test::map_file(file.path());
    std::byte* base = mapped.files()[0].base;

    struct Case {
        DriverCall::Kind kind;
        VkResult result;
        const char* call;
        const char* name;
    };
    const Case cases[] = {
        {DriverCall::Kind::host_pointer_properties, VK_ERROR_INVALID_EXTERNAL_HANDLE,
         "vkGetMemoryHostPointerPropertiesEXT", "VK_ERROR_INVALID_EXTERNAL_HANDLE"},
        {DriverCall::Kind::create_buffer, VK_ERROR_OUT_OF_HOST_MEMORY, "vkCreateBuffer",
         "VK_ERROR_OUT_OF_HOST_MEMORY"},
        {DriverCall::Kind::allocate_memory, VK_ERROR_INVALID_EXTERNAL_HANDLE, "vkAllocateMemory",
         "VK_ERROR_INVALID_EXTERNAL_HANDLE"},
        {DriverCall::Kind::allocate_memory, VK_ERROR_OUT_OF_DEVICE_MEMORY, "vkAllocateMemory",
         "VK_ERROR_OUT_OF_DEVICE_MEMORY"},
        {DriverCall::Kind::bind_buffer_memory, VK_ERROR_OUT_OF_DEVICE_MEMORY, "vkBindBufferMemory",
         "VK_ERROR_OUT_OF_DEVICE_MEMORY"},
    };
    for (const Case& c : cases) {
        INFO(c.call << " -> " << c.name);
        recorder::reset();
        const std::int64_t live_before = recorder::live_objects();
        recorder::inject(c.kind, c.result);
        Result<ImportedBuffer> refused = importer.import(base, MiB);
        REQUIRE_FALSE(refused.ok());
        CHECK(refused.error().kind == ErrorKind::import_failed);
        CHECK_THAT(refused.error().message, Catch::Contains(c.call) && Catch::Contains(c.name));
        CHECK(recorder::live_objects() == live_before);
        // Not a lost device: the importer stays usable and the next import goes through.
        CHECK(importer.available().available);
        Result<ImportedBuffer> next = importer.import(base, MiB);
        REQUIRE(next.ok());
        REQUIRE(importer.release(next.value()).ok());
        CHECK(recorder::live_objects() == live_before);
    }
}
