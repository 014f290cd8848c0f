// SPDX-License-Identifier: MIT
// Tight runs (mode runs): the merge threshold, splitting until every run passes the gate, the
// import budget (optimal against brute force), the importer's size limit, no page shared between
// imports of one importer, every tensor resolving to mapping base + file offset, and the issue's
// targets on model-shaped layouts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fcntl.h>
#include <map>
#include <random>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include "testkit/layouts.hpp"
#include "fakes/fake_importers.hpp"
#include "support/temp_file.hpp"
#include "weightmap/executor.hpp"
#include "support/plan_fixtures.hpp"
#include "weightmap/planner.hpp"

using namespace wm;
using namespace wm::test;

namespace {
constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;
constexpr std::uint64_t page = 4096;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// Appends tensors to one file back to back (GGUF-style 32-byte alignment unless told otherwise).
struct Appender {
    ModelDesc& m;
    std::uint32_t file = 0;
    std::uint64_t cursor = 0;
    std::uint32_t add(std::uint64_t size, std::uint32_t target, std::uint64_t align = 32) {
        cursor = align_up(cursor, align);
        m.tensors.push_back({"t" + std::to_string(m.tensors.size()), file, cursor, size, target});
        cursor += size;
        if (m.files[file].size < cursor) m.files[file].size = cursor;
        return static_cast<std::uint32_t>(m.tensors.size() - 1);
    }
};

} // namespace

TEST_CASE("merge threshold: clusters closer than merge_gap share one import", "[runs]") {
    // Device tensors A and B separated by a CPU tensor of `gap` bytes (page-aligned layout), then
    // a device tensor 256 MiB away so the region fails the gate and is planned as runs.
    auto layout = [](std::uint64_t gap) {
        ModelDesc m;
        m.files = {{"w.gguf", 0}};
        m.targets = {device_target("GPU0"), cpu_target()};
        Appender a{m};
        a.add(16 * MiB, 0, page);
        if (gap != 0) a.add(gap, 1, page);
        a.add(16 * MiB, 0, page);
        a.add(256 * MiB, 1, page);
        a.add(MiB, 0, page);
        return m;
    };
    auto runs_for = [&](std::uint64_t gap, std::uint64_t merge_gap) {
        ModelDesc m = layout(gap);
        PlanOptions o = plan_options();
        o.merge_gap = merge_gap;
        Plan p = plan_ok(m, o);
        check_plan(m, p, o);
        REQUIRE_FALSE(p.regions[0].gate);
        return p.regions[0].runs.size();
    };
    // Default 1 MiB: a gap one page short of it merges (A, B one run, far tensor another).
    CHECK(runs_for(MiB - page, MiB) == 2);
    CHECK(runs_for(MiB, MiB) == 3);
    // Configurable.
    CHECK(runs_for(3 * MiB, 4 * MiB) == 2);
    CHECK(runs_for(4 * MiB, 4 * MiB) == 3);
    // Touching extents always merge, even with merge_gap 0; any gap then separates.
    CHECK(runs_for(0, 0) == 2);
    CHECK(runs_for(page, 0) == 3);

    // The merged run pins the gap: pinned = both tensors + the gap + the far tensor.
    ModelDesc m = layout(MiB - page);
    Plan p = plan_ok(m, plan_options());
    CHECK(p.totals.pinned_bytes == 16 * MiB + (MiB - page) + 16 * MiB + MiB);
    CHECK(p.totals.imported_bytes == 33 * MiB);
    CHECK_THAT(p.regions[0].reason, Catch::Contains("not tight") &&
                                        Catch::Contains("from 3 page-disjoint clusters, 1 merged "
                                                        "across gaps < 1048576 bytes"));
}

