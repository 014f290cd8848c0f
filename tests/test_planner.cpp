// SPDX-License-Identifier: MIT
// The planner: grouping by (target, file), decisions and reasons, page-aligned extents, offsets
// that resolve to mapping base + file offset, and the mapped-length bound.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "support/plan_fixtures.hpp"
#include "weightmap/planner.hpp"

using namespace wm;
using namespace wm::test;

namespace {
constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;
constexpr std::uint64_t page = 4096;

} // namespace

TEST_CASE("tensors are grouped by (target, file) whatever their order", "[planner]") {
    ModelDesc m;
    m.files = {{"a.gguf", 64 * MiB}, {"b.gguf", 64 * MiB}};
    m.targets = {device_target("GPU0"), device_target("GPU1"), cpu_target()};
    // Unsorted input over 3 targets x 2 files.
    m.tensors = {
        {"t0", 1, 40 * MiB, MiB, 0}, {"t1", 0, 2 * MiB, MiB, 1}, {"t2", 0, 0, MiB, 0},
        {"t3", 1, 10 * MiB, MiB, 2}, {"t4", 0, MiB, MiB, 0},     {"t5", 1, 41 * MiB, MiB, 0},
        {"t6", 0, 3 * MiB, 100, 2},
    };
    Plan p = plan_ok(m, plan_options());
    REQUIRE(p.regions.size() == 5);
    std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
    for (const PlanRegion& r : p.regions) {
        seen.insert({r.target, r.file});
        std::uint64_t ctx = 0, first = UINT64_MAX, last = 0;
        for (auto t : r.tensors) {
            CHECK(m.tensors[t].target == r.target);
            CHECK(m.tensors[t].file == r.file);
            ctx += m.tensors[t].size;
            first = std::min(first, m.tensors[t].offset);
            last = std::max(last, m.tensors[t].offset + m.tensors[t].size);
        }
        CHECK(r.ctx_bytes == ctx);
        CHECK(r.first == first);
        CHECK(r.last == last);
        CHECK(std::is_sorted(r.tensors.begin(), r.tensors.end(), [&](auto a, auto b) {
            return m.tensors[a].offset < m.tensors[b].offset;
        }));
    }
    CHECK(seen == std::set<std::pair<std::uint32_t, std::uint32_t>>{
                      {0, 0}, {0, 1}, {1, 0}, {2, 0}, {2, 1}});
    // GPU0 in file 0: t2 [0,1M) + t4 [1M,2M) -> ctx 2 MiB, span 2 MiB: tight, one import.
    const PlanRegion& g0f0 = p.regions[0];
    CHECK(g0f0.target == 0);
    CHECK(g0f0.file == 0);
    CHECK(g0f0.ctx_bytes == 2 * MiB);
    CHECK(g0f0.gate);
    CHECK(g0f0.decision == Decision::import);
    REQUIRE(g0f0.runs.size() == 1);
    check_plan(m, p);
    CHECK(p.totals.device_bytes == 5 * MiB);
    CHECK(p.totals.imported_bytes == 5 * MiB);
    CHECK(p.totals.fallback_bytes == 0);
}

TEST_CASE("gate mode: a region that fails the gate falls back with its numbers", "[planner]") {
    ModelDesc m;
    m.files = {{"moe.gguf", 64 * MiB}};
    m.targets = {device_target("GPU0"), cpu_target()};
    // Device tensors at both ends of the file, CPU experts in between.
    m.tensors = {{"attn.0", 0, 0, MiB, 0}, {"exps", 0, MiB, 60 * MiB, 1},
                 {"attn.1", 0, 61 * MiB, MiB, 0}};
    Plan gate = plan_ok(m, plan_options(PlanMode::gate));
    const PlanRegion& r = gate.regions[0];
    CHECK_FALSE(r.gate);
    CHECK(r.decision == Decision::fallback);
    CHECK(r.runs.empty());
    CHECK_THAT(r.reason, Catch::Contains("span 65011712 bytes") &&
                             Catch::Contains("2097152 bytes of its own tensors") &&
                             Catch::Contains("gate limit 3407872"));
    CHECK(gate.totals.imported_bytes == 0);
    CHECK(gate.totals.fallback_bytes == 2 * MiB);
    for (auto t : r.tensors) CHECK(gate.tensors[t].run == no_index);
    // The CPU region is always passthrough, whatever its gate.
    CHECK(gate.regions[1].decision == Decision::import);

    Plan span = plan_ok(m, plan_options(PlanMode::span));
    REQUIRE(span.regions[0].runs.size() == 1);
    CHECK(span.totals.pinned_bytes == 62 * MiB);

    Plan runs = plan_ok(m, plan_options(PlanMode::runs));
    CHECK(runs.regions[0].decision == Decision::import);
    CHECK(runs.regions[0].runs.size() == 2);
    CHECK(runs.totals.imported_bytes == 2 * MiB);
    CHECK(runs.totals.pinned_bytes == 2 * MiB);
    check_plan(m, runs);
}

