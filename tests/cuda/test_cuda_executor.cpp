// SPDX-License-Identifier: MIT
// The CUDA importer as a target's importer, end to end through make_plan and execute_plan over a
// read-only file mapping: on an integrated device every device tensor is in place and reads back
// through its device pointer; on a discrete one the plan falls back and cuda_pin_fallbacks
// page-locks exactly the fallback tensors' pages, owned and released by the placement.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cuda/cuda_fixture.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using namespace wm::cuda;
using wm::test::FakeCuda;
using wm::test::fake_cuda_importer;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;
const std::uint64_t page = host_page_size();

// One file: two device tensors around a CPU one, and a second device target (same importer)
// whose tensor shares a page with the first device run.
struct Weights {
    wm::test::TempFile file{6 * MiB + 100};
    wm::test::FileMapping map{file.path(), file.size(), false};
    ModelDesc model;
    Weights(const Importer& gpu, const Importer& cpu) {
        model.files = {{file.path(), file.size()}};
        model.targets = {target_for("CUDA0", gpu), target_for("CPU", cpu),
                         target_for("CUDA0-copied", gpu)};
        model.targets[2].import_policy = ImportPolicy::never;
        model.tensors = {
            {"gpu.a", 0, 1000, MiB, 0},
            {"gpu.b", 0, MiB + 1000, 100, 2}, // shares gpu.a's last page, on the copied target
            {"cpu", 0, 2 * MiB, MiB, 1},
            {"gpu.c", 0, 4 * MiB + 77, MiB, 0},
        };
    }
    std::vector<MappedFile> files() const { return {map.view()}; }
    Plan plan(ImportPolicy policy = ImportPolicy::unified_only) const {
        PlanOptions options;
        options.import_enabled = true;
        options.import_policy = policy;
        auto plan = make_plan(model, options);
        REQUIRE(plan.ok());
        return std::move(plan).value();
    }
};

ExecuteOptions quiet() {
    ExecuteOptions options;
    options.log = [](LogLevel, std::string_view) {};
    return options;
}

// The fake's importer, the model over it, and the model executed through it (the placement goes
// first, the importers last).
struct Executed {
    std::unique_ptr<Importer> cuda;
    std::unique_ptr<Importer> cpu = make_cpu_importer();
    Weights m;
    Placement placement;
    explicit Executed(const CudaImporterParams& params = {},
                      ImportPolicy policy = ImportPolicy::unified_only)
        : cuda(fake_cuda_importer(params)), m(*cuda, *cpu) {
        std::vector<Importer*> importers{cuda.get(), cpu.get(), cuda.get()};
        auto placed = execute_plan(m.model, m.plan(policy), m.files(), importers, quiet());
        REQUIRE(placed.ok());
        placement = std::move(placed).value();
    }
};

std::uint64_t pages_of(std::uint64_t offset, std::uint64_t size) {
    return (offset + size + page - 1) / page - offset / page;
}
} // namespace

TEST_CASE("on an integrated device every device tensor reads back through its device pointer",
          "[cuda][executor]") {
    FakeCuda& fake = FakeCuda::fresh();
    {
        Executed e;
        const Placement& placement = e.placement;
        Importer& cuda = *e.cuda;
        const Weights& m = e.m;
        for (std::uint32_t i : {0u, 3u}) {
            const TensorDesc& t = m.model.tensors[i];
            INFO(t.name);
            TensorLocation where = placement.locate(i);
            REQUIRE(where.imported);
            CHECK(reinterpret_cast<std::uintptr_t>(where.buffer->device_address) ==
                  reinterpret_cast<std::uintptr_t>(where.buffer->host_address) +
                      fake.mapped_aperture());
            std::vector<std::uint8_t> bytes(t.size);
            REQUIRE(cuda.read_back(*where.buffer, where.offset_in_buffer, t.size, bytes.data())
                        .ok());
            CHECK(wm::test::equals_file_bytes(bytes, t.offset));
        }
        CHECK_FALSE(placement.locate(1).imported); // the copied target's policy is never
        CHECK(fake.live_registrations() == 2);
        CHECK(fake.last_register_flags() ==
              (CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_READ_ONLY));
    }
    CHECK(fake.live_registrations() == 0);
}

