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

/// Fails the test with every promise `p` breaks (plan_invariants.hpp).
inline void check_plan(const ModelDesc& m, const Plan& p, const PlanOptions& o = plan_options()) {
    const std::vector<std::string> broken = plan_violations(m, p, o.max_imports_per_region);
    for (std::size_t i = 0; i < broken.size() && i < 8; ++i) UNSCOPED_INFO(broken[i]);
    CHECK(broken.empty());
}

} // namespace wm::test