TEST_CASE("extents are the page-aligned superset; offsets resolve for every tensor", "[planner]") {
    ModelDesc m;
    m.files = {{"w.gguf", 10 * MiB + 123}};
    m.targets = {device_target("GPU0")};
    m.tensors = {{"a", 0, 1000, 5000, 0}, {"b", 0, 6000, 70000, 0}, {"c", 0, 76032, 33, 0}};
    Plan p = plan_ok(m, plan_options());
    REQUIRE(p.regions[0].runs.size() == 1);
    const PlanRun& run = p.regions[0].runs[0];
    CHECK(run.extent_offset == 0);
    CHECK(run.extent_size == 19 * page); // 76065 rounded up to whole pages
    CHECK(p.tensors[0].offset_in_run == 1000);
    CHECK(p.tensors[1].offset_in_run == 6000);
    check_plan(m, p);
}

TEST_CASE("importer alignment larger than a page widens the superset", "[planner]") {
    ModelDesc m;
    m.files = {{"w.gguf", 4 * MiB}};
    m.targets = {device_target("GPU0", {}, 64 * KiB)};
    m.tensors = {{"a", 0, 100 * KiB, 10 * KiB, 0}};
    Plan p = plan_ok(m, plan_options());
    REQUIRE(p.regions[0].runs.size() == 1);
    const PlanRun& run = p.regions[0].runs[0];
    CHECK(run.extent_offset == 64 * KiB);
    CHECK(run.extent_size == 64 * KiB);
    CHECK(p.tensors[0].offset_in_run == 36 * KiB);
    check_plan(m, p);
}

TEST_CASE("an extent never runs past the mapped length: the plan says so", "[planner]") {
    ModelDesc m;
    // 100 KiB + 10 bytes: mapped length is 26 pages (104 KiB). With 64 KiB alignment the tail
    // tensor's extent would end at 128 KiB, past the mapping.
    m.files = {{"short.gguf", 100 * KiB + 10}};
    m.targets = {device_target("GPU0", {}, 64 * KiB)};
    m.tensors = {{"head", 0, 0, 8 * KiB, 0}, {"tail", 0, 90 * KiB, 10 * KiB + 10, 0}};
    // Mode gate imports the region as one extent, so the whole region falls back.
    Plan p = plan_ok(m, plan_options(PlanMode::gate));
    const PlanRegion& r = p.regions[0];
    CHECK(r.decision == Decision::fallback);
    CHECK_THAT(r.reason, Catch::Contains("runs past the mapped length 0x1a000") &&
                             Catch::Contains("short.gguf"));
    // Mode runs cuts between page-disjoint clusters: only the tail falls back, with the reason.
    Plan pr = plan_ok(m, plan_options(PlanMode::runs));
    REQUIRE(pr.regions[0].decision == Decision::import);
    REQUIRE(pr.regions[0].runs.size() == 1);
    CHECK(pr.regions[0].runs[0].extent_offset == 0);
    CHECK(pr.regions[0].runs[0].extent_size == 64 * KiB);
    CHECK(pr.tensors[0].run == 0);
    CHECK(pr.tensors[1].run == no_index);
    CHECK_THAT(pr.tensors[1].reason, Catch::Contains("runs past the mapped length 0x1a000") &&
                                         Catch::Contains("short.gguf"));
    check_plan(m, pr);
    // With page alignment the last partial page is fine.
    ModelDesc m2 = m;
    m2.targets[0].caps.alignment = 1;
    Plan p2 = plan_ok(m2, plan_options());
    REQUIRE(p2.regions[0].runs.size() == 1);
    CHECK(p2.regions[0].runs[0].extent_offset + p2.regions[0].runs[0].extent_size == 104 * KiB);
    check_plan(m2, p2);
}