TEST_CASE("tensors sharing a page always share one import", "[runs]") {
    ModelDesc m;
    m.files = {{"w.gguf", 0}};
    m.targets = {device_target("GPU0"), cpu_target()};
    Appender a{m};
    // Three device tensors packed at 32-byte alignment share pages: one cluster, never cut,
    // even with merge_gap 0. Then a far one so the region is planned as runs.
    a.add(5000, 0);
    a.add(3000, 0);
    a.add(9000, 0);
    a.add(64 * MiB, 1, page);
    a.add(MiB, 0, page);
    PlanOptions o = plan_options();
    o.merge_gap = 0;
    Plan p = plan_ok(m, o);
    check_plan(m, p, o);
    REQUIRE(p.regions[0].runs.size() == 2);
    CHECK(p.regions[0].runs[0].tensors == std::vector<std::uint32_t>{0, 1, 2});
    CHECK(p.regions[0].runs[0].extent_size == align_up(8032 + 9000, page));
}

TEST_CASE("gaps below the threshold are merged only as far as every run passes the gate",
          "[runs]") {
    // Two groups of three 64 KiB device tensors with 512 KiB CPU gaps inside each group and a
    // 900 KiB gap between the groups: every gap is under 1 MiB, so the threshold alone would
    // make one run. Each group passes the gate (span 1216 KiB, limit 1240 KiB); the union does
    // not (span 3332 KiB, limit 1456 KiB). Smallest gaps first: the 900 KiB one stays open.
    ModelDesc m;
    m.files = {{"w.gguf", 0}};
    m.targets = {device_target("GPU0"), cpu_target()};
    Appender a{m};
    for (int group = 0; group < 2; ++group) {
        for (int i = 0; i < 3; ++i) {
            a.add(64 * KiB, 0, page);
            if (i < 2) a.add(512 * KiB, 1, page);
        }
        if (group == 0) a.add(900 * KiB, 1, page);
    }
    Plan p = plan_ok(m, plan_options());
    check_plan(m, p, plan_options());
    const PlanRegion& r = p.regions[0];
    REQUIRE_FALSE(r.gate);
    REQUIRE(r.runs.size() == 2);
    CHECK(r.runs[0].tensors.size() == 3);
    CHECK(r.runs[1].tensors.size() == 3);
    CHECK(p.totals.imported_bytes == 6 * 64 * KiB);
    CHECK_THAT(r.reason, Catch::Contains("1 gap(s) < 1048576 bytes left open so that every run "
                                         "passes the gate"));

    // Equal gaps that add up: runs of five (span 1104 KiB, limit 1114 KiB) from left to right,
    // never single tensors, every tensor imported.
    ModelDesc e;
    e.files = {{"e.gguf", 0}};
    e.targets = {device_target("GPU0"), cpu_target()};
    Appender b{e};
    for (int i = 0; i < 200; ++i) {
        b.add(16 * KiB, 0, page);
        b.add(256 * KiB, 1, page);
    }
    Plan pe = plan_ok(e, plan_options());
    check_plan(e, pe, plan_options());
    CHECK(pe.totals.imported_bytes == pe.totals.device_bytes);
    CHECK(pe.regions[0].runs.size() == 40);
    for (const PlanRun& run : pe.regions[0].runs) CHECK(run.tensors.size() == 5);
}

TEST_CASE("a page-sharing cluster that fails the gate on its own falls back with the reason",
          "[runs]") {
    // 400 tensors of 200 bytes, each straddling a page boundary: every one shares a page with the
    // next, so the cluster cannot be cut, and it spans ~1.6 MiB for 80,000 bytes.
    ModelDesc m;
    m.files = {{"w.gguf", 0}};
    m.targets = {device_target("GPU0"), cpu_target()};
    Appender a{m};
    for (std::uint64_t i = 0; i < 400; ++i)
        m.tensors.push_back({"straddle", 0, i * page + page - 100, 200, 0});
    a.cursor = 401 * page;
    a.add(64 * MiB, 1, page);
    const std::uint32_t dense = a.add(4 * MiB, 0, page);
    Plan p = plan_ok(m, plan_options());
    check_plan(m, p, plan_options());
    REQUIRE(p.regions[0].runs.size() == 1);
    CHECK(p.tensors[dense].run == 0);
    CHECK(p.tensors[0].run == no_index);
    CHECK_THAT(p.tensors[0].reason, Catch::Contains("fails the gate on its own") &&
                                        Catch::Contains("80000 bytes of tensors"));
    CHECK(p.totals.imported_bytes == 4 * MiB);
}

