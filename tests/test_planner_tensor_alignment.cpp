// SPDX-License-Identifier: MIT
// ImporterCaps::tensor_alignment: a device tensor whose file offset is not a multiple of it falls
// back alone with the numbers, the rest of its region plans as before around it, extents are
// aligned to it, and every imported tensor's offset in its import is a multiple of it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>

#include "support/plan_fixtures.hpp"
#include "weightmap/planner.hpp"

using namespace wm;
using namespace wm::test;

namespace {
constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;

TargetDesc aligned_device(std::string name, std::uint64_t tensor_alignment,
                          std::string importer = {}) {
    TargetDesc t = device_target(std::move(name), std::move(importer));
    t.caps.tensor_alignment = tensor_alignment;
    return t;
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("a tensor off the importer's tensor alignment falls back alone, with the numbers",
          "[planner][tensor_alignment]") {
    ModelDesc m;
    m.files = {{"w.gguf", 16 * MiB}};
    m.targets = {aligned_device("GPU0", 64), cpu_target()};
    m.targets[1].caps.tensor_alignment = 64; // ignored for the CPU: passthrough serves anything
    m.tensors = {
        {"a", 0, 0, 0x1000, 0},             // aligned
        {"b", 0, 0x1020, 0xfe0, 0},         // 0x1020 % 64 == 32: misaligned
        {"c", 0, 0x2000, 0x3000, 0},        // aligned
        {"d", 0, 0x5000, 0x40, 0},          // aligned
        {"cpu", 0, 0x5050, 0x10, 1},        // misaligned, but on the CPU
        {"e", 0, 0x5060 + 8, 0x100, 0},     // misaligned (0x5068)
    };
    for (PlanMode mode : {PlanMode::runs, PlanMode::gate, PlanMode::span}) {
        INFO(to_string(mode));
        const PlanOptions o = plan_options(mode);
        const Plan p = plan_ok(m, o);
        check_plan(m, p, o);
        REQUIRE(p.regions.size() == 2);
        const PlanRegion& device = p.regions[0];
        CHECK(device.decision == Decision::import);
        // The region still counts every tensor of its target: the misaligned ones included.
        CHECK(device.tensors == std::vector<std::uint32_t>{0, 1, 2, 3, 5});
        CHECK(device.first == 0);
        CHECK(device.last == 0x5068 + 0x100);
        CHECK(device.ctx_bytes == 0x1000 + 0xfe0 + 0x3000 + 0x40 + 0x100);
        for (std::uint32_t t : {0u, 2u, 3u}) {
            INFO(m.tensors[t].name);
            CHECK(p.tensors[t].run != no_index);
            CHECK(p.tensors[t].reason.empty());
            CHECK(p.tensors[t].offset_in_run % 64 == 0);
        }
        CHECK(p.tensors[1].run == no_index);
        CHECK(p.tensors[1].reason ==
              "offset 0x1020 is not a multiple of the importer's tensor alignment 64 (target "
              "'GPU0', importer 'GPU0'): no import can serve it where its buffer needs it "
              "aligned");
        CHECK(p.tensors[5].run == no_index);
        CHECK(contains(p.tensors[5].reason, "offset 0x5068 is not a multiple of the importer's "
                                            "tensor alignment 64"));
        CHECK(contains(device.reason, "2 tensor(s) (4320 bytes) left out: their offsets are not "
                                      "multiples of the importer's tensor alignment 64"));
        CHECK(p.totals.fallback_bytes == 0xfe0 + 0x100);
        CHECK(p.totals.imported_bytes == 0x1000 + 0x3000 + 0x40);
        // The CPU's passthrough ignores the tensor alignment.
        CHECK(p.tensors[4].run != no_index);
        CHECK(p.tensors[4].reason.empty());
    }
}

TEST_CASE("without a tensor alignment (0 or 1) the same layout imports every tensor",
          "[planner][tensor_alignment]") {
    for (std::uint64_t none : {0u, 1u}) {
        ModelDesc m;
        m.files = {{"w.gguf", 16 * MiB}};
        m.targets = {aligned_device("GPU0", none)};
        m.tensors = {{"a", 0, 0, 0x1000, 0}, {"b", 0, 0x1020, 0xfe0, 0}, {"c", 0, 0x2000, 0x3000, 0}};
        const Plan p = plan_ok(m, plan_options());
        check_plan(m, p);
        CHECK(p.totals.fallback_bytes == 0);
        CHECK(p.regions[0].reason.find("tensor alignment") == std::string::npos);
    }
}

TEST_CASE("a tensor alignment above the page size aligns the extents to it",
          "[planner][tensor_alignment]") {
    ModelDesc m;
    m.files = {{"w.gguf", 8 * MiB}};
    m.targets = {aligned_device("GPU0", 64 * KiB)};
    // Page-aligned but not 64 KiB-aligned at 68 KiB; the others at multiples of 64 KiB.
    m.tensors = {{"a", 0, 128 * KiB, 60 * KiB, 0},
                 {"b", 0, 196 * KiB, 40 * KiB, 0},
                 {"c", 0, 256 * KiB, 64 * KiB, 0},
                 {"d", 0, 68 * KiB, 32 * KiB, 0}};
    for (PlanMode mode : {PlanMode::runs, PlanMode::gate, PlanMode::span}) {
        INFO(to_string(mode));
        const PlanOptions o = plan_options(mode);
        const Plan p = plan_ok(m, o);
        check_plan(m, p, o);
        const PlanRegion& region = p.regions[0];
        REQUIRE_FALSE(region.runs.empty());
        for (const PlanRun& run : region.runs) {
            CHECK(run.extent_offset % (64 * KiB) == 0);
            CHECK(run.extent_size % (64 * KiB) == 0);
        }
        CHECK(region.runs.front().extent_offset == 128 * KiB);
        CHECK(p.tensors[0].offset_in_run == 0);
        CHECK(p.tensors[1].run == no_index); // 196 KiB = 3 * 64 KiB + 4 KiB
        CHECK(contains(p.tensors[1].reason, "offset 0x31000 is not a multiple of the importer's "
                                            "tensor alignment 65536"));
        CHECK(p.tensors[2].offset_in_run == 128 * KiB);
        CHECK(p.tensors[3].run == no_index);
        CHECK(contains(p.tensors[3].reason, "offset 0x11000"));
    }
}

TEST_CASE("a region whose every device tensor is misaligned imports nothing and says why",
          "[planner][tensor_alignment]") {
    ModelDesc m;
    m.files = {{"w.gguf", 4 * MiB}};
    m.targets = {aligned_device("GPU0", 256), aligned_device("GPU1", 256)};
    m.tensors = {{"a", 0, 0x20, 0x1000, 0}, {"b", 0, 0x1040, 0x1000, 0}, {"c", 0, 0x3000, 64, 1}};
    const Plan p = plan_ok(m, plan_options());
    check_plan(m, p);
    REQUIRE(p.regions.size() == 2);
    CHECK(p.regions[0].decision == Decision::fallback);
    CHECK(contains(p.regions[0].reason,
                   "nothing imported: offset 0x20 is not a multiple of the importer's tensor "
                   "alignment 256 (target 'GPU0', importer 'GPU0')"));
    CHECK(p.regions[1].decision == Decision::import);
    CHECK(p.totals.imported_bytes == 64);

    SECTION("a region that falls back whole gives every tensor its own reason, not the "
            "alignment") {
        m.targets[0].caps.device_memory = DeviceMemory::discrete;
        const Plan q = plan_ok(m, plan_options());
        check_plan(m, q);
        CHECK(q.regions[0].decision == Decision::fallback);
        CHECK(q.tensors[0].reason == q.regions[0].reason);
        CHECK(q.tensors[1].reason == q.regions[0].reason);
        CHECK(contains(q.tensors[1].reason, "discrete device"));
    }
}

TEST_CASE("the tensor alignment must be 0 or a power of two", "[planner][tensor_alignment]") {
    ModelDesc m;
    m.files = {{"w.gguf", MiB}};
    m.targets = {cpu_target(), aligned_device("GPU0", 48)};
    m.tensors = {{"a", 0, 0, 4096, 1}};
    Result<Plan> r = make_plan(m, plan_options());
    REQUIRE_FALSE(r);
    CHECK(r.error().kind == ErrorKind::invalid_argument);
    CHECK(r.error().message == "target 1 ('GPU0'): tensor_alignment 48 is not a power of two");
    m.targets[1].caps.tensor_alignment = 0;
    CHECK(make_plan(m, plan_options()));
}

TEST_CASE("randomised layouts with a tensor alignment keep every promise",
          "[planner][tensor_alignment]") {
    std::mt19937_64 rng(20240611);
    for (int round = 0; round < 300; ++round) {
        const std::uint64_t choices[] = {1, 32, 64, 256, 4096, 64 * KiB};
        ModelDesc m;
        m.files = {{"a.gguf", 32 * MiB}, {"b.gguf", 32 * MiB + 4321}};
        m.targets = {aligned_device("GPU0", choices[rng() % 6], "shared"),
                     aligned_device("GPU1", choices[rng() % 6], "shared"), cpu_target()};
        m.targets[0].caps.alignment = std::uint64_t{1} << (rng() % 17);
        m.targets[1].caps.max_import_size = rng() % 2 ? 0 : (1 + rng() % 8) * MiB;
        const std::size_t n = 1 + rng() % 200;
        for (std::size_t i = 0; i < n; ++i) {
            TensorDesc t;
            t.file = static_cast<std::uint32_t>(rng() % 2);
            t.target = static_cast<std::uint32_t>(rng() % 3);
            t.size = rng() % (256 * KiB);
            t.offset = (rng() % (32 * MiB - t.size)) / 32 * 32; // GGUF's default alignment
            t.name = "t" + std::to_string(i);
            m.tensors.push_back(t);
        }
        for (PlanMode mode : {PlanMode::span, PlanMode::gate, PlanMode::runs}) {
            PlanOptions o = plan_options(mode);
            o.max_imports_per_region = 1 + static_cast<std::uint32_t>(rng() % 8);
            const Plan p = plan_ok(m, o);
            INFO("round " << round << " mode " << to_string(mode));
            check_plan(m, p, o);
            for (std::size_t i = 0; i < n; ++i) {
                const TensorDesc& t = m.tensors[i];
                const std::uint64_t a = m.targets[t.target].caps.tensor_alignment;
                if (m.targets[t.target].caps.is_cpu || t.offset % a == 0) continue;
                CHECK(p.tensors[i].run == no_index);
            }
        }
    }
}

TEST_CASE("the plan checker catches an imported tensor off the tensor alignment",
          "[planner][tensor_alignment][checker]") {
    ModelDesc m;
    m.files = {{"w.gguf", MiB}};
    m.targets = {aligned_device("GPU0", 1)};
    m.tensors = {{"a", 0, 0, 0x1000, 0}, {"b", 0, 0x1020, 0x100, 0}};
    const Plan p = plan_ok(m, plan_options());
    REQUIRE(plan_violations(m, p).empty());
    m.targets[0].caps.tensor_alignment = 64; // as if the planner had ignored it
    bool named = false;
    for (const std::string& line : plan_violations(m, p))
        named |= contains(line, "is not a multiple of the importer's tensor alignment 64");
    CHECK(named);
}