TEST_CASE("on a discrete device the plan falls back; imports only when the engine insists",
          "[cuda][executor]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_device_model(0, FakeCuda::Model::discrete);
    auto cpu = make_cpu_importer();
    auto refused = fake_cuda_importer();
    Weights m(*refused, *cpu);
    const Plan plan = m.plan();
    CHECK(plan.totals.imports == 0);
    CHECK_THAT(plan.regions[0].reason, Catch::Contains("discrete"));

    CudaImporterParams opt_in;
    opt_in.allow_discrete = true;
    Executed e(opt_in, ImportPolicy::always);
    CHECK(e.placement.locate(0).imported);
    CHECK(e.placement.locate(3).imported);
    CHECK(fake.live_registrations() == 2);
}

TEST_CASE("cuda_pin_fallbacks page-locks the fallback tensors, released with the placement",
          "[cuda][executor][pin]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_device_model(0, FakeCuda::Model::discrete);
    Executed e; // unavailable for imports: pins need no opt-in
    REQUIRE_FALSE(e.cuda->available().available);
    REQUIRE(e.placement.import_count() == 1); // the CPU passthrough only
    Importer& cuda = *e.cuda;
    const Weights& m = e.m;

    auto report = cuda_pin_fallbacks(cuda, e.placement, m.model, m.files());
    INFO((report.ok() ? report->first_refusal : report.error().message));
    REQUIRE(report.ok());
    // gpu.a and gpu.b share a page and merge; gpu.c is its own range. The CPU tensor is not
    // a device tensor and stays pageable.
    CHECK(report->tensors == 3);
    CHECK(report->ranges == 2);
    CHECK(report->refused_ranges == 0);
    CHECK(report->bytes == (pages_of(1000, MiB + 100) + pages_of(4 * MiB + 77, MiB)) * page);
    std::byte* base = m.map.base();
    CHECK(fake.registration_flags(base, pages_of(1000, MiB + 100) * page) ==
          CU_MEMHOSTREGISTER_READ_ONLY); // no DEVICEMAP: for copies, and the mapping stays RO
    CHECK(fake.live_registered_bytes() == report->bytes);
    CHECK(fake.context_depth() == 0);

    // A second call finds every page registered: refusals, not an error, and nothing changes.
    auto again = cuda_pin_fallbacks(cuda, e.placement, m.model, m.files());
    REQUIRE(again.ok());
    CHECK(again->ranges == 0);
    CHECK(again->refused_ranges == 2);
    CHECK_THAT(again->first_refusal, Catch::Contains("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"));
    CHECK(fake.live_registrations() == 2);

    e.placement.release_all();
    CHECK(fake.live_registrations() == 0);
    CHECK(fake.calls("cuMemHostUnregister") == 2);
}

TEST_CASE("pins leave out the pages an import holds, and one target can be chosen",
          "[cuda][executor][pin]") {
    FakeCuda& fake = FakeCuda::fresh();
    Executed e;
    Importer& cuda = *e.cuda;
    const Weights& m = e.m;
    REQUIRE(e.placement.locate(0).imported);
    REQUIRE_FALSE(e.placement.locate(1).imported);
    const std::uint64_t imported_pages = fake.live_registered_bytes() / page;

    // gpu.b's only page is gpu.a's import's last one: nothing is left to pin, and nothing is
    // refused (the driver would refuse a page registered twice).
    auto report = cuda_pin_fallbacks(cuda, e.placement, m.model, m.files(), 2);
    REQUIRE(report.ok());
    CHECK(report->tensors == 1);
    CHECK(report->ranges == 0);
    CHECK(report->refused_ranges == 0);
    CHECK(fake.live_registered_bytes() / page == imported_pages);

    // The CPU target has no fallback tensors of its own: nothing to pin either.
    auto cpu_target = cuda_pin_fallbacks(cuda, e.placement, m.model, m.files(), 1);
    REQUIRE(cpu_target.ok());
    CHECK(cpu_target->tensors == 0);
}