TEST_CASE("budget: merging across the smallest gaps first pins the fewest bytes (brute force)",
          "[runs][budget]") {
    std::mt19937_64 rng(6);
    int compared = 0;
    for (int iter = 0; iter < 300; ++iter) {
        // `pieces` runs of 1-3 packed device tensors of at least 1 MiB, CPU gaps of 3-40 pages
        // (so any group of near runs passes the gate), then a device tensor far away so the
        // region fails it. merge_gap 0: every gap separates.
        ModelDesc m;
        m.files = {{"w.gguf", 0}};
        m.targets = {device_target("GPU0"), cpu_target()};
        Appender a{m};
        const int pieces = 3 + static_cast<int>(rng() % 6);
        for (int j = 0; j < pieces; ++j) {
            const int tensors = 1 + static_cast<int>(rng() % 3);
            for (int t = 0; t < tensors; ++t) a.add(MiB + rng() % (2 * MiB), 0);
            a.add((3 + rng() % 38) * page - rng() % 64, 1);
        }
        a.add(300 * MiB, 1);
        a.add(MiB + rng() % MiB, 0);

        PlanOptions unlimited = plan_options();
        unlimited.merge_gap = 0;
        Plan free = plan_ok(m, unlimited);
        const PlanRegion& fr = free.regions[0];
        REQUIRE_FALSE(fr.gate);
        const std::size_t runs = fr.runs.size();
        REQUIRE(runs == static_cast<std::size_t>(pieces) + 1);

        PlanOptions o = unlimited;
        o.max_imports_per_region = static_cast<std::uint32_t>(1 + rng() % runs);
        Plan p = plan_ok(m, o);
        check_plan(m, p, o);

        // Brute force: every way to keep (budget - 1) of the gaps between the unbudgeted runs
        // open; a group's pinned bytes are its aligned extent; a group must pass the gate.
        const std::size_t k = o.max_imports_per_region;
        std::uint64_t best = UINT64_MAX;
        std::vector<int> open(runs - 1, 0);
        std::fill(open.end() - static_cast<std::ptrdiff_t>(k - 1), open.end(), 1);
        do {
            std::uint64_t pinned = 0;
            bool feasible = true;
            std::size_t begin = 0;
            for (std::size_t g = 0; g < runs; ++g) {
                if (g + 1 < runs && !open[g]) continue;
                std::uint64_t ctx = 0;
                for (std::size_t q = begin; q <= g; ++q) ctx += fr.runs[q].ctx_bytes;
                const std::uint64_t first = fr.runs[begin].first, last = fr.runs[g].last;
                feasible = feasible && passes_tightness_gate(first, last, ctx);
                pinned += align_up(last, page) - first / page * page;
                begin = g + 1;
            }
            if (feasible) best = std::min(best, pinned);
        } while (std::next_permutation(open.begin(), open.end()));

        INFO("iteration " << iter << ": " << runs << " runs, budget " << k);
        if (best == UINT64_MAX) {
            // No partition into k tight imports: the planner leaves runs out instead.
            CHECK(p.totals.imported_bytes < p.totals.device_bytes);
            continue;
        }
        ++compared;
        CHECK(p.totals.imports == k);
        CHECK(p.totals.pinned_bytes == best);
        CHECK(p.totals.imported_bytes == p.totals.device_bytes);
    }
    // The layouts are built so that only the far gap can break the gate: nearly every case has
    // an optimum to compare against (budget 1 is the exception).
    CHECK(compared >= 200);
}

