// SPDX-License-Identifier: MIT
// Vulkan needs no writable mapping: a read-only shared mapping imports and the device reads it;
// and an import of a writable mapping survives dropping it to PROT_READ (measured on lavapipe,
// which is what caps().survives_read_only_reprotect claims there).
#include <catch2/catch.hpp>

#include <vector>

#include "support/temp_file.hpp"
#include "vulkan/vk_test_device.hpp"
#include "weightmap/backends/vulkan.hpp"
#include "weightmap/mapping.hpp"

using namespace wm;
using wm::test::TempFile;
using wm::test::VkTestDevice;

using wm::test::equals_file_bytes;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

} // namespace

TEST_CASE("a read-only shared mapping imports and the device reads the file through it") {
    auto dev = VkTestDevice::create_or_skip();
    TempFile file(4 * MiB);
    MappedModel mapped = wm::test::map_file(file.path(), MappingAccess::read_only);
    REQUIRE(mapped.is_read_only());
    auto made = make_vulkan_importer(dev->importer_params());
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    // The mapping policy keeps Vulkan's mapping read-only: the importer never asks otherwise.
    CHECK_FALSE(importer.caps().needs_writable_mapping);

    Result<ImportedBuffer> imported = importer.import(mapped.files()[0].base, 4 * MiB);
    REQUIRE(imported.ok());
    CHECK(equals_file_bytes(dev->copy_out(vulkan_buffer(imported.value()), 0, 4 * MiB), 0));
    REQUIRE(importer.release(imported.value()).ok());
}

TEST_CASE("an import of a writable mapping survives re-protecting it read-only") {
    auto dev = VkTestDevice::create_or_skip();
    TempFile file(4 * MiB);
    MappedModel mapped = wm::test::map_file(file.path(), MappingAccess::writable);
    REQUIRE_FALSE(mapped.is_read_only());
    auto made = make_vulkan_importer(dev->importer_params());
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    const bool claimed = importer.caps().survives_read_only_reprotect;
    // Measured on lavapipe; other drivers are not claimed until measured there.
    CHECK(claimed == dev->is_lavapipe());

    Result<ImportedBuffer> imported = importer.import(mapped.files()[0].base + MiB, 2 * MiB);
    REQUIRE(imported.ok());
    REQUIRE(mapped.make_read_only().ok());
    REQUIRE(mapped.is_read_only());
    // The device still reads the file's bytes after the mprotect, with a fresh transfer
    // recorded after it (nothing cached from before).
    std::vector<std::uint8_t> bytes = dev->copy_out(vulkan_buffer(imported.value()), 0, 2 * MiB);
    if (claimed) CHECK(equals_file_bytes(bytes, MiB));
    std::vector<std::uint8_t> back(2 * MiB);
    REQUIRE(importer.read_back(imported.value(), 0, 2 * MiB, back.data()).ok());
    if (claimed) CHECK(equals_file_bytes(back, MiB));
    REQUIRE(importer.release(imported.value()).ok());
    // And the file itself is untouched.
    const auto* file_bytes = reinterpret_cast<const std::uint8_t*>(mapped.files()[0].base);
    CHECK(equals_file_bytes(std::vector<std::uint8_t>(file_bytes, file_bytes + 4 * MiB), 0));
}
