// SPDX-License-Identifier: MIT
// Executing a plan over real mappings with fake importers: every tensor lands at mapping base +
// file offset, a refused import falls back alone (its run, not its region), abort and errors
// release everything.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include "fakes/fake_importers.hpp"
#include "support/plan_invariants.hpp"
#include "support/temp_file.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::FakeImporter;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// A test's own mapping of a file (the mapping layer does this for engines).
struct TestMapping {
    std::byte* base = nullptr;
    std::uint64_t length = 0;
    TestMapping(const std::string& path, std::uint64_t size, bool writable) {
        int fd = open(path.c_str(), writable ? O_RDWR : O_RDONLY);
        REQUIRE(fd >= 0);
        length = (size + 4095) / 4096 * 4096;
        void* p = mmap(nullptr, length, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
        close(fd);
        REQUIRE(p != MAP_FAILED);
        base = static_cast<std::byte*>(p);
    }
    ~TestMapping() { munmap(base, length); }
    MappedFile view() const { return {base, length}; }
};

struct Fixture {
    wm::test::TempFile file_a{16 * MiB + 100};
    wm::test::TempFile file_b{8 * MiB};
    ModelDesc model;
    Fixture() {
        model.files = {{file_a.path(), file_a.size()}, {file_b.path(), file_b.size()}};
        model.targets = {TargetDesc{"GPU0", "gpu0", wm::test::device_caps(4096, true)},
                         TargetDesc{"GPU1", "gpu1", wm::test::device_caps(4096, true)},
                         TargetDesc{"CPU", "cpu", {}}};
        model.targets[2].caps.is_cpu = true;
        // Unaligned offsets on purpose: the superset must be imported.
        model.tensors = {
            {"a.w0", 0, 1000, 3 * MiB, 0},     {"a.w1", 0, 3 * MiB + 5000, 2 * MiB, 0},
            {"a.c0", 0, 6 * MiB, MiB, 2},      {"a.g1", 0, 8 * MiB + 333, 4 * MiB, 1},
            {"b.w0", 1, 4096, 2 * MiB, 0},     {"b.g1", 1, 3 * MiB, 4 * MiB + 7, 1},
        };
    }
    Plan plan() {
        PlanOptions o;
        o.import_enabled = true;
        auto p = make_plan(model, o);
        REQUIRE(p.ok());
        return std::move(p).value();
    }
};

// The fixture's two files mapped writable, two fake device importers and the CPU: what most
// executor cases start from.
struct Mapped {
    Fixture fx;
    TestMapping ma{fx.file_a.path(), fx.file_a.size(), true};
    TestMapping mb{fx.file_b.path(), fx.file_b.size(), true};
    std::vector<MappedFile> files{ma.view(), mb.view()};
    FakeImporter gpu0{"gpu0", wm::test::device_caps(4096, true)};
    FakeImporter gpu1{"gpu1", wm::test::device_caps(4096, true)};
    std::unique_ptr<Importer> cpu = make_cpu_importer();
    std::vector<Importer*> importers{&gpu0, &gpu1, cpu.get()};
};

void check_every_tensor_resolves(const ModelDesc& model, const Placement& placement,
                                 const std::vector<MappedFile>& files) {
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
        const TensorDesc& t = model.tensors[i];
        TensorLocation loc = placement.locate(i);
        CHECK(loc.host_address == files[t.file].base + t.offset);
        if (!loc.imported) continue;
        REQUIRE(loc.buffer != nullptr);
        CHECK(loc.buffer->imported);
        CHECK(static_cast<std::byte*>(loc.buffer->host_address) + loc.offset_in_buffer ==
              files[t.file].base + t.offset);
        CHECK(loc.offset_in_buffer + t.size <= loc.buffer->size);
        // And the bytes there are the file's bytes.
        auto* p = static_cast<const unsigned char*>(loc.buffer->host_address) + loc.offset_in_buffer;
        CHECK(p[0] == wm::test::pattern_byte(t.offset));
        CHECK(p[t.size - 1] == wm::test::pattern_byte(t.offset + t.size - 1));
    }
}
} // namespace