TEST_CASE("invalid descriptions are errors naming the tensor and field", "[planner]") {
    ModelDesc m;
    m.files = {{"w.gguf", MiB}};
    m.targets = {device_target("GPU0")};
    m.tensors = {{"ok", 0, 0, 10, 0}, {"bad", 0, MiB - 5, 10, 0}};
    Result<Plan> r = make_plan(m, plan_options());
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(r.error().message, Catch::Contains("'bad'") && Catch::Contains("w.gguf"));

    m.tensors = {{"wrap", 0, UINT64_MAX - 2, 10, 0}};
    CHECK_FALSE(make_plan(m, plan_options()).ok());
    m.tensors = {{"nofile", 3, 0, 10, 0}};
    CHECK_THAT(make_plan(m, plan_options()).error().message, Catch::Contains("file index 3"));
    m.tensors = {{"notarget", 0, 0, 10, 7}};
    CHECK_THAT(make_plan(m, plan_options()).error().message, Catch::Contains("target index 7"));
    m.tensors = {{"ok", 0, 0, 10, 0}};
    m.targets[0].caps.alignment = 3000;
    CHECK_THAT(make_plan(m, plan_options()).error().message, Catch::Contains("not a power of two"));
}

TEST_CASE("A/B switch: import disabled makes every device region a fallback", "[planner][ab]") {
    ModelDesc m;
    m.files = {{"w.gguf", 8 * MiB}};
    m.targets = {device_target("GPU0"), cpu_target()};
    m.tensors = {{"a", 0, 0, MiB, 0}, {"b", 0, MiB, MiB, 1}};

    PlanOptions off = plan_options();
    off.import_enabled = false;
    Plan p = plan_ok(m, off);
    CHECK(p.regions[0].decision == Decision::fallback);
    CHECK(p.regions[0].reason == "disabled by PlanOptions::import_enabled = false");
    CHECK(p.regions[1].decision == Decision::import); // the CPU reads the mapping in place

    PlanOptions env = plan_options();
    env.import_enabled.reset();
    setenv("WEIGHTMAP_IMPORT", "0", 1);
    Plan pe = plan_ok(m, env);
    CHECK(pe.regions[0].decision == Decision::fallback);
    CHECK(pe.regions[0].reason == "disabled by WEIGHTMAP_IMPORT=0");
    CHECK(pe.tensors[0].reason == "disabled by WEIGHTMAP_IMPORT=0");
    CHECK(pe.totals.fallback_bytes == MiB);
    setenv("WEIGHTMAP_IMPORT", "1", 1);
    CHECK(plan_ok(m, env).regions[0].decision == Decision::import);
    unsetenv("WEIGHTMAP_IMPORT");
    CHECK(plan_ok(m, env).regions[0].decision == Decision::import);
}

TEST_CASE("a tensor larger than the importer's limit falls back alone", "[planner]") {
    ModelDesc m;
    m.files = {{"w.gguf", 64 * MiB}};
    m.targets = {device_target("GPU0", {}, 1, 8 * MiB)};
    m.tensors = {{"small", 0, 0, 4 * MiB, 0}, {"huge", 0, 4 * MiB, 20 * MiB, 0},
                 {"small2", 0, 24 * MiB, 4 * MiB, 0}};
    Plan p = plan_ok(m, plan_options());
    CHECK(p.tensors[1].run == no_index);
    CHECK_THAT(p.tensors[1].reason, Catch::Contains("maximum import size 8388608"));
    CHECK(p.tensors[0].run != no_index);
    CHECK(p.tensors[2].run != no_index);
    for (const PlanRun& run : p.regions[0].runs) CHECK(run.extent_size <= 8 * MiB);
    check_plan(m, p);
}

