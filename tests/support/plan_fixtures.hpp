// SPDX-License-Identifier: MIT
// Targets and options the planner tests share: a device target with its importer key, the CPU
// target, deterministic plan options (4 KiB pages, import on), plan_ok that fails the test
// with the planner's message, and check_plan over every promise a plan makes.
#pragma once

#include <string>

#include <catch2/catch.hpp>

#include "support/plan_invariants.hpp"
#include "weightmap/planner.hpp"

namespace wm::test {

inline constexpr std::uint64_t test_page = 4096;

inline TargetDesc device_target(std::string name, std::string importer = {},
                                std::uint64_t alignment = test_page, std::uint64_t max_import = 0) {
    TargetDesc t;
    t.name = std::move(name);
    t.importer_key = importer.empty() ? t.name : std::move(importer);
    t.caps.alignment = alignment;
    t.caps.max_import_size = max_import;
    t.caps.device_memory = DeviceMemory::unified; // the fixtures plan what imports by default
    return t;
}

inline TargetDesc cpu_target() {
    TargetDesc t;
    t.name = "CPU";
    t.importer_key = "cpu";
    t.caps.is_cpu = true;
    return t;
}

inline PlanOptions plan_options(PlanMode mode = PlanMode::runs) {
    PlanOptions o;
    o.mode = mode;
    o.page_size = test_page;
    o.import_enabled = true;
    return o;
}

inline Plan plan_ok(const ModelDesc& m, const PlanOptions& o) {
    Result<Plan> r = make_plan(m, o);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.ok());
    return std::move(r).value();
}

/// Fails the test where `a` and `b` import differently: a region's decision or runs (extents and
/// tensors), a tensor's run or offset in it, the imported or pinned bytes. Reasons are not
/// compared (they name the mode, say).
inline void check_same_imports(const Plan& a, const Plan& b) {
    REQUIRE(a.regions.size() == b.regions.size());
    for (std::size_t r = 0; r < a.regions.size(); ++r) {
        const PlanRegion& x = a.regions[r];
        const PlanRegion& y = b.regions[r];
        CHECK(x.decision == y.decision);
        REQUIRE(x.runs.size() == y.runs.size());
        for (std::size_t k = 0; k < x.runs.size(); ++k) {
            CHECK(x.runs[k].extent_offset == y.runs[k].extent_offset);
            CHECK(x.runs[k].extent_size == y.runs[k].extent_size);
            CHECK(x.runs[k].tensors == y.runs[k].tensors);
        }
    }
    REQUIRE(a.tensors.size() == b.tensors.size());
    for (std::size_t i = 0; i < a.tensors.size(); ++i) {
        CHECK(a.tensors[i].run == b.tensors[i].run);
        CHECK(a.tensors[i].offset_in_run == b.tensors[i].offset_in_run);
    }
    CHECK(a.totals.imported_bytes == b.totals.imported_bytes);
    CHECK(a.totals.pinned_bytes == b.totals.pinned_bytes);
}

/// Fails the test with every promise `p` breaks (plan_invariants.hpp).
inline void check_plan(const ModelDesc& m, const Plan& p, const PlanOptions& o = plan_options()) {
    const std::vector<std::string> broken = plan_violations(m, p, o.max_imports_per_region);
    for (std::size_t i = 0; i < broken.size() && i < 8; ++i) UNSCOPED_INFO(broken[i]);
    CHECK(broken.empty());
}

} // namespace wm::test