TEST_CASE("every region imports and every tensor resolves to base + offset", "[executor]") {
    Fixture fx;
    TestMapping ma(fx.file_a.path(), fx.file_a.size(), true), mb(fx.file_b.path(), fx.file_b.size(), true);
    std::vector<MappedFile> files{ma.view(), mb.view()};
    FakeImporter gpu0("gpu0", wm::test::device_caps(4096, true));
    FakeImporter gpu1("gpu1", wm::test::device_caps(4096, true));
    gpu0.reject_unaligned = gpu1.reject_unaligned = true;
    gpu0.reject_read_only = gpu1.reject_read_only = true;
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&gpu0, &gpu1, cpu.get()};
    {
        auto placed = execute_plan(fx.model, fx.plan(), files, importers);
        REQUIRE(placed.ok());
        const Placement& placement = placed.value();
        for (const PlanRegion& r : placement.plan().regions) CHECK(r.decision == Decision::import);
        CHECK(gpu0.live_imports() == 2);
        CHECK(gpu1.live_imports() == 2);
        for (auto& call : gpu0.imports()) {
            CHECK(reinterpret_cast<std::uintptr_t>(call.address) % 4096 == 0);
            CHECK(call.size % 4096 == 0);
        }
        check_every_tensor_resolves(fx.model, placement, files);
        CHECK(placement.plan().totals.fallback_bytes == 0);
        CHECK(placement.import_count() == 5); // 4 device + 1 CPU passthrough
    }
    // Destruction released everything, in reverse order.
    CHECK(gpu0.live_imports() == 0);
    CHECK(gpu1.live_imports() == 0);
    auto imports = gpu0.imports(), releases = gpu0.releases();
    REQUIRE(releases.size() == 2);
    CHECK(releases[0].address == imports[1].address);
    CHECK(releases[1].address == imports[0].address);
}

TEST_CASE("a failed one-run import makes only that region a fallback, with a warning",
          "[executor]") {
    Fixture fx;
    TestMapping ma(fx.file_a.path(), fx.file_a.size(), true), mb(fx.file_b.path(), fx.file_b.size(), true);
    std::vector<MappedFile> files{ma.view(), mb.view()};
    FakeImporter gpu0("gpu0", wm::test::device_caps(4096, true));
    FakeImporter gpu1("gpu1", wm::test::device_caps(4096, true));
    gpu1.fail_import_at = 2; // GPU1's file-1 region
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&gpu0, &gpu1, cpu.get()};
    std::vector<std::string> warnings;
    ExecuteOptions options;
    options.log = [&](LogLevel level, std::string_view msg) {
        if (level == LogLevel::warning) warnings.emplace_back(msg);
    };
    auto placed = execute_plan(fx.model, fx.plan(), files, importers, options);
    REQUIRE(placed.ok());
    const Plan& plan = placed->plan();
    int fallbacks = 0;
    for (const PlanRegion& r : plan.regions) {
        if (r.decision == Decision::fallback) {
            ++fallbacks;
            CHECK(r.target == 1);
            CHECK(r.file == 1);
            CHECK_THAT(r.reason, Catch::Contains("injected failure at import #2"));
        }
    }
    CHECK(fallbacks == 1);
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Catch::Contains("GPU1") && Catch::Contains(fx.file_b.path()));
    TensorLocation b_g1 = placed->locate(5);
    CHECK_FALSE(b_g1.imported);
    CHECK_THAT(std::string(b_g1.reason), Catch::Contains("injected failure"));
    CHECK(placed->locate(3).imported); // GPU1's other region carried on
    CHECK(plan.totals.fallback_bytes == 4 * MiB + 7);
    check_every_tensor_resolves(fx.model, placed.value(), files);
}