TEST_CASE("budget: when the gate blocks merges, the runs with the fewest bytes fall back",
          "[runs][budget]") {
    // Six device runs of distinct sizes 64 MiB apart: no merge can pass the gate.
    ModelDesc m;
    m.files = {{"w.gguf", 0}};
    m.targets = {device_target("GPU0"), cpu_target()};
    Appender a{m};
    const std::uint64_t sizes[] = {5 * MiB, MiB, 6 * MiB, 2 * MiB, 4 * MiB, 3 * MiB};
    std::vector<std::uint32_t> ids;
    for (std::uint64_t s : sizes) {
        ids.push_back(a.add(s, 0, page));
        a.add(64 * MiB, 1, page);
    }
    PlanOptions o = plan_options();
    o.max_imports_per_region = 4;
    Plan p = plan_ok(m, o);
    check_plan(m, p, o);
    REQUIRE(p.regions[0].runs.size() == 4);
    // The 1 MiB and 2 MiB runs are left out, each tensor saying why.
    for (std::uint32_t i : {ids[1], ids[3]}) {
        CHECK(p.tensors[i].run == no_index);
        CHECK_THAT(p.tensors[i].reason, Catch::Contains("left out by the import budget") &&
                                            Catch::Contains("max_imports_per_region = 4"));
    }
    for (std::uint32_t i : {ids[0], ids[2], ids[4], ids[5]}) CHECK(p.tensors[i].run != no_index);
    CHECK(p.totals.imported_bytes == 18 * MiB);
    CHECK_THAT(p.regions[0].reason, Catch::Contains("2 run(s) left out by that budget"));

    // A budget of 0 counts as 1.
    o.max_imports_per_region = 0;
    Plan one = plan_ok(m, o);
    check_plan(m, one, o);
    CHECK(one.regions[0].runs.size() == 1);
    CHECK(one.totals.imported_bytes == 6 * MiB);
}

TEST_CASE("budget: counted after the size limit, in every mode", "[runs][budget]") {
    // A tight 10 MiB region of page-aligned 1 MiB tensors, importer limit 2 MiB, budget 3.
    ModelDesc m;
    m.files = {{"w.gguf", 0}};
    m.targets = {device_target("GPU0", "", page, 2 * MiB)};
    Appender a{m};
    for (int i = 0; i < 10; ++i) a.add(MiB, 0, page);
    for (PlanMode mode : {PlanMode::span, PlanMode::gate, PlanMode::runs}) {
        PlanOptions o = plan_options(mode);
        o.max_imports_per_region = 3;
        Plan p = plan_ok(m, o);
        check_plan(m, p, o);
        CHECK(p.totals.imports == 3);
        CHECK(p.totals.imported_bytes == 6 * MiB);
    }
}

TEST_CASE("size limit: imports are cut at tensor boundaries, each tensor wholly inside one",
          "[runs][limit]") {
    // Page-aligned tensors of 1-3 MiB: every boundary is page-disjoint, nothing is lost.
    ModelDesc m;
    m.files = {{"w.gguf", 0}};
    m.targets = {device_target("GPU0", "", page, 8 * MiB)};
    Appender a{m};
    std::mt19937_64 rng(3);
    for (int i = 0; i < 40; ++i) a.add(MiB + rng() % (2 * MiB), 0, page);
    const std::uint32_t huge = a.add(9 * MiB, 0, page);
    for (int i = 0; i < 5; ++i) a.add(MiB, 0, page);
    for (PlanMode mode : {PlanMode::gate, PlanMode::runs}) {
        Plan p = plan_ok(m, plan_options(mode));
        check_plan(m, p, plan_options(mode));
        CHECK(p.regions[0].runs.size() >= 2);
        CHECK(p.totals.imported_bytes == p.totals.device_bytes - 9 * MiB);
        CHECK(p.tensors[huge].run == no_index);
        CHECK_THAT(p.tensors[huge].reason, Catch::Contains("maximum import size 8388608") &&
                                               Catch::Contains("9437184 bytes"));
        // At least half the limit per cut: no more than twice the minimum number of imports.
        CHECK(p.totals.imports <= 2 * (p.totals.pinned_bytes / (8 * MiB) + 1));
        CHECK_THAT(p.regions[0].reason, Catch::Contains("for the importer's maximum import size"));
    }
}

