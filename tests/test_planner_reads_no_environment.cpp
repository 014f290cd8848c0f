// SPDX-License-Identifier: MIT
// The planner's core reads no environment: WEIGHTMAP_IMPORT is resolved at the edges (make_plan,
// load_model) into an ImportSwitch, and the core plans from that alone. Internal: it calls
// wm::internal::make_plan_with_switch and resolve_import_switch.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <optional>
#include <string>

#include "planner/import_switch.hpp"
#include "planner/plan_core.hpp"
#include "support/plan_fixtures.hpp"

using namespace wm;
using namespace wm::test;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// Sets (or, with nullopt, unsets) WEIGHTMAP_IMPORT for one scope and restores what was there.
class ImportEnv {
public:
    explicit ImportEnv(const std::optional<std::string>& value) {
        if (const char* old = std::getenv(name)) old_ = old;
        set(value);
    }
    ~ImportEnv() { set(old_); }
    ImportEnv(const ImportEnv&) = delete;
    ImportEnv& operator=(const ImportEnv&) = delete;

private:
    static constexpr const char* name = "WEIGHTMAP_IMPORT";
    static void set(const std::optional<std::string>& value) {
        if (value) setenv(name, value->c_str(), 1);
        else unsetenv(name);
    }
    std::optional<std::string> old_;
};

// A device target interleaved with the CPU over two files, so the plan has several runs.
ModelDesc interleaved_model() {
    ModelDesc m;
    m.files = {{"a.gguf", 64 * MiB}, {"b.gguf", 16 * MiB}};
    m.targets = {device_target("GPU0"), cpu_target()};
    m.tensors = {{"d0", 0, 0, 4 * MiB, 0},        {"c0", 0, 4 * MiB, MiB, 1},
                 {"d1", 0, 5 * MiB, 4 * MiB, 0},  {"c1", 0, 9 * MiB, 40 * MiB, 1},
                 {"d2", 0, 49 * MiB, 8 * MiB, 0}, {"d3", 1, 0, 16 * MiB, 0}};
    return m;
}

// The same imports (check_same_imports) and the same reasons, region by region and tensor by
// tensor.
void check_same_plan(const Plan& a, const Plan& b) {
    check_same_imports(a, b);
    CHECK(a.page_size == b.page_size);
    for (std::size_t r = 0; r < a.regions.size(); ++r) {
        CHECK(a.regions[r].reason == b.regions[r].reason);
        CHECK(a.regions[r].tensors == b.regions[r].tensors);
    }
    for (std::size_t t = 0; t < a.tensors.size(); ++t)
        CHECK(a.tensors[t].reason == b.tensors[t].reason);
    CHECK(a.totals.imports == b.totals.imports);
}

Plan core_plan(const ModelDesc& m, const PlanOptions& o, const internal::ImportSwitch& s) {
    Result<Plan> r = internal::make_plan_with_switch(m, o, s);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.ok());
    return std::move(r).value();
}

} // namespace

TEST_CASE("with WEIGHTMAP_IMPORT=0 set, the core given an enabled switch plans as without it",
          "[planner][ab]") {
    const ModelDesc m = interleaved_model();
    PlanOptions unset = plan_options();
    unset.import_enabled.reset();
    const internal::ImportSwitch on{true, ""};

    Plan without_env = [&] {
        ImportEnv env(std::nullopt);
        return core_plan(m, unset, on);
    }();
    REQUIRE(without_env.regions[0].decision == Decision::import);
    REQUIRE(without_env.totals.imports > 1);

    ImportEnv env(std::string("0"));
    check_same_plan(core_plan(m, unset, on), without_env);
    check_plan(m, core_plan(m, unset, on));
    // The public edge still reads the environment: unchanged behaviour.
    Plan edge = plan_ok(m, unset);
    CHECK(edge.regions[0].decision == Decision::fallback);
    CHECK(edge.regions[0].reason == "disabled by WEIGHTMAP_IMPORT=0");
    CHECK(edge.totals.imported_bytes == 0);
    // and an explicit option still wins over it there.
    check_same_plan(plan_ok(m, plan_options()), without_env);
}

TEST_CASE("the core takes the switch it is given, not PlanOptions::import_enabled",
          "[planner][ab]") {
    const ModelDesc m = interleaved_model();
    ImportEnv env(std::nullopt);
    PlanOptions on = plan_options(); // import_enabled = true
    Plan off = core_plan(m, on, {false, "disabled by the test"});
    for (const PlanRegion& region : off.regions) {
        const bool cpu = m.targets[region.target].caps.is_cpu; // reads the mapping in place
        CHECK(region.decision == (cpu ? Decision::import : Decision::fallback));
        if (!cpu) CHECK(region.reason == "disabled by the test");
    }
    CHECK(off.tensors[0].reason == "disabled by the test");

    PlanOptions disabled = plan_options();
    disabled.import_enabled = false;
    check_same_plan(core_plan(m, disabled, {true, ""}), plan_ok(m, on));
}

TEST_CASE("resolve_import_switch: the option first, then WEIGHTMAP_IMPORT, with the same texts",
          "[planner][ab]") {
    using internal::resolve_import_switch;
    {
        ImportEnv env(std::string("0"));
        CHECK(resolve_import_switch(true).enabled);
        CHECK(resolve_import_switch(true).why_not.empty());
        CHECK_FALSE(resolve_import_switch(false).enabled);
        CHECK(resolve_import_switch(false).why_not ==
              "disabled by PlanOptions::import_enabled = false");
        CHECK_FALSE(resolve_import_switch(std::nullopt).enabled);
        CHECK(resolve_import_switch(std::nullopt).why_not == "disabled by WEIGHTMAP_IMPORT=0");
    }
    {
        ImportEnv env(std::string("1"));
        CHECK(resolve_import_switch(std::nullopt).enabled);
    }
    {
        ImportEnv env(std::nullopt);
        CHECK(resolve_import_switch(std::nullopt).enabled);
        CHECK(resolve_import_switch(std::nullopt).why_not.empty());
    }
}