TEST_CASE("a refused pin stays a pageable copy; unusable calls fail before any pin",
          "[cuda][executor][pin]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_device_model(0, FakeCuda::Model::discrete);
    Executed e;
    Importer& cuda = *e.cuda;
    const Weights& m = e.m;
    Placement& placement = e.placement;

    fake.fail_at("cuMemHostRegister_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
    auto report = cuda_pin_fallbacks(cuda, placement, m.model, m.files());
    REQUIRE(report.ok());
    CHECK(report->ranges == 1);
    CHECK(report->refused_ranges == 1);
    CHECK_THAT(report->first_refusal, Catch::Contains("CUDA_ERROR_OUT_OF_MEMORY"));
    placement.release_all();
    CHECK(fake.live_registrations() == 0);

    const long calls = fake.calls("cuMemHostRegister_v2");
    auto not_cuda = cuda_pin_fallbacks(*e.cpu, placement, m.model, m.files());
    REQUIRE_FALSE(not_cuda.ok());
    CHECK_THAT(not_cuda.error().message, Catch::Contains("was not made by make_cuda_importer"));
    auto no_files = cuda_pin_fallbacks(cuda, placement, m.model, {});
    REQUIRE_FALSE(no_files.ok());
    CHECK(no_files.error().kind == ErrorKind::invalid_argument);
    auto bad_target = cuda_pin_fallbacks(cuda, placement, m.model, m.files(), 7);
    REQUIRE_FALSE(bad_target.ok());
    CHECK_THAT(bad_target.error().message, Catch::Contains("target 7 out of range"));
    CudaImporterParams missing;
    missing.library_path = "/nonexistent/libcuda.so.1";
    auto driverless = make_cuda_importer(missing);
    REQUIRE(driverless.ok());
    auto unloaded = cuda_pin_fallbacks(*driverless.value(), placement, m.model, m.files());
    REQUIRE_FALSE(unloaded.ok());
    CHECK(unloaded.error().kind == ErrorKind::unsupported);
    CHECK(fake.calls("cuMemHostRegister_v2") == calls);
}

TEST_CASE("every device model places the plan by its method and reads back as its device sees it",
          "[cuda][executor]") {
    struct Case {
        FakeCuda::Model model;
        CudaImportMethod method;
        std::uint64_t registrations; // live while the placement holds its imports
    };
    // Under ImportPolicy::always with the opt-in, so the discrete cards import too. The mapping
    // is read-only: the B300 (no READ_ONLY) refuses it, and its runs fall back alone.
    const Case cases[] = {
        {FakeCuda::Model::orin, CudaImportMethod::register_host, 2},
        {FakeCuda::Model::gh200, CudaImportMethod::direct, 0},
        {FakeCuda::Model::gb10, CudaImportMethod::direct, 0},
        {FakeCuda::Model::h200, CudaImportMethod::register_host, 2},
        {FakeCuda::Model::b300, CudaImportMethod::register_host, 0},
    };
    for (const Case& c : cases) {
        FakeCuda& fake = FakeCuda::fresh();
        fake.set_device_model(0, c.model);
        CudaImporterParams params;
        params.allow_discrete = true;
        {
            Executed e(params, ImportPolicy::always);
            auto state = cuda_importer_state(*e.cuda);
            REQUIRE(state.ok());
            INFO(e.cuda->notes().device_memory);
            CHECK(state->method == c.method);
            CHECK(state->registrations == c.registrations);
            CHECK(fake.live_registrations() == static_cast<long>(c.registrations));
            const bool imports = c.model != FakeCuda::Model::b300;
            for (std::uint32_t i : {0u, 3u}) {
                const TensorDesc& t = e.m.model.tensors[i];
                const TensorLocation where = e.placement.locate(i);
                CHECK(where.imported == imports);
                if (!where.imported) continue;
                std::vector<std::uint8_t> bytes(t.size);
                REQUIRE(e.cuda->read_back(*where.buffer, where.offset_in_buffer, t.size,
                                          bytes.data())
                            .ok());
                CHECK(wm::test::equals_file_bytes(bytes, t.offset));
            }
        }
        CHECK(fake.live_registrations() == 0);
        CHECK(fake.live_allocations() == 0);
        CHECK(fake.misuse_count() == 0);
    }
}