TEST_CASE("size limit cut inside a page-sharing cluster leaves the cheaper side out",
          "[runs][limit][shared]") {
    // Packed (32-byte) tensors share a page at every boundary. With a 4 MiB limit the region
    // must be cut; the cut goes next to the 8 KiB norm, and only the norm falls back.
    ModelDesc m;
    m.files = {{"w.gguf", 0}};
    m.targets = {device_target("GPU0", "hsa", page, 4 * MiB)};
    Appender a{m};
    a.add(3 * MiB + 100, 0);
    a.add(MiB / 2, 0);
    const std::uint32_t norm = a.add(8 * KiB, 0);
    a.add(3 * MiB, 0);
    a.add(MiB / 2 + 7, 0);
    for (PlanMode mode : {PlanMode::span, PlanMode::gate, PlanMode::runs}) {
        Plan p = plan_ok(m, plan_options(mode));
        check_plan(m, p, plan_options(mode));
        CHECK(p.totals.imports == 2);
        CHECK(p.totals.fallback_bytes == 8 * KiB);
        CHECK(p.tensors[norm].run == no_index);
        CHECK_THAT(p.tensors[norm].reason,
                   Catch::Contains("shares a page with import") &&
                       Catch::Contains("both imports serve this region") &&
                       Catch::Contains("maximum import size 4194304"));
        CHECK_THAT(p.regions[0].reason, Catch::Contains("left out where a page is shared"));
    }
}

TEST_CASE("targets sharing an importer never share a page; the cheaper side is left out",
          "[runs][shared]") {
    // GPU0 holds the first tensors, GPU1 the rest, one importer, packed: the boundary page is
    // shared by both regions.
    auto layout = [](std::uint64_t last_of_gpu0, std::uint64_t first_of_gpu1,
                     std::string key0, std::string key1) {
        ModelDesc m;
        m.files = {{"w.gguf", 0}};
        m.targets = {device_target("GPU0", std::move(key0)), device_target("GPU1", std::move(key1)), cpu_target()};
        Appender a{m};
        a.add(2 * MiB + 100, 0); // so that no boundary after it is page-aligned
        a.add(last_of_gpu0, 0);
        a.add(first_of_gpu1, 1);
        a.add(2 * MiB, 1);
        return m;
    };
    for (PlanMode mode : {PlanMode::span, PlanMode::gate, PlanMode::runs}) {
        // A big tensor ends GPU0, a small one starts GPU1: GPU1's is left out.
        ModelDesc m = layout(3 * MiB, 8 * KiB, "hsa", "hsa");
        Plan p = plan_ok(m, plan_options(mode));
        check_plan(m, p, plan_options(mode));
        CHECK(p.tensors[2].run == no_index);
        CHECK_THAT(p.tensors[2].reason, Catch::Contains("target 'GPU0'") &&
                                            Catch::Contains("importer 'hsa'") &&
                                            Catch::Contains("this side loses 8192 bytes"));
        CHECK(p.totals.fallback_bytes == 8 * KiB);
        // Reversed: GPU0 ends with the small one, which is left out instead.
        ModelDesc r = layout(8 * KiB, 3 * MiB, "hsa", "hsa");
        Plan pr = plan_ok(r, plan_options(mode));
        check_plan(r, pr, plan_options(mode));
        CHECK(pr.tensors[1].run == no_index);
        CHECK_THAT(pr.tensors[1].reason, Catch::Contains("target 'GPU1'"));
        CHECK(pr.totals.fallback_bytes == 8 * KiB);
        // Different importers may share a page: nothing is left out.
        ModelDesc d = layout(3 * MiB, 8 * KiB, "hsa", "vulkan");
        Plan pd = plan_ok(d, plan_options(mode));
        check_plan(d, pd, plan_options(mode));
        CHECK(pd.totals.fallback_bytes == 0);
    }
}

