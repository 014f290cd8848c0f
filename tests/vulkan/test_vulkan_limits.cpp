// SPDX-License-Identifier: MIT
// Size limits: no import over maxMemoryAllocationSize, nor over maxStorageBufferRange when the
// engine binds storage buffers; the importer refuses before the driver sees it, and the planner
// splits a region into runs that fit or falls a too-large tensor back with the reason.
#include <catch2/catch.hpp>

#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "internal/align.hpp"
#include "support/skip.hpp"
#include "support/temp_file.hpp"
#include "vulkan/vk_test_device.hpp"
#include "weightmap/backends/vulkan.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/planner.hpp"

using namespace wm;
using wm::test::DriverCall;
using wm::test::VkTestDevice;
namespace recorder = wm::test::recorder;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// A sparse file: mapping it costs nothing, and no test here reads its holes.
struct SparseFile {
    wm::test::TempDir dir;
    std::string path;
    explicit SparseFile(std::uint64_t size) : path(dir.path() + "/sparse.bin") {
        int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        REQUIRE(fd >= 0);
        REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
        close(fd);
    }
};
} // namespace

TEST_CASE(
    "an import over maxStorageBufferRange is refused by name when storage buffers are asked for") {
    auto dev = VkTestDevice::create_or_skip();
    auto made = make_vulkan_importer(dev->importer_params(VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                                          VK_BUFFER_USAGE_TRANSFER_SRC_BIT));
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    const ImporterCaps caps = importer.caps();
    const std::uint64_t expected_max = align_down(
        std::min(dev->max_storage_buffer_range, dev->max_memory_allocation_size), caps.alignment);
    REQUIRE(caps.max_import_size == expected_max);

    SparseFile file(caps.max_import_size + 2 * caps.alignment);
    MappedModel mapped = wm::test::map_file(file.path);
    std::byte* base = mapped.files()[0].base;
    recorder::reset();
    Result<ImportedBuffer> refused = importer.import(base, caps.max_import_size + caps.alignment);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().kind == ErrorKind::limit);
    if (dev->max_storage_buffer_range < dev->max_memory_allocation_size)
        CHECK_THAT(refused.error().message, Catch::Contains("maxStorageBufferRange"));
    CHECK_THAT(refused.error().message, Catch::Contains(std::to_string(caps.max_import_size)));
    CHECK(recorder::calls().empty());

    // Exactly the limit is fine (nothing is read: the import does not touch the pages).
    Result<ImportedBuffer> at_limit = importer.import(base, caps.max_import_size);
    REQUIRE(at_limit.ok());
    CHECK(recorder::calls_of(DriverCall::Kind::allocate_memory).at(0).size == caps.max_import_size);
    REQUIRE(importer.release(at_limit.value()).ok());
}

TEST_CASE("an import over maxMemoryAllocationSize is refused by name before the driver sees it") {
    auto dev = VkTestDevice::create_or_skip();
    auto made = make_vulkan_importer(dev->importer_params(VK_BUFFER_USAGE_TRANSFER_SRC_BIT));
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    const ImporterCaps caps = importer.caps();
    REQUIRE(caps.max_import_size == align_down(dev->max_memory_allocation_size, caps.alignment));

    SparseFile file(caps.max_import_size + 2 * caps.alignment);
    MappedModel mapped = wm::test::map_file(file.path);
    recorder::reset();
    Result<ImportedBuffer> refused =
        importer.import(mapped.files()[0].base, caps.max_import_size + caps.alignment);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().kind == ErrorKind::limit);
    CHECK_THAT(refused.error().message, Catch::Contains("maxMemoryAllocationSize"));
    CHECK(recorder::calls().empty());
    // The control arm has the same limit.
    CHECK(importer.allocate_copy(mapped.files()[0].base, caps.max_import_size + caps.alignment)
              .error()
              .kind == ErrorKind::limit);
}

TEST_CASE("the planner splits a region over the limit into imports that fit, and falls back a "
          "tensor that cannot", "[may_skip]") {
    auto dev = VkTestDevice::create_or_skip();
    auto made = make_vulkan_importer(dev->importer_params(VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                                          VK_BUFFER_USAGE_TRANSFER_SRC_BIT));
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    const std::uint64_t max = importer.caps().max_import_size;
    // Sized by the device's own limit (lavapipe: 128 MiB); only a device with a small limit keeps
    // this test cheap, and the file is sparse either way.
    if (max > 512 * MiB)
        return wm::test::skip("an import limit of " + std::to_string(max) +
                              " bytes would make a real driver pin GiBs");
    const std::uint64_t chunk = align_down(max * 3 / 4, importer.caps().alignment);
    SparseFile file(2 * chunk + max + 2 * MiB);
    MappedModel mapped = wm::test::map_file(file.path);

    ModelDesc model;
    model.files = {{file.path, 2 * chunk + max + 2 * MiB}};
    model.targets = {target_for("Vulkan0", importer)};
    model.tensors = {
        {"a", 0, 0, chunk, 0}, {"b", 0, chunk, chunk, 0}, {"too_big", 0, 2 * chunk, max + MiB, 0}};
    PlanOptions options;
    options.import_enabled = true;
    auto plan = make_plan(model, options);
    REQUIRE(plan.ok());
    recorder::reset();
    std::vector<Importer*> importers{&importer};
    auto placement = execute_plan(model, std::move(plan).value(), mapped.files(), importers);
    REQUIRE(placement.ok());

    TensorLocation a = placement->locate(0), b = placement->locate(1), big = placement->locate(2);
    REQUIRE(a.imported);
    REQUIRE(b.imported);
    CHECK(a.buffer != b.buffer); // together they are 1.5x the limit: two imports
    CHECK(a.buffer->size <= max);
    CHECK(b.buffer->size <= max);
    CHECK_FALSE(big.imported);
    INFO("too_big falls back: " << big.reason);
    CHECK_FALSE(big.reason.empty());
    for (const DriverCall& call : recorder::calls_of(DriverCall::Kind::allocate_memory))
        CHECK(call.size <= max);
}