TEST_CASE("randomised layouts always resolve correctly in every mode", "[planner]") {
    std::mt19937_64 rng(42);
    for (int iter = 0; iter < 200; ++iter) {
        ModelDesc m;
        std::uint32_t files = 1 + rng() % 3;
        for (std::uint32_t f = 0; f < files; ++f)
            m.files.push_back({"f" + std::to_string(f), 0});
        m.targets = {device_target("GPU0", {}, rng() % 2 ? 1 : 64 * KiB, rng() % 3 ? 0 : 4 * MiB),
                     device_target("GPU1"), cpu_target()};
        std::vector<std::uint64_t> cursor(files, 0);
        std::uint32_t n = 1 + rng() % 60;
        for (std::uint32_t i = 0; i < n; ++i) {
            std::uint32_t f = rng() % files;
            cursor[f] += rng() % (256 * KiB);
            std::uint64_t size = rng() % 4 ? rng() % (3 * MiB) : rng() % 100;
            m.tensors.push_back({"t" + std::to_string(i), f, cursor[f], size,
                                 static_cast<std::uint32_t>(rng() % 3)});
            cursor[f] += size;
        }
        for (std::uint32_t f = 0; f < files; ++f) m.files[f].size = cursor[f] + rng() % 5000;
        std::shuffle(m.tensors.begin(), m.tensors.end(), rng);
        for (PlanMode mode : {PlanMode::span, PlanMode::gate, PlanMode::runs}) {
            Plan p = plan_ok(m, plan_options(mode));
            check_plan(m, p);
            CHECK(p.totals.imported_bytes + p.totals.fallback_bytes == p.totals.device_bytes);
        }
    }
}

TEST_CASE("the plan checker catches every kind of broken promise", "[planner][checker]") {
    // A checker that cannot fail would let every planner test pass: break a good plan in each
    // way the planner promises not to, and expect the checker to say so.
    ModelDesc m;
    m.files = {{"a.gguf", 64 * MiB}};
    m.targets = {device_target("GPU0", "shared"), device_target("GPU1", "shared"), cpu_target()};
    m.tensors = {{"g0", 0, 0, 2 * MiB, 0}, {"c", 0, 2 * MiB, MiB, 2},
                 {"g1", 0, 3 * MiB, 2 * MiB, 1}, {"g0b", 0, 5 * MiB, MiB, 0}};
    const Plan good = plan_ok(m, plan_options(PlanMode::span));
    REQUIRE(plan_violations(m, good).empty());
    const std::vector<std::pair<const char*, std::function<void(Plan&)>>> breaks = {
        {"does not resolve", [](Plan& p) { p.tensors[0].offset_in_run += 1; }},
        {"not aligned", [](Plan& p) { p.regions[0].runs[0].extent_offset += 512; }},
        {"past the mapped length", [](Plan& p) { p.regions[0].runs[0].extent_size = 128 * MiB; }},
        {"totals", [](Plan& p) { p.totals.imported_bytes -= 1; }},
        {"overlap", [](Plan& p) { p.regions[1].runs[0].extent_offset = 0; }},
        {"without a reason", [](Plan& p) {
             p.tensors[3].run = no_index;
             p.tensors[3].reason.clear();
         }},
        {"has no reason", [](Plan& p) { p.regions[2].reason.clear(); }},
        {"ctx_bytes", [](Plan& p) { p.regions[0].ctx_bytes += 1; }},
        {"budget", [](Plan& p) { p.regions[0].runs.resize(300, p.regions[0].runs[0]); }},
    };
    for (const auto& [expected, breaking] : breaks) {
        INFO(expected);
        Plan broken = good;
        breaking(broken);
        const auto found = plan_violations(m, broken);
        REQUIRE_FALSE(found.empty());
        bool named = false;
        for (const std::string& line : found) named |= line.find(expected) != std::string::npos;
        CHECK(named);
    }
}

TEST_CASE("a target whose importer refuses file pages falls back whole, with its note",
          "[planner]") {
    ModelDesc m;
    m.files = {{"a.gguf", 64 * MiB}};
    m.targets = {device_target("Vulkan0"), device_target("Vulkan1"), cpu_target()};
    m.targets[0].caps.refuses_file_pages = true;
    m.targets[0].file_pages_note = "RADV refuses host-pointer imports of file-backed pages";
    m.tensors = {{"a", 0, 0, 4 * MiB, 0}, {"b", 0, 4 * MiB, 4 * MiB, 1}, {"c", 0, 8 * MiB, MiB, 2}};
    const Plan p = plan_ok(m, plan_options());
    check_plan(m, p);
    REQUIRE(p.regions.size() == 3);
    CHECK(p.regions[0].decision == Decision::fallback);
    CHECK(p.regions[0].reason == m.targets[0].file_pages_note);
    CHECK(p.tensors[0].reason == m.targets[0].file_pages_note);
    CHECK(p.regions[1].decision == Decision::import); // the other device still imports
    CHECK(p.totals.fallback_bytes == 4 * MiB);
    CHECK(p.totals.imported_bytes == 4 * MiB);
}