TEST_CASE("interleaved targets of one importer: no shared page in any mode", "[runs][shared]") {
    // Alternating GPU0 / GPU1 tensors, packed: span mode's extents overlap almost entirely.
    ModelDesc m;
    m.files = {{"w.gguf", 0}};
    m.targets = {device_target("GPU0", "hsa"), device_target("GPU1", "hsa"), cpu_target()};
    Appender a{m};
    std::mt19937_64 rng(9);
    for (int i = 0; i < 300; ++i) a.add(1 + rng() % (600 * KiB), static_cast<std::uint32_t>(i % 2));
    for (PlanMode mode : {PlanMode::span, PlanMode::gate, PlanMode::runs}) {
        Plan p = plan_ok(m, plan_options(mode));
        check_plan(m, p, plan_options(mode));
    }
}

TEST_CASE("randomised layouts keep every promise in every mode", "[runs][property]") {
    std::mt19937_64 rng(2024);
    for (int iter = 0; iter < 400; ++iter) {
        ModelDesc m;
        const std::uint32_t files = 1 + rng() % 3;
        for (std::uint32_t f = 0; f < files; ++f) m.files.push_back({"f" + std::to_string(f), 0});
        const std::uint64_t limit = rng() % 3 == 0 ? (1 + rng() % 8) * MiB : 0;
        const std::uint64_t align = rng() % 3 == 0 ? 64 * KiB : page;
        // Two devices on one importer half the time, so their pages collide.
        m.targets = {device_target("GPU0", "hsa", align, limit),
                     device_target("GPU1", rng() % 2 ? "hsa" : "vulkan", align, limit), cpu_target()};
        std::vector<Appender> app;
        for (std::uint32_t f = 0; f < files; ++f) app.push_back({m, f, rng() % (3 * page)});
        const std::uint32_t n = 1 + rng() % 120;
        for (std::uint32_t i = 0; i < n; ++i) {
            Appender& a = app[rng() % files];
            const std::uint32_t target = rng() % 4 == 0 ? 2 : static_cast<std::uint32_t>(rng() % 2);
            std::uint64_t size = 0;
            switch (rng() % 5) {
            case 0: size = rng() % 300; break;            // norms, sometimes empty
            case 1: size = rng() % (64 * KiB); break;
            case 2: size = rng() % (3 * MiB); break;
            case 3: size = rng() % (12 * MiB); break;      // over some limits
            default: size = rng() % (512 * KiB); break;
            }
            if (rng() % 6 == 0) a.cursor += rng() % (2 * MiB); // a gap
            if (rng() % 25 == 0 && !m.tensors.empty()) {
                // Overlapping tensors (aliases) are legal input.
                TensorDesc alias = m.tensors[rng() % m.tensors.size()];
                alias.target = target;
                m.tensors.push_back(alias);
                continue;
            }
            a.add(size, target, rng() % 2 ? 32 : 1);
        }
        for (std::uint32_t f = 0; f < files; ++f) m.files[f].size += rng() % 5000;
        std::shuffle(m.tensors.begin(), m.tensors.end(), rng);
        for (PlanMode mode : {PlanMode::span, PlanMode::gate, PlanMode::runs}) {
            PlanOptions o = plan_options(mode);
            o.merge_gap = rng() % 2 ? MiB : rng() % (4 * MiB);
            o.max_imports_per_region = rng() % 3 == 0 ? 1 + rng() % 4 : 256;
            INFO("iteration " << iter << " mode " << to_string(mode));
            Plan p = plan_ok(m, o);
            check_plan(m, p, o);
            // The plan does not depend on the order the tensors came in.
            if (iter % 10 == 0) {
                ModelDesc reversed = m;
                std::reverse(reversed.tensors.begin(), reversed.tensors.end());
                Plan q = plan_ok(reversed, o);
                CHECK(q.totals.imported_bytes == p.totals.imported_bytes);
                CHECK(q.totals.pinned_bytes == p.totals.pinned_bytes);
                CHECK(q.totals.imports == p.totals.imports);
            }
        }
    }
}

