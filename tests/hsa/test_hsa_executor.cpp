// SPDX-License-Identifier: MIT
// The HSA importer as a target's importer, end to end through make_plan and execute_plan over
// real file mappings: tensors land in place, a failing lock turns only its run into a fallback
// (the region's other runs stay locked), read-only mappings and the budget fall back with their
// reasons, and nothing stays locked once the Placement is gone.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <hsa/hsa.h>

#include "hsa/fake_hsa.hpp"
#include "support/temp_file.hpp"
#include "weightmap/backends/hsa.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::FakeHsa;
using wm::test::FileMapping;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// Two files. File 0's GPU tensors are 3 MiB apart, so the default runs mode imports them as two
// runs (locks #1 and #2); file 1's GPU tensors are one run (lock #3). CPU tensors sit between.
struct Model {
    wm::test::TempFile file_a{8 * MiB + 100};
    wm::test::TempFile file_b{4 * MiB};
    ModelDesc model;
    Model(const Importer& gpu, const Importer& cpu) {
        model.files = {{file_a.path(), file_a.size()}, {file_b.path(), file_b.size()}};
        model.targets = {target_for("ROCm0", gpu), target_for("CPU", cpu)};
        model.tensors = {
            {"a.gpu0", 0, 1000, MiB, 0},          {"a.cpu", 0, 2 * MiB, MiB, 1},
            {"a.gpu1", 0, 5 * MiB + 77, MiB, 0},  {"b.gpu0", 1, 4096, 2 * MiB, 0},
            {"b.gpu1", 1, 2 * MiB + 4096 + 3, 100, 0},
        };
    }
    Plan plan() const {
        PlanOptions options;
        options.import_enabled = true;
        auto plan = make_plan(model, options);
        REQUIRE(plan.ok());
        return std::move(plan).value();
    }
};

ExecuteOptions collect(std::vector<std::string>& warnings) {
    ExecuteOptions options;
    options.log = [&warnings](LogLevel level, std::string_view message) {
        if (level == LogLevel::warning) warnings.emplace_back(message);
    };
    return options;
}

const PlanRegion& region_of(const Placement& placement, std::uint32_t target, std::uint32_t file) {
    for (const PlanRegion& r : placement.plan().regions)
        if (r.target == target && r.file == file) return r;
    FAIL("no region for target " << target << " file " << file);
    throw; // unreachable: FAIL throws
}
} // namespace

TEST_CASE("a plan executes through the HSA importer with every device tensor in place",
          "[hsa][executor]") {
    FakeHsa& fake = FakeHsa::fresh();
    auto hsa = fake.importer();
    auto cpu = make_cpu_importer();
    Model m(*hsa, *cpu);
    FileMapping a(m.file_a.path(), m.file_a.size(), true), b(m.file_b.path(), m.file_b.size(), true);
    std::vector<MappedFile> files{a.view(), b.view()};
    std::vector<Importer*> importers{hsa.get(), cpu.get()};
    const Plan plan = m.plan();
    REQUIRE(plan.totals.imports == 3);
    {
        auto placed = execute_plan(m.model, plan, files, importers);
        REQUIRE(placed.ok());
        CHECK(fake.live_locks() == 3);
        CHECK(fake.live_bytes() == placed->plan().totals.pinned_bytes);
        for (std::uint32_t i = 0; i < m.model.tensors.size(); ++i) {
            const TensorDesc& t = m.model.tensors[i];
            TensorLocation where = placed->locate(i);
            REQUIRE(where.imported);
            const std::byte* host = files[t.file].base + t.offset;
            CHECK(static_cast<std::byte*>(where.buffer->host_address) + where.offset_in_buffer ==
                  host);
            if (t.target != 0) continue;
            CHECK(where.buffer->imported);
            // The device reads the same bytes at agent pointer + the same offset.
            CHECK(static_cast<std::byte*>(where.buffer->device_address) + where.offset_in_buffer ==
                  host + fake.agent_aperture());
            CHECK(fake.is_locked(where.buffer->host_address, where.buffer->size));
        }
    }
    CHECK(fake.live_locks() == 0);
    CHECK(fake.unlock_calls() == 3);
}