namespace {

// One device region of six runs, each of two tensors, with CPU experts between them: the
// region fails the gate, and the 4 MiB gaps are too wide to merge, so each pair is one import.
struct SixRuns {
    static constexpr std::uint32_t runs = 6;
    static constexpr std::uint64_t tensor = 32 * 1024;
    wm::test::TempFile file{runs * 4 * MiB};
    ModelDesc model;
    SixRuns() {
        model.files = {{file.path(), file.size()}};
        model.targets = {TargetDesc{"GPU0", "gpu0", wm::test::device_caps(4096, true)},
                         TargetDesc{"CPU", "cpu", {}}};
        model.targets[1].caps.is_cpu = true;
        for (std::uint32_t k = 0; k < runs; ++k) {
            const std::uint64_t at = k * 4 * MiB;
            model.tensors.push_back({"w" + std::to_string(k) + ".a", 0, at + 100, tensor, 0});
            model.tensors.push_back({"w" + std::to_string(k) + ".b", 0, at + 64 * 1024, tensor, 0});
            model.tensors.push_back({"exps" + std::to_string(k), 0, at + MiB, 2 * MiB, 1});
        }
    }
    Plan plan() const {
        PlanOptions o;
        o.import_enabled = true;
        auto p = make_plan(model, o);
        REQUIRE(p.ok());
        REQUIRE(p->regions[0].runs.size() == runs);
        return std::move(p).value();
    }
};

// SixRuns mapped writable, a fake device importer and the CPU, the warnings collected.
struct SixRunsMapped {
    SixRuns six;
    TestMapping mapping{six.file.path(), six.file.size(), true};
    std::vector<MappedFile> files{mapping.view()};
    FakeImporter gpu0{"gpu0", wm::test::device_caps(4096, true)};
    std::unique_ptr<Importer> cpu = make_cpu_importer();
    std::vector<Importer*> importers{&gpu0, cpu.get()};
    std::vector<std::string> warnings;
    ExecuteOptions options;
    SixRunsMapped() {
        options.log = [this](LogLevel level, std::string_view msg) {
            if (level == LogLevel::warning) warnings.emplace_back(msg);
        };
    }
};

} // namespace

TEST_CASE("a refused import falls back alone: the region's other runs stay imported",
          "[executor]") {
    SixRunsMapped m;
    auto& [six, mapping, files, gpu0, cpu, importers, warnings, options] = m;
    gpu0.fail_import_at = 3; // the region's third run
    const Plan planned = six.plan();
    const std::vector<std::uint32_t> refused_tensors = planned.regions[0].runs[2].tensors;
    {
        auto placed = execute_plan(six.model, planned, files, importers, options);
        REQUIRE(placed.ok());
        const Placement& placement = placed.value();
        const Plan& plan = placement.plan();
        INFO(plan.regions[0].reason);
        CHECK(wm::test::plan_violations(six.model, plan).empty());
        const PlanRegion& region = plan.regions[0];
        CHECK(region.decision == Decision::import);
        REQUIRE(region.runs.size() == SixRuns::runs - 1);
        CHECK_THAT(region.reason, Catch::Contains("1 of its 6 imports refused when executed") &&
                                      Catch::Contains("injected failure at import #3"));
        CHECK(gpu0.live_imports() == 5);
        REQUIRE(placement.import_count() == 6); // five of GPU0 and the CPU's passthrough
        REQUIRE(warnings.size() == 1);
        CHECK_THAT(warnings[0], Catch::Contains("GPU0") && Catch::Contains("injected failure"));

        // The refused run's tensors fall back with the importer's reason...
        for (std::uint32_t t : refused_tensors) {
            const TensorLocation where = placement.locate(t);
            CHECK_FALSE(where.imported);
            CHECK(where.import_index == no_index);
            CHECK_THAT(std::string(where.reason),
                       Catch::Contains("gpu0 import of") &&
                           Catch::Contains("failed: injected failure at import #3"));
            CHECK(plan.tensors[t].run == no_index);
        }
        // ...and every other run is listed, in file order, serving what locate() says.
        std::vector<int> served(six.model.tensors.size(), 0);
        for (std::uint32_t i = 0; i < SixRuns::runs - 1; ++i) {
            const PlacedImport imp = placement.import_at(i);
            CHECK(imp.region == 0);
            CHECK(imp.run == i);
            CHECK(imp.extent_offset == region.runs[i].extent_offset);
            CHECK(static_cast<std::byte*>(imp.buffer->host_address) ==
                  files[0].base + imp.extent_offset);
            REQUIRE(imp.tensors.size() == 2);
            for (std::uint32_t t : imp.tensors) {
                ++served[t];
                const TensorLocation where = placement.locate(t);
                CHECK(where.imported);
                CHECK(where.import_index == i);
                CHECK(where.buffer == imp.buffer);
                CHECK(plan.tensors[t].run == i);
            }
        }
        CHECK(placement.import_at(SixRuns::runs - 1).target == 1); // the CPU's, last
        std::uint64_t surviving = 0;
        for (const PlanRun& run : region.runs) surviving += run.ctx_bytes;
        CHECK(surviving == 10 * SixRuns::tensor);
        CHECK(plan.totals.imported_bytes == surviving);
        CHECK(plan.totals.fallback_bytes == 2 * SixRuns::tensor);
        CHECK(plan.totals.imports == 5);
        for (std::uint32_t t = 0; t < six.model.tensors.size(); ++t)
            if (six.model.tensors[t].target == 0)
                CHECK(served[t] == (placement.locate(t).imported ? 1 : 0));
        check_every_tensor_resolves(six.model, placement, files);
    }
    // Destruction released the five survivors; the refused import was never live.
    CHECK(gpu0.live_imports() == 0);
    CHECK(gpu0.releases().size() == 5);
    CHECK(gpu0.imports().size() == 6);
}

