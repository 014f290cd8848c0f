// SPDX-License-Identifier: MIT
// Import only where it pays: the device kind an importer reports and the policy decide whether a
// target imports, in the planner (every region falls back with the reason, or plans exactly as a
// unified device would), in the executor (the policy again, over the caps the importer reports
// at execution) and in the mapping decision (a target that will not import makes no file
// writable).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "fakes/fake_importers.hpp"
#include "support/plan_fixtures.hpp"
#include "support/temp_file.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/loader.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using namespace wm::test;
using wm::test::FakeImporter;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr DeviceMemory memories[] = {DeviceMemory::unknown, DeviceMemory::unified,
                                     DeviceMemory::discrete, DeviceMemory::coherent};
constexpr ImportPolicy policies[] = {ImportPolicy::unified_only, ImportPolicy::always,
                                     ImportPolicy::never};

// A MoE-like layout: device tensors interleaved with CPU experts in one file (tight runs), a
// second, dense file on the device.
ModelDesc moe_model(DeviceMemory memory) {
    ModelDesc m;
    m.files = {{"moe.gguf", 64 * MiB}, {"dense.gguf", 16 * MiB}};
    m.targets = {device_target("GPU0"), cpu_target()};
    m.targets[0].caps.device_memory = memory;
    for (std::uint32_t layer = 0; layer < 8; ++layer) {
        const std::uint64_t base = layer * 8 * MiB;
        m.tensors.push_back({fmt::format("blk.{}.attn", layer), 0, base, MiB, 0});
        m.tensors.push_back({fmt::format("blk.{}.exps", layer), 0, base + MiB, 7 * MiB, 1});
        m.tensors.push_back({fmt::format("out.{}", layer), 1, layer * 2 * MiB, 2 * MiB, 0});
    }
    return m;
}

} // namespace

TEST_CASE("import_allowed: unified_only takes unified alone, always all, never none") {
    for (DeviceMemory memory : memories) {
        INFO(to_string(memory));
        CHECK(import_allowed(ImportPolicy::unified_only, memory) ==
              (memory == DeviceMemory::unified));
        CHECK(import_allowed(ImportPolicy::always, memory));
        CHECK_FALSE(import_allowed(ImportPolicy::never, memory));
    }
    CHECK(std::string(to_string(DeviceMemory::discrete)) == "discrete");
    CHECK(std::string(to_string(DeviceMemory::coherent)) == "coherent");
    CHECK(std::string(to_string(ImportPolicy::unified_only)) == "unified_only");
    CHECK(PlanOptions{}.import_policy == ImportPolicy::unified_only);
    CHECK(ImporterCaps{}.device_memory == DeviceMemory::unknown);
}

TEST_CASE("the planner: a refused target falls back whole with the reason, an allowed one plans "
          "as a unified device does") {
    const Plan reference = plan_ok(moe_model(DeviceMemory::unified), plan_options());
    REQUIRE(reference.totals.imports > 2); // tight runs in the MoE file, one dense import
    for (DeviceMemory memory : memories)
        for (ImportPolicy policy : policies) {
            INFO(to_string(memory) << " under " << to_string(policy));
            const ModelDesc m = moe_model(memory);
            PlanOptions o = plan_options();
            o.import_policy = policy;
            const Plan plan = plan_ok(m, o);
            REQUIRE(plan.regions.size() == reference.regions.size());
            CHECK(plan.import_policy == policy);
            if (!import_allowed(policy, memory)) {
                const std::string why = import_policy_refusal(m.targets[0].caps, policy);
                REQUIRE_FALSE(why.empty());
                for (const PlanRegion& r : plan.regions) {
                    if (r.target == 1) continue; // the CPU's passthrough ignores the policy
                    CHECK(r.decision == Decision::fallback);
                    CHECK(r.reason == why);
                    for (std::uint32_t t : r.tensors) CHECK(plan.tensors[t].reason == why);
                }
                CHECK(plan.totals.imported_bytes == 0);
                CHECK(plan.totals.imports == 0);
                CHECK(plan.totals.fallback_bytes == reference.totals.device_bytes);
                continue;
            }
            CHECK(plan.totals.imports == reference.totals.imports);
            CHECK(plan.totals.pinned_bytes == reference.totals.pinned_bytes);
            CHECK(plan.totals.imported_bytes == reference.totals.imported_bytes);
            for (std::size_t r = 0; r < plan.regions.size(); ++r) {
                CHECK(plan.regions[r].runs.size() == reference.regions[r].runs.size());
                const bool noted =
                    plan.regions[r].reason.find("import_policy=always") != std::string::npos;
                CHECK(noted == (memory != DeviceMemory::unified && plan.regions[r].target == 0));
            }
        }
    CHECK(import_policy_refusal(moe_model(DeviceMemory::discrete).targets[0].caps,
                                ImportPolicy::unified_only) ==
          "discrete device: imported weights would be read over the bus on every use; "
          "import_policy=always to import anyway");
    // GH200-class: HBM of its own, host memory over NVLink-C2C: copied, the cost named
    CHECK_THAT(import_policy_refusal(moe_model(DeviceMemory::coherent).targets[0].caps,
                                     ImportPolicy::unified_only),
               Catch::StartsWith("coherent device with memory of its own: its kernels would read "
                                 "imported weights over the CPU link") &&
                   Catch::Contains("instead of its HBM"));
    CHECK(import_policy_refusal(cpu_target().caps, ImportPolicy::never).empty());
}