TEST_CASE("every tensor resolves to mapping base + file offset through the executor",
          "[runs][executor]") {
    // A real file and mapping; two device targets share one importer, runs and a size limit cut,
    // shared pages resolved; CPU tensors in between.
    wm::test::TempFile file(24 * MiB + 123);
    ModelDesc m;
    m.files = {{file.path(), file.size()}};
    ImporterCaps caps = wm::test::device_caps(page, false);
    caps.max_import_size = 3 * MiB;
    m.targets = {TargetDesc{"GPU0", "fake", caps}, TargetDesc{"GPU1", "fake", caps}, cpu_target()};
    Appender a{m};
    std::mt19937_64 rng(11);
    while (a.cursor < 23 * MiB) {
        const std::uint64_t size = 1 + rng() % (700 * KiB);
        if (a.cursor + size > 24 * MiB) break;
        const std::uint32_t target = a.cursor < 8 * MiB    ? (rng() % 3 == 0 ? 2 : 0)
                                     : a.cursor < 16 * MiB ? (rng() % 2 ? 0 : 1)
                                                           : (rng() % 4 == 0 ? 2 : 1);
        a.add(size, target);
    }
    m.files[0].size = file.size();
    Plan plan = plan_ok(m, plan_options());
    check_plan(m, plan, plan_options());
    REQUIRE(plan.totals.imports > 3);
    REQUIRE(plan.totals.fallback_bytes > 0); // some boundary tensors were left out

    const int fd = open(file.path().c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    const std::uint64_t length = align_up(file.size(), page);
    void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(base != MAP_FAILED);
    auto* bytes = static_cast<std::byte*>(base);
    {
        wm::test::FakeImporter device_importer("fake", caps);
        wm::test::FakeImporter cpu_importer("cpu", cpu_target().caps);
        std::vector<MappedFile> files = {{bytes, length}};
        std::vector<Importer*> importers = {&device_importer, &device_importer, &cpu_importer};
        Result<Placement> placed = execute_plan(m, plan, files, importers);
        REQUIRE(placed.ok());
        for (std::uint32_t i = 0; i < m.tensors.size(); ++i) {
            const TensorDesc& t = m.tensors[i];
            TensorLocation where = placed->locate(i);
            INFO("tensor " << i);
            CHECK(where.host_address == bytes + t.offset);
            CHECK(where.imported == (plan.tensors[i].run != no_index));
            if (!where.imported) {
                CHECK(where.reason == plan.tensors[i].reason);
                continue;
            }
            const auto* host = static_cast<const std::byte*>(where.buffer->host_address);
            CHECK(host + where.offset_in_buffer == bytes + t.offset);
            CHECK(where.offset_in_buffer + t.size <= where.buffer->size);
            if (t.size != 0)
                CHECK(static_cast<std::uint8_t>(host[where.offset_in_buffer]) ==
                      wm::test::pattern_byte(t.offset));
        }
        // What the importer was really handed: no byte imported twice.
        std::vector<wm::test::FakeImporter::Call> calls = device_importer.imports();
        CHECK(calls.size() == plan.totals.imports);
        std::sort(calls.begin(), calls.end(),
                  [](const auto& x, const auto& y) { return x.address < y.address; });
        for (std::size_t i = 1; i < calls.size(); ++i)
            CHECK(static_cast<std::byte*>(calls[i - 1].address) + calls[i - 1].size <=
                  static_cast<std::byte*>(calls[i].address));
    }
    munmap(base, length);
}

TEST_CASE("30B-A3B with experts on the CPU: runs imports it, gate imports nothing, span pins "
          "the file", "[runs][layouts]") {
    using namespace wm::testkit;
    for (const Layout& l : {moe_30b_a3b(), moe_30b_a3b(3), moe_30b_a3b(1, BlockOrder::name_sorted),
                            moe_235b_a22b()}) {
        INFO(l.name);
        std::uint64_t file_bytes = 0;
        for (const FileDesc& f : l.model.files) file_bytes += f.size;

        Plan runs = plan_ok(l.model, plan_options(PlanMode::runs));
        check_plan(l.model, runs, plan_options(PlanMode::runs));
        const PlanTotals& t = runs.totals;
        CHECK(t.device_bytes == bytes_on(l.model, testkit::device_target));
        CHECK(t.imported_bytes * 100 >= t.device_bytes * 99);
        CHECK(t.pinned_bytes * 100 <= t.imported_bytes * 101);
        // Name-sorted blocks put ffn_gate_inp and ffn_norm between the experts: two device
        // clusters a layer, and output_norm/output after the last ffn_up_exps are one more.
        const bool sorted = l.name.find("name-sorted") != std::string::npos;
        CHECK(t.imports <= 2u * l.layers + (sorted ? 1 : 0));
        CHECK(t.imports >= l.layers); // one or two per layer, not merged over the experts

        Plan gate = plan_ok(l.model, plan_options(PlanMode::gate));
        check_plan(l.model, gate, plan_options(PlanMode::gate));
        CHECK(gate.totals.imported_bytes == 0);
        CHECK(gate.totals.imports == 0);

        // Span pins each file from its first device tensor to its last: the whole file but a
        // CPU-only head and tail (token_embd, experts at a shard's edges).
        Plan span = plan_ok(l.model, plan_options(PlanMode::span));
        check_plan(l.model, span, plan_options(PlanMode::span));
        CHECK(span.totals.imported_bytes == span.totals.device_bytes);
        CHECK(span.totals.imports == l.model.files.size());
        std::vector<std::uint64_t> lo(l.model.files.size(), UINT64_MAX), hi(l.model.files.size(), 0);
        for (const TensorDesc& td : l.model.tensors) {
            if (td.target != testkit::device_target) continue;
            lo[td.file] = std::min(lo[td.file], td.offset);
            hi[td.file] = std::max(hi[td.file], td.offset + td.size);
        }
        std::uint64_t device_spans = 0;
        for (std::size_t f = 0; f < lo.size(); ++f) device_spans += align_up(hi[f], page) - lo[f] / page * page;
        CHECK(span.totals.pinned_bytes == device_spans);
        CHECK(span.totals.pinned_bytes * 100 >= file_bytes * (l.model.files.size() == 1 ? 98 : 95));
    }
}

TEST_CASE("dense layouts plan identically in gate and runs", "[runs][layouts]") {
    using namespace wm::testkit;
    Layout l = dense_4b();
    for (std::uint64_t limit : {std::uint64_t{0}, std::uint64_t{1} << 30}) {
        l.model.targets[testkit::device_target].caps.max_import_size = limit;
        Plan gate = plan_ok(l.model, plan_options(PlanMode::gate));
        Plan runs = plan_ok(l.model, plan_options(PlanMode::runs));
        check_plan(l.model, runs, plan_options(PlanMode::runs));
        check_same_imports(gate, runs);
        if (limit == 0) {
            CHECK(runs.totals.imports == 1);
            CHECK(runs.totals.imported_bytes == runs.totals.device_bytes);
        } else {
            CHECK(runs.totals.imports == 3);
            // Cut next to small tensors: a few KiB left out of 2.3 GiB.
            CHECK(runs.totals.fallback_bytes < 64 * KiB);
        }
    }
}

TEST_CASE("adversarial equal gaps: runs as long as the gate allows, then the budget",
          "[runs][budget]") {
    // 50,000 device tensors of 4 KiB, each 60 KiB from the next: one chain of gaps below the
    // threshold. Runs of 18 pass the gate (span 1092 KiB, limit 1105 KiB), 19 do not (span
    // 1156 KiB, limit 1109.5 KiB).
    using namespace wm::testkit;
    Layout l = adversarial_gaps(100'000);
    Plan p = plan_ok(l.model, plan_options());
    check_plan(l.model, p, plan_options());
    CHECK(p.totals.imports == 256);
    for (const PlanRun& run : p.regions[0].runs) CHECK(run.tensors.size() == 18);
    CHECK_THAT(p.regions[0].reason, Catch::Contains("left out by that budget"));
    std::uint32_t budget_reasons = 0;
    for (const TensorPlacement& place : p.tensors)
        budget_reasons += place.reason.find("left out by the import budget") != std::string::npos;
    CHECK(budget_reasons == 50'000 - 256 * 18);
}