TEST_CASE("a region all of whose runs are refused is a fallback; a target-wide refusal too",
          "[executor]") {
    SixRunsMapped m;
    auto& [six, mapping, files, gpu0, cpu, importers, warnings, options] = m;
    SECTION("every run refused, one warning each") {
        gpu0.misalign_result_by = 16; // every import comes back moved: each is refused
        auto placed = execute_plan(six.model, six.plan(), files, importers, options);
        REQUIRE(placed.ok());
        const PlanRegion& region = placed->plan().regions[0];
        CHECK(region.decision == Decision::fallback);
        CHECK(region.runs.empty());
        CHECK_THAT(region.reason, Catch::Contains("gpu0 importer returned"));
        CHECK(warnings.size() == SixRuns::runs);
        CHECK(placed->import_count() == 1); // the CPU's
        CHECK(gpu0.live_imports() == 0);
        CHECK(placed->plan().totals.imported_bytes == 0);
        CHECK(wm::test::plan_violations(six.model, placed->plan()).empty());
    }
    SECTION("an unavailable importer: the region falls back whole, one warning") {
        gpu0.set_unavailable("no GPU agent");
        auto placed = execute_plan(six.model, six.plan(), files, importers, options);
        REQUIRE(placed.ok());
        CHECK(placed->plan().regions[0].decision == Decision::fallback);
        CHECK_THAT(placed->plan().regions[0].reason, Catch::Contains("no GPU agent"));
        CHECK(warnings.size() == 1);
        CHECK(gpu0.imports().empty());
    }
}

TEST_CASE("a read-only mapping makes a writable-needing importer fall back", "[executor]") {
    Fixture fx;
    TestMapping ma(fx.file_a.path(), fx.file_a.size(), false), mb(fx.file_b.path(), fx.file_b.size(), false);
    std::vector<MappedFile> files{ma.view(), mb.view()};
    FakeImporter gpu0("gpu0", wm::test::device_caps(4096, true));
    gpu0.reject_read_only = true;
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&gpu0, nullptr, cpu.get()};
    ExecuteOptions quiet;
    quiet.log = [](LogLevel, std::string_view) {};
    auto placed = execute_plan(fx.model, fx.plan(), files, importers, quiet);
    REQUIRE(placed.ok());
    for (const PlanRegion& r : placed->plan().regions) {
        if (r.target == 2) {
            CHECK(r.decision == Decision::import);
        } else {
            CHECK(r.decision == Decision::fallback);
            CHECK_THAT(r.reason, Catch::Contains(r.target == 0 ? "pages not writable"
                                                               : "no importer for target 'GPU1'"));
        }
    }
    CHECK(gpu0.live_imports() == 0);
    CHECK(placed->plan().totals.imported_bytes == 0);
}

