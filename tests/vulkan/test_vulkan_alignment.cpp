// SPDX-License-Identifier: MIT
// The importer enforces the spec's alignment itself: lavapipe accepts unaligned pointers and
// sizes without complaint (measured), real drivers do not, so the proof is what the recording
// layer saw reach the driver, not what lavapipe allowed.
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
} // namespace

TEST_CASE("an unaligned pointer or size is refused before any Vulkan call") {
    auto dev = VkTestDevice::create_or_skip();
    TempFile file(MiB);
    MappedModel mapped = wm::test::map_file(file.path());
    auto made = make_vulkan_importer(dev->importer_params());
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    const std::uint64_t alignment = importer.caps().alignment;
    std::byte* base = mapped.files()[0].base;

    recorder::reset();
    struct Case {
        std::byte* address;
        std::uint64_t size;
    };
    for (Case c : {Case{base + 100, alignment}, Case{base, alignment + 100}, Case{base + 1, 1},
                   Case{base + alignment / 2, alignment / 2}}) {
        Result<ImportedBuffer> refused = importer.import(c.address, c.size);
        REQUIRE_FALSE(refused.ok());
        CHECK(refused.error().kind == ErrorKind::invalid_argument);
        CHECK_THAT(refused.error().message,
                   Catch::Contains("not aligned to " + std::to_string(alignment)));
    }
    CHECK(importer.import(base, 0).error().kind == ErrorKind::invalid_argument);
    CHECK(importer.import(nullptr, alignment).error().kind == ErrorKind::invalid_argument);
    CHECK(recorder::calls().empty());
}

TEST_CASE("unaligned tensors import their aligned superset and resolve to their own bytes") {
    auto dev = VkTestDevice::create_or_skip();
    TempFile file(6 * MiB + 777);
    MappedModel mapped = wm::test::map_file(file.path());
    auto made = make_vulkan_importer(dev->importer_params(VK_BUFFER_USAGE_TRANSFER_SRC_BIT));
    REQUIRE(made.ok());
    Importer& importer = *made.value();
    REQUIRE(importer.available().available);
    const std::uint64_t alignment = importer.caps().alignment;

    ModelDesc model;
    model.files = {{file.path(), file.size()}};
    model.targets = {target_for("Vulkan0", importer)};
    // Offsets and sizes deliberately off any page boundary; the last one ends at the file's end.
    model.tensors = {{"blk.0.w", 0, 1000, MiB + 3, 0},
                     {"blk.1.w", 0, 3 * MiB + 4097, 2 * MiB, 0},
                     {"output.w", 0, 6 * MiB + 1, 776, 0}};
    PlanOptions options;
    options.import_enabled = true;
    auto plan = make_plan(model, options);
    REQUIRE(plan.ok());

    recorder::reset();
    std::vector<Importer*> importers{&importer};
    auto placement = execute_plan(model, std::move(plan).value(), mapped.files(), importers);
    REQUIRE(placement.ok());

    const auto imports = recorder::calls_of(DriverCall::Kind::allocate_memory);
    REQUIRE_FALSE(imports.empty());
    for (const DriverCall& call : imports) {
        CHECK(call.import);
        CHECK(reinterpret_cast<std::uintptr_t>(call.host_pointer) % alignment == 0);
        CHECK(call.size % alignment == 0);
    }
    for (const DriverCall& call : recorder::calls_of(DriverCall::Kind::host_pointer_properties))
        CHECK(reinterpret_cast<std::uintptr_t>(call.host_pointer) % alignment == 0);

    for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
        const TensorDesc& t = model.tensors[i];
        TensorLocation where = placement->locate(i);
        INFO(t.name << ": " << where.reason);
        REQUIRE(where.imported);
        REQUIRE(where.buffer != nullptr);
        // The import is a superset: it starts at or before the tensor, on an aligned address.
        CHECK(static_cast<std::byte*>(where.buffer->host_address) + where.offset_in_buffer ==
              mapped.files()[0].base + t.offset);
        CHECK(where.offset_in_buffer % alignment == t.offset % alignment);
        // And the device, reading the buffer at that offset, sees the tensor's bytes.
        std::vector<std::uint8_t> bytes =
            dev->copy_out(vulkan_buffer(*where.buffer), where.offset_in_buffer, t.size);
        bool same = true;
        for (std::uint64_t k = 0; k < t.size && same; ++k)
            same = bytes[k] == wm::test::pattern_byte(t.offset + k);
        CHECK(same);
    }
}