TEST_CASE("a target's own policy overrides the options', per target") {
    ModelDesc m = moe_model(DeviceMemory::discrete);
    m.targets.push_back(device_target("GPU1"));
    m.targets[2].caps.device_memory = DeviceMemory::discrete;
    m.targets[2].import_policy = ImportPolicy::always;
    for (TensorDesc& t : m.tensors)
        if (t.file == 1) t.target = 2; // the dense file on GPU1
    const Plan plan = plan_ok(m, plan_options());
    for (const PlanRegion& r : plan.regions) {
        INFO(m.targets[r.target].name << " file " << r.file);
        if (r.target == 0) CHECK(r.decision == Decision::fallback);
        if (r.target == 2) CHECK(r.decision == Decision::import);
    }
    m.targets[0].import_policy = ImportPolicy::never;
    m.targets[2].import_policy.reset();
    PlanOptions always = plan_options();
    always.import_policy = ImportPolicy::always;
    const Plan second = plan_ok(m, always);
    for (const PlanRegion& r : second.regions) {
        if (r.target == 0) CHECK(r.reason == "import_policy=never");
        if (r.target == 2) CHECK(r.decision == Decision::import);
    }
}

TEST_CASE("the A/B switch still wins over the policy") {
    PlanOptions o = plan_options();
    o.import_enabled = false;
    o.import_policy = ImportPolicy::always;
    const Plan plan = plan_ok(moe_model(DeviceMemory::unified), o);
    CHECK(plan.totals.imports == 0);
    CHECK(plan.regions[0].reason == "disabled by PlanOptions::import_enabled = false");
}

TEST_CASE("the executor applies the plan's policy to the caps the importer reports now") {
    TempFile file(16 * MiB);
    ModelDesc m;
    m.files = {{file.path(), 16 * MiB}};
    m.targets = {device_target("GPU0", "fake", 4096), cpu_target()};
    m.tensors = {{"a", 0, 0, 8 * MiB, 0}, {"b", 0, 8 * MiB, 8 * MiB, 1}};
    const std::string paths[] = {file.path()};
    auto mapped = MappedModel::open(paths, MappingAccess::read_only, {});
    REQUIRE(mapped.ok());
    auto cpu = make_cpu_importer();
    for (ImportPolicy policy : policies) {
        INFO(to_string(policy));
        FakeImporter device("fake", device_caps(4096, false)); // unified when planned
        PlanOptions o = plan_options();
        o.import_policy = policy;
        Plan plan = plan_ok(m, o);
        ImporterCaps now = device.caps();
        now.device_memory = DeviceMemory::discrete;
        device.set_caps(now);
        device.set_notes({}, "changed its mind");
        std::vector<std::string> log;
        ExecuteOptions e;
        e.log = [&](LogLevel, std::string_view line) { log.emplace_back(line); };
        std::vector<Importer*> importers{&device, cpu.get()};
        auto placed = execute_plan(m, std::move(plan), mapped->files(), importers, e);
        REQUIRE(placed.ok());
        const PlanRegion& region = placed->plan().regions[0];
        if (policy == ImportPolicy::always) {
            CHECK(region.decision == Decision::import);
            CHECK(device.imports().size() == 1);
            continue;
        }
        CHECK(device.imports().empty());
        CHECK(region.decision == Decision::fallback);
        CHECK_FALSE(placed->locate(0).imported);
        CHECK(placed->locate(1).imported); // the CPU's passthrough
        if (policy == ImportPolicy::unified_only) {
            CHECK(region.reason == "fake importer: discrete device (changed its mind): imported "
                                   "weights would be read over the bus on every use; "
                                   "import_policy=always to import anyway");
            REQUIRE(log.size() == 1);
            CHECK(log[0] == region.reason);
        }
    }
}

TEST_CASE("the mapping: an importer the policy keeps from importing makes no file writable") {
    TempFile file(16 * MiB);
    const std::string paths[] = {file.path()};
    ImporterCaps caps = device_caps(4096, /*needs_writable=*/true);
    caps.device_memory = DeviceMemory::discrete;
    FakeImporter device("fake", caps);
    Importer* list[] = {&device};
    const MappingDecision refused = decide_mapping(paths, list);
    CHECK(refused.access == MappingAccess::read_only);
    CHECK(refused.reason == "read-only: no available non-CPU importer needs a writable mapping "
                            "(import_policy unified_only)");
    CHECK(decide_mapping(paths, list, ImportPolicy::always).access == MappingAccess::writable);
    CHECK(decide_mapping(paths, list, ImportPolicy::never).access == MappingAccess::read_only);

    // load_model decides per target: the discrete target only maps writable when it may import.
    ModelDesc m;
    m.files = {{file.path(), 0}};
    m.targets = {TargetDesc{"GPU0", "fake", caps}, cpu_target()};
    m.tensors = {{"a", 0, 0, 8 * MiB, 0}, {"b", 0, 8 * MiB, 8 * MiB, 1}};
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&device, cpu.get()};
    LoadOptions options;
    options.plan.import_enabled = true;
    {
        auto loaded = load_model(m, importers, options);
        REQUIRE(loaded.ok());
        CHECK(loaded->mapping_decision().access == MappingAccess::read_only);
        CHECK(loaded->mapping_decision().reason ==
              "read-only: the import policy lets no device importer of this model import");
        CHECK(loaded->placement().plan().totals.imports == 0);
        CHECK(device.imports().empty());
    }
    m.targets[0].import_policy = ImportPolicy::always;
    auto loaded = load_model(m, importers, options);
    REQUIRE(loaded.ok());
    CHECK(loaded->mapping_decision().access == MappingAccess::writable);
    CHECK(loaded->placement().plan().totals.imports == 1);
    CHECK(device.live_imports() == 1);
}