TEST_CASE("abort from the progress callback releases every import", "[executor]") {
    Fixture fx;
    TestMapping ma(fx.file_a.path(), fx.file_a.size(), true), mb(fx.file_b.path(), fx.file_b.size(), true);
    std::vector<MappedFile> files{ma.view(), mb.view()};
    FakeImporter gpu0("gpu0", wm::test::device_caps(4096, true));
    FakeImporter gpu1("gpu1", wm::test::device_caps(4096, true));
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&gpu0, &gpu1, cpu.get()};
    for (int stop_after = 1; stop_after <= 4; ++stop_after) {
        int calls = 0;
        ExecuteOptions options;
        options.progress = [&](std::uint64_t done, std::uint64_t total) {
            CHECK(done <= total);
            return ++calls < stop_after;
        };
        auto placed = execute_plan(fx.model, fx.plan(), files, importers, options);
        REQUIRE_FALSE(placed.ok());
        CHECK(placed.error().kind == ErrorKind::aborted);
        CHECK(gpu0.live_imports() == 0);
        CHECK(gpu1.live_imports() == 0);
    }
}

TEST_CASE("an unusable call fails before importing anything", "[executor]") {
    Fixture fx;
    TestMapping ma(fx.file_a.path(), fx.file_a.size(), true);
    std::vector<MappedFile> one{ma.view()};
    FakeImporter gpu0("gpu0");
    std::vector<Importer*> importers{&gpu0, &gpu0, nullptr};
    auto r = execute_plan(fx.model, fx.plan(), one, importers);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("1 mapped files given for a model of 2"));
    CHECK(gpu0.imports().empty());
}

TEST_CASE("extent checks at execution: short mapping, misaligned base, moved result", "[executor]") {
    Fixture fx;
    TestMapping ma(fx.file_a.path(), fx.file_a.size(), true), mb(fx.file_b.path(), fx.file_b.size(), true);
    FakeImporter gpu0("gpu0", wm::test::device_caps(4096, true));
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&gpu0, nullptr, cpu.get()};
    ExecuteOptions quiet;
    quiet.log = [](LogLevel, std::string_view) {};

    SECTION("mapping shorter than its tensors: refused, every address would pass its end") {
        std::vector<MappedFile> files{{ma.base, 4096}, mb.view()};
        auto placed = execute_plan(fx.model, fx.plan(), files, importers, quiet);
        REQUIRE_FALSE(placed.ok());
        CHECK(placed.error().kind == ErrorKind::invalid_argument);
        CHECK_THAT(placed.error().message, Catch::Contains("passes the mapped length 0x1000"));
        CHECK(gpu0.imports().empty());
    }
    SECTION("importer returns another address") {
        gpu0.misalign_result_by = 16;
        std::vector<MappedFile> files{ma.view(), mb.view()};
        auto placed = execute_plan(fx.model, fx.plan(), files, importers, quiet);
        REQUIRE(placed.ok());
        CHECK(placed->plan().regions[0].decision == Decision::fallback);
        CHECK_THAT(placed->plan().regions[0].reason, Catch::Contains("returned"));
        CHECK(gpu0.live_imports() == 0);
    }
    SECTION("importer alignment larger than the mapping's") {
        FakeImporter big("gpu0", wm::test::device_caps(1 << 30, true));
        std::vector<Importer*> imps{&big, nullptr, cpu.get()};
        std::vector<MappedFile> files{ma.view(), mb.view()};
        auto placed = execute_plan(fx.model, fx.plan(), files, imps, quiet);
        REQUIRE(placed.ok());
        CHECK(placed->plan().regions[0].decision == Decision::fallback);
        CHECK(big.imports().empty());
    }
}

