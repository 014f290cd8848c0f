// SPDX-License-Identifier: MIT
// The registry's default Vulkan importer (what wm-load and the conformance run use): it loads
// the loader itself, owns an instance and a device with the extension, imports, reads back,
// runs the copy arm, and frees whatever is left when it is destroyed.
#include <catch2/catch.hpp>

#include <mutex>
#include <string>
#include <vector>

#include "backend_factories.hpp"
#include "support/temp_file.hpp"
#include "vulkan/vk_test_device.hpp"
#include "weightmap/backends/vulkan.hpp"
#include "weightmap/log.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::TempFile;
using wm::test::VkTestDevice;

using wm::test::equals_file_bytes;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

} // namespace

TEST_CASE("the default Vulkan importer owns a device, imports, reads back and copies") {
    // Decides SKIP (no Vulkan device at all) independently of the code under test.
    auto reference = VkTestDevice::create_or_skip();
    Result<std::unique_ptr<Importer>> created = create_importer("vulkan");
    INFO((created.ok() ? std::string() : created.error().message));
    REQUIRE(created.ok());
    Importer& importer = *created.value();
    CHECK(importer.name() == "vulkan");

    auto facts = vulkan_importer_facts(importer);
    REQUIRE(facts.ok());
    WARN("default Vulkan device '"
         << facts->device_name << "': minImportedHostPointerAlignment "
         << facts->min_imported_host_pointer_alignment << ", maxMemoryAllocationSize "
         << facts->max_memory_allocation_size << ", maxStorageBufferRange "
         << facts->max_storage_buffer_range << ", memory types " << facts->memory_type_count);
    CHECK(facts->min_imported_host_pointer_alignment != 0);
    if (reference->is_lavapipe() && facts->driver_id == VK_DRIVER_ID_MESA_LLVMPIPE) {
        CHECK(facts->min_imported_host_pointer_alignment ==
              reference->min_imported_host_pointer_alignment);
        CHECK(facts->max_memory_allocation_size == reference->max_memory_allocation_size);
    }
    CHECK(importer.caps().alignment ==
          std::max<std::uint64_t>(facts->min_imported_host_pointer_alignment, host_page_size()));

    TempFile file(4 * MiB + 5);
    MappedModel mapped = wm::test::map_file(file.path());
    std::byte* base = mapped.files()[0].base;
    Result<ImportedBuffer> imported = importer.import(base + MiB, 2 * MiB);
    REQUIRE(imported.ok());
    CHECK(imported->native_buffer != 0);
    CHECK(facts.ok());
    std::vector<std::uint8_t> back(2 * MiB);
    REQUIRE(importer.read_back(imported.value(), 0, 2 * MiB, back.data()).ok());
    CHECK(equals_file_bytes(back, MiB));

    Result<ImportedBuffer> copy = importer.allocate_copy(base, 3 * MiB);
    REQUIRE(copy.ok());
    CHECK_FALSE(copy->imported);
    std::vector<std::uint8_t> copied(3 * MiB);
    REQUIRE(importer.read_back(copy.value(), 0, 3 * MiB, copied.data()).ok());
    CHECK(equals_file_bytes(copied, 0));
    REQUIRE(importer.free_copy(copy.value()).ok());
    CHECK_FALSE(importer.free_copy(copy.value()).ok());
    REQUIRE(importer.release(imported.value()).ok());
    CHECK_FALSE(importer.release(imported.value()).ok());
}

TEST_CASE("destroying the default importer frees imports still live, with a warning") {
    auto reference = VkTestDevice::create_or_skip();
    std::mutex mutex;
    std::vector<std::string> warnings;
    set_log_callback([&](LogLevel level, std::string_view message) {
        std::lock_guard lock(mutex);
        if (level >= LogLevel::warning) warnings.emplace_back(message);
    });
    {
        std::unique_ptr<Importer> importer = create_default_vulkan_importer();
        REQUIRE(importer != nullptr);
        INFO(importer->available().reason);
        REQUIRE(importer->available().available);
        TempFile file(MiB);
        MappedModel mapped = wm::test::map_file(file.path());
        REQUIRE(importer->import(mapped.files()[0].base, MiB).ok());
        REQUIRE(importer->allocate_copy(mapped.files()[0].base, MiB).ok());
    } // importer destroyed (buffers freed, then its device and instance), then the mapping
    set_log_callback({});
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Catch::Contains("2 buffers still imported or copied"));
}