TEST_CASE("a failure at the N-th lock turns only that run into a fallback", "[hsa][executor]") {
    FakeHsa& fake = FakeHsa::fresh();
    auto hsa = fake.importer();
    auto cpu = make_cpu_importer();
    Model m(*hsa, *cpu);
    FileMapping a(m.file_a.path(), m.file_a.size(), true), b(m.file_b.path(), m.file_b.size(), true);
    std::vector<MappedFile> files{a.view(), b.view()};
    std::vector<Importer*> importers{hsa.get(), cpu.get()};
    std::vector<std::string> warnings;

    SECTION("the second run of file 0: its first run stays locked, file 1 too") {
        fake.set_fail_lock_at(2, HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        {
            auto placed = execute_plan(m.model, m.plan(), files, importers, collect(warnings));
            REQUIRE(placed.ok());
            const PlanRegion& failed = region_of(placed.value(), 0, 0);
            CHECK(failed.decision == Decision::import);
            CHECK(failed.runs.size() == 1);
            CHECK_THAT(failed.reason, Catch::Contains("1 of its 2 imports refused") &&
                                          Catch::Contains("HSA_STATUS_ERROR_OUT_OF_RESOURCES"));
            CHECK(region_of(placed.value(), 0, 1).decision == Decision::import);
            CHECK(region_of(placed.value(), 1, 0).decision == Decision::import);
            CHECK(placed->locate(0).imported);
            CHECK_FALSE(placed->locate(2).imported);
            CHECK_THAT(std::string(placed->locate(2).reason),
                       Catch::Contains("HSA_STATUS_ERROR_OUT_OF_RESOURCES"));
            CHECK(placed->locate(3).imported);
            CHECK(placed->locate(4).imported);
            CHECK(fake.lock_calls() == 3);
            CHECK(fake.live_locks() == 2); // file 0's first run and file 1's
            CHECK(placed->plan().totals.fallback_bytes == MiB);
            REQUIRE(warnings.size() == 1);
            CHECK_THAT(warnings[0], Catch::Contains("ROCm0") && Catch::Contains(m.file_a.path()));
        }
        CHECK(fake.live_locks() == 0);
    }
    SECTION("the last lock: file 0's two runs stay") {
        fake.set_fail_lock_at(3, HSA_STATUS_ERROR);
        {
            auto placed = execute_plan(m.model, m.plan(), files, importers, collect(warnings));
            REQUIRE(placed.ok());
            CHECK(region_of(placed.value(), 0, 0).decision == Decision::import);
            const PlanRegion& failed = region_of(placed.value(), 0, 1);
            CHECK(failed.decision == Decision::fallback);
            CHECK_THAT(failed.reason, Catch::Contains("HSA_STATUS_ERROR: A generic error"));
            CHECK(fake.live_locks() == 2);
        }
        CHECK(fake.live_locks() == 0);
    }
    CHECK(fake.misuse_count() == 0);
}

TEST_CASE("read-only mappings make every HSA region fall back with the runtime's reason, on a "
          "runtime that refuses read-only pages", "[hsa][executor]") {
    FakeHsa& fake = FakeHsa::fresh();
    fake.set_refuse_read_only(true);
    auto hsa = fake.importer();
    auto cpu = make_cpu_importer();
    Model m(*hsa, *cpu);
    FileMapping a(m.file_a.path(), m.file_a.size(), false), b(m.file_b.path(), m.file_b.size(), false);
    std::vector<MappedFile> files{a.view(), b.view()};
    std::vector<Importer*> importers{hsa.get(), cpu.get()};
    std::vector<std::string> warnings;
    auto placed = execute_plan(m.model, m.plan(), files, importers, collect(warnings));
    REQUIRE(placed.ok());
    for (const PlanRegion& r : placed->plan().regions) {
        if (r.target == 1) {
            CHECK(r.decision == Decision::import); // the CPU reads a read-only mapping fine
            continue;
        }
        CHECK(r.decision == Decision::fallback);
        CHECK_THAT(r.reason, Catch::Contains("HSA_STATUS_ERROR: A generic error has occurred.") &&
                                 Catch::Contains(std::string(read_only_refusal_marker)));
    }
    CHECK(warnings.size() == 3); // one per refused run: file 0's two, file 1's one
    CHECK(fake.live_locks() == 0);
    CHECK(placed->plan().totals.imported_bytes == 0);
}

TEST_CASE("the lock budget turns an over-budget region into a fallback", "[hsa][executor]") {
    FakeHsa& fake = FakeHsa::fresh();
    HsaImporterParams params;
    params.lock_budget_bytes = 3 * MiB; // file 0's two runs fit, file 1's 2 MiB run then does not
    auto hsa = fake.importer(params);
    auto cpu = make_cpu_importer();
    Model m(*hsa, *cpu);
    FileMapping a(m.file_a.path(), m.file_a.size(), true), b(m.file_b.path(), m.file_b.size(), true);
    std::vector<MappedFile> files{a.view(), b.view()};
    std::vector<Importer*> importers{hsa.get(), cpu.get()};
    std::vector<std::string> warnings;
    {
        auto placed = execute_plan(m.model, m.plan(), files, importers, collect(warnings));
        REQUIRE(placed.ok());
        CHECK(region_of(placed.value(), 0, 0).decision == Decision::import);
        const PlanRegion& over = region_of(placed.value(), 0, 1);
        CHECK(over.decision == Decision::fallback);
        CHECK_THAT(over.reason, Catch::Contains("lock_budget_bytes"));
        CHECK(fake.lock_calls() == 2); // refused before the runtime
        CHECK(fake.live_bytes() <= params.lock_budget_bytes);
    }
    CHECK(fake.live_locks() == 0);
}

TEST_CASE("through MappedModel: HSA imports from the read-only mapping the policy now picks",
          "[hsa][executor][mapping]") {
    FakeHsa& fake = FakeHsa::fresh();
    auto hsa = fake.importer();
    auto cpu = make_cpu_importer();
    Model m(*hsa, *cpu);
    const std::vector<std::string> paths{m.file_a.path(), m.file_b.path()};
    std::vector<Importer*> importers{hsa.get(), cpu.get()};

    MappingDecision decision = decide_mapping(paths, importers);
    CHECK(decision.access == MappingAccess::read_only); // read-only first
    auto mapped = MappedModel::open(paths, decision.access);
    REQUIRE(mapped.ok());
    {
        auto placed = execute_plan(m.model, m.plan(), mapped->files(), importers);
        REQUIRE(placed.ok());
        CHECK(placed->plan().totals.fallback_bytes == 0);
        CHECK(fake.live_locks() == 3);
    }
    CHECK(fake.live_locks() == 0);

    // A runtime that refuses read-only pages imports from a writable shared mapping.
    fake.set_refuse_read_only(true);
    auto writable = MappedModel::open(paths, MappingAccess::writable);
    REQUIRE(writable.ok());
    auto placed = execute_plan(m.model, m.plan(), writable->files(), importers);
    REQUIRE(placed.ok());
    CHECK(placed->plan().totals.fallback_bytes == 0);
    CHECK(fake.live_locks() == 3);
    // HSA does not declare survives_read_only_reprotect, and its locks are held: no mprotect.
    CHECK_FALSE(hsa->caps().survives_read_only_reprotect);
    Status reprotect = writable->make_read_only();
    REQUIRE_FALSE(reprotect.ok());
    CHECK_THAT(reprotect.error().message, Catch::Contains("locked by the hsa importer"));
    CHECK_FALSE(writable->is_read_only());
    placed->release_all();
    CHECK(fake.live_locks() == 0);
}