TEST_CASE("unavailable importer: fallback with its reason, nothing imported", "[executor]") {
    Fixture fx;
    TestMapping ma(fx.file_a.path(), fx.file_a.size(), true), mb(fx.file_b.path(), fx.file_b.size(), true);
    std::vector<MappedFile> files{ma.view(), mb.view()};
    FakeImporter gpu0("gpu0", wm::test::device_caps(4096, true));
    gpu0.set_unavailable("no GPU agent");
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&gpu0, nullptr, cpu.get()};
    ExecuteOptions quiet;
    quiet.log = [](LogLevel, std::string_view) {};
    auto placed = execute_plan(fx.model, fx.plan(), files, importers, quiet);
    REQUIRE(placed.ok());
    CHECK_THAT(placed->plan().regions[0].reason, Catch::Contains("no GPU agent"));
    CHECK(gpu0.imports().empty());
}

TEST_CASE("registry: CPU last, always available; unknown names are errors", "[registry]") {
    auto table = importer_registry();
    REQUIRE(table.size() == 4);
    CHECK(table[0].name == "hsa");
    CHECK(table[1].name == "cuda");
    CHECK(table[2].name == "vulkan");
    CHECK(table.back().name == "cpu");
    CHECK(table.back().built);
    auto cpu = create_importer("cpu");
    REQUIRE(cpu.ok());
    CHECK(cpu.value()->caps().is_cpu);
    CHECK_FALSE(cpu.value()->caps().needs_writable_mapping);
    auto unknown = create_importer("metal");
    REQUIRE_FALSE(unknown.ok());
    CHECK_THAT(unknown.error().message, Catch::Contains("unknown importer 'metal'"));
    CHECK_THAT(unknown.error().message, Catch::EndsWith("(known: hsa, cuda, vulkan, cpu, auto)"));
    auto any = create_importer("auto");
    REQUIRE(any.ok());
    CHECK(any.value()->available().available);
}

TEST_CASE("a placement lists its live imports and what each serves", "[executor]") {
    Mapped m;
    auto& [fx, ma, mb, files, gpu0, gpu1, cpu, importers] = m;
    gpu1.fail_import_at = 2; // GPU1's file-1 region falls back: its import must not be listed
    ExecuteOptions quiet;
    quiet.log = [](LogLevel, std::string_view) {};
    auto placed = execute_plan(fx.model, fx.plan(), files, importers, quiet);
    REQUIRE(placed.ok());
    const Placement& placement = placed.value();
    // gpu0: a, b; gpu1: a only (its b import was refused); cpu: a.
    REQUIRE(placement.import_count() == 4);
    std::vector<int> served(fx.model.tensors.size(), 0);
    for (std::size_t i = 0; i < placement.import_count(); ++i) {
        const PlacedImport imp = placement.import_at(i);
        REQUIRE(imp.buffer != nullptr);
        const PlanRegion& region = placement.plan().regions[imp.region];
        CHECK(imp.target == region.target);
        CHECK(imp.file == region.file);
        CHECK(static_cast<std::byte*>(imp.buffer->host_address) ==
              files[imp.file].base + imp.extent_offset);
        CHECK_FALSE(imp.tensors.empty());
        for (std::uint32_t t : imp.tensors) {
            ++served[t];
            const TensorLocation where = placement.locate(t);
            CHECK(where.import_index == i);
            CHECK(where.buffer == imp.buffer);
            CHECK(fx.model.tensors[t].target == imp.target);
        }
    }
    // Every imported tensor is served by exactly one listed import; the fallbacks by none.
    for (std::uint32_t t = 0; t < fx.model.tensors.size(); ++t) {
        const bool fell_back = fx.model.tensors[t].file == 1 && fx.model.tensors[t].target == 1;
        CHECK(served[t] == (fell_back ? 0 : 1));
        CHECK(placement.locate(t).imported == !fell_back);
        if (fell_back) CHECK(placement.locate(t).import_index == no_index);
    }
    placed.value().release_all();
    CHECK(placement.import_count() == 0);
}

TEST_CASE("a placement needs no ModelDesc after execution", "[executor]") {
    Mapped m;
    auto& [fx, ma, mb, files, gpu0, gpu1, cpu, importers] = m;
    const ModelDesc kept = fx.model;
    Result<Placement> placed = [&] {
        // The engine's description lives on the stack of its load function and is gone before
        // the first token: locate() must not read it (ASan reports a use after free if it does).
        auto scoped = std::make_unique<ModelDesc>(fx.model);
        Plan plan = fx.plan();
        return execute_plan(*scoped, std::move(plan), files, importers);
    }();
    REQUIRE(placed.ok());
    check_every_tensor_resolves(kept, placed.value(), files);
}

TEST_CASE("a plan that does not fit the model fails before anything is imported", "[executor]") {
    Mapped m;
    auto& [fx, ma, mb, files, gpu0, gpu1, cpu, importers] = m;
    const std::vector<std::pair<const char*, std::function<void(Plan&)>>> edits = {
        {"region 0 names target", [](Plan& p) { p.regions[0].target = 9; }},
        {"region 1 names target", [](Plan& p) { p.regions[1].file = 2; }},
        {"which is not one of the region's",
         [](Plan& p) { p.regions[0].runs[0].tensors.push_back(2); }}, // a CPU tensor
        {"serves tensor 99", [](Plan& p) { p.regions[0].runs[0].tensors.push_back(99); }},
        {"is in region 77", [](Plan& p) { p.tensors[0].region = 77; }},
        {"is in run 5 of region", [](Plan& p) { p.tensors[0].run = 5; }},
    };
    for (const auto& [message, edit] : edits) {
        INFO(message);
        Plan plan = fx.plan();
        edit(plan);
        auto placed = execute_plan(fx.model, std::move(plan), files, importers);
        REQUIRE_FALSE(placed.ok());
        CHECK(placed.error().kind == ErrorKind::invalid_argument);
        CHECK(placed.error().message.find(message) != std::string::npos);
        CHECK(gpu0.imports().empty());
        CHECK(gpu1.imports().empty());
    }
}

TEST_CASE("locate() of an index out of range has a defined answer", "[executor]") {
    Mapped m;
    auto& [fx, ma, mb, files, gpu0, gpu1, cpu, importers] = m;
    auto placed = execute_plan(fx.model, fx.plan(), files, importers);
    REQUIRE(placed.ok());
    for (std::uint32_t index : {std::uint32_t(fx.model.tensors.size()), no_index}) {
        const TensorLocation where = placed->locate(index);
        CHECK_FALSE(where.imported);
        CHECK(where.buffer == nullptr);
        CHECK(where.host_address == nullptr);
        CHECK(where.import_index == no_index);
        CHECK(where.reason == "tensor index out of range");
    }
    Placement empty;
    CHECK(empty.locate(0).reason == "tensor index out of range");
}

// Every field of a plan an engine can edit, edited: execute_plan refuses the plan, naming the
// tensor, before anything is imported (locate() would otherwise return a buffer offset that is
// not the tensor, or one past the import).
TEST_CASE("an edited placement or extent fails naming the tensor, before anything is imported",
          "[executor]") {
    Mapped m;
    auto& [fx, ma, mb, files, gpu0, gpu1, cpu, importers] = m;
    const Plan planned = fx.plan();
    const TensorPlacement& w0 = planned.tensors[0];
    REQUIRE(w0.run != no_index);
    const std::uint32_t b_w0 = 4; // "b.w0": file 1, target 0
    REQUIRE(planned.tensors[b_w0].run != no_index);
    REQUIRE(planned.tensors[b_w0].region != w0.region);
    REQUIRE(planned.tensors[b_w0].region != planned.tensors[b_w0].run);
    const std::vector<std::pair<const char*, std::function<void(Plan&)>>> edits = {
        {"'a.w0'", [](Plan& p) { p.tensors[0].offset_in_run += 64 * 1024; }}, // inside its run
        {"'a.w0'", [](Plan& p) { p.tensors[0].offset_in_run += 64 * MiB; }},  // past its run
        {"'a.w0'", [](Plan& p) { p.tensors[0].offset_in_run -= 1; }},
        {"'a.w0'", // placed in another region's run
         [&](Plan& p) {
             p.tensors[0].region = planned.tensors[b_w0].region;
             p.tensors[0].run = planned.tensors[b_w0].run;
         }},
        {"'b.w0'", // region and run swapped
         [&](Plan& p) { std::swap(p.tensors[b_w0].region, p.tensors[b_w0].run); }},
        {"'a.w0'", // the run moved on by a page: the tensor's offset in it no longer fits
         [&](Plan& p) { p.regions[w0.region].runs[w0.run].extent_offset += 4096; }},
        {"'a.w0'", // moved, its tensors' offsets moved with it: the tensor starts before it
         [&](Plan& p) {
             PlanRun& run = p.regions[w0.region].runs[w0.run];
             run.extent_offset += 4096;
             for (std::uint32_t t : run.tensors) p.tensors[t].offset_in_run -= 4096;
         }},
        {"does not lie inside", // shrunk under its tensors
         [&](Plan& p) { p.regions[w0.region].runs[w0.run].extent_size = 4096; }},
    };
    for (const auto& [message, edit] : edits) {
        INFO(message);
        Plan plan = planned;
        edit(plan);
        auto placed = execute_plan(fx.model, std::move(plan), files, importers);
        REQUIRE_FALSE(placed.ok());
        INFO(placed.error().message);
        CHECK(placed.error().kind == ErrorKind::invalid_argument);
        CHECK_THAT(placed.error().message, Catch::Contains(message) && Catch::Contains("tensor"));
        CHECK(gpu0.imports().empty());
        CHECK(gpu1.imports().empty());
    }
    // Unedited, the same plan places every tensor where it is.
    auto placed = execute_plan(fx.model, planned, files, importers);
    REQUIRE(placed.ok());
    check_every_tensor_resolves(fx.model, placed.value(), files);
}

TEST_CASE("import_at() of an index out of range has a defined answer", "[executor]") {
    Mapped m;
    auto& [fx, ma, mb, files, gpu0, gpu1, cpu, importers] = m;
    auto placed = execute_plan(fx.model, fx.plan(), files, importers);
    REQUIRE(placed.ok());
    for (std::size_t index : {placed->import_count(), std::size_t{1} << 40}) {
        const PlacedImport none = placed->import_at(index);
        CHECK(none.buffer == nullptr);
        CHECK(none.target == no_index);
        CHECK(none.file == no_index);
        CHECK(none.region == no_index);
        CHECK(none.run == no_index);
        CHECK(none.tensors.empty());
    }
    CHECK(Placement().import_at(0).buffer == nullptr);
}

TEST_CASE("compute_totals of a plan with indices out of range counts them as not imported",
          "[executor]") {
    Fixture fx;
    const Plan planned = fx.plan();
    const PlanTotals right = compute_totals(fx.model, planned);
    const std::uint64_t w0 = fx.model.tensors[0].size;
    Plan edited = planned;
    edited.tensors[0].region = 1000; // out of range: not imported
    PlanTotals totals = compute_totals(fx.model, edited);
    CHECK(totals.imported_bytes == right.imported_bytes - w0);
    CHECK(totals.fallback_bytes == right.fallback_bytes + w0);
    edited.regions[0].target = 1000; // a target the model lacks: not counted
    totals = compute_totals(fx.model, edited);
    CHECK(totals.imports < right.imports);
    edited.tensors.resize(2); // shorter than the model: the rest are fallbacks
    totals = compute_totals(fx.model, edited);
    CHECK(totals.device_bytes == right.device_bytes);
    ModelDesc other = fx.model;
    other.tensors[1].target = 1000; // a tensor on a target the model lacks: not counted
    CHECK(compute_totals(other, planned).device_bytes ==
          right.device_bytes - fx.model.tensors[1].size);
}
