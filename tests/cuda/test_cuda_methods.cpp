// SPDX-License-Identifier: MIT
// The three import methods, per device model of the fake driver (docs/cuda.md's table): direct
// where the device reads pageable memory through the host's page tables (GH200, GB10: the import
// is the host pointer, nothing registered), register elsewhere (Orin, H200, B300), unavailable
// where the device can do neither (Jetson Nano); a registration refused with 801 goes direct only
// where the device reads pageable memory, else that run falls back with the driver's reason.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cuda/cuda_fixture.hpp"
#include "support/capture_log.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using namespace wm::cuda;
using wm::test::FakeCuda;
using wm::test::fake_cuda_importer;
using wm::test::MappedPatternFile;
using Model = FakeCuda::Model;

namespace {
const std::uint64_t page = host_page_size();

CudaImporterState state_of(const Importer& importer) {
    auto state = cuda_importer_state(importer);
    REQUIRE(state.ok());
    return state.value();
}

std::vector<std::uint8_t> read_through(Importer& importer, const ImportedBuffer& buffer,
                                       std::uint64_t offset, std::uint64_t size) {
    std::vector<std::uint8_t> bytes(size);
    REQUIRE(importer.read_back(buffer, offset, size, bytes.data()).ok());
    return bytes;
}

CudaImporterParams discrete_opt_in() {
    CudaImporterParams params;
    params.allow_discrete = true;
    return params;
}
} // namespace

TEST_CASE("GH200 and GB10 import directly: the host pointer, nothing registered", "[cuda]") {
    for (Model model : {Model::gh200, Model::gb10}) {
        FakeCuda& fake = FakeCuda::fresh();
        fake.set_device_model(0, model);
        auto cuda = fake_cuda_importer();
        INFO(cuda->notes().device_memory);
        REQUIRE(cuda->available().available);
        CHECK(state_of(*cuda).method == CudaImportMethod::direct);
        CHECK_FALSE(cuda->caps().needs_writable_mapping); // the mapping stays PROT_READ
        CHECK_THAT(std::string(cuda->notes().device_memory), Catch::EndsWith("; import method direct"));
        MappedPatternFile f(8);
        auto imported = cuda->import(f.page(1), 4 * page);
        REQUIRE(imported.ok());
        CHECK(imported->device_address == f.page(1));
        CHECK(fake.calls("cuMemHostRegister_v2") == 0);
        CHECK(fake.live_registrations() == 0);
        CHECK(state_of(*cuda).direct_imports == 1);
        // Read back through the device: it copies the host pointer into its own memory first.
        const auto bytes = read_through(*cuda, imported.value(), 123, 3 * page);
        CHECK(wm::test::equals_file_bytes(bytes, page + 123));
        CHECK(fake.dtod_bytes() == 3 * page);
        CHECK(fake.live_allocations() == 0); // the read-back's staging is freed
        // An overlapping import is refused without a driver call, a foreign buffer too.
        CHECK_FALSE(cuda->import(f.page(4), page).ok());
        ImportedBuffer forged = imported.value();
        forged.size = page;
        CHECK_FALSE(cuda->release(forged).ok());
        REQUIRE(cuda->release(imported.value()).ok());
        CHECK_FALSE(cuda->release(imported.value()).ok()); // exactly once
        CHECK(state_of(*cuda).direct_imports == 0);
        CHECK(fake.calls("cuMemHostUnregister") == 0);
        CHECK(fake.misuse_count() == 0);
    }
}

TEST_CASE("a device without pageable access may not dereference a host pointer", "[cuda]") {
    // What makes the direct tests above able to fail: the fake refuses (and reports as a misuse)
    // a host pointer used by a device that cannot read pageable memory.
    FakeCuda& fake = FakeCuda::fresh();
    auto cuda = fake_cuda_importer(); // orin: registers
    CHECK(state_of(*cuda).method == CudaImportMethod::register_host);
    MappedPatternFile f(2);
    const Api& api = fake.api();
    CUcontext context = nullptr;
    REQUIRE(api.init(0) == CUDA_SUCCESS);
    REQUIRE(api.primary_ctx_retain(&context, 0) == CUDA_SUCCESS);
    REQUIRE(api.ctx_push_current(context) == CUDA_SUCCESS);
    CUdeviceptr staging = 0;
    REQUIRE(api.mem_alloc(&staging, page) == CUDA_SUCCESS);
    const auto host = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(f.page(0)));
    CHECK(api.memcpy_unified(staging, host, page) == CUDA_ERROR_INVALID_VALUE);
    CHECK(fake.misuse_count() == 1);
    fake.forgive_misuse();
    fake.set_device_model(0, Model::gh200);
    CHECK(api.memcpy_unified(staging, host, page) == CUDA_SUCCESS);
    // an explicit kind on pageable memory is refused even where the device reads it (issue 43)
    CHECK(api.memcpy_dtod(staging, host, page) == CUDA_ERROR_INVALID_VALUE);
    CHECK(fake.misuse_count() == 0);
    CHECK(api.mem_free(staging) == CUDA_SUCCESS);
    CUcontext popped = nullptr;
    CHECK(api.ctx_pop_current(&popped) == CUDA_SUCCESS);
    CHECK(api.primary_ctx_release(0) == CUDA_SUCCESS);
}

TEST_CASE("a registration refused with 801 goes direct only where the device reads pageable "
          "memory", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_device_model(0, Model::h200);
    MappedPatternFile f(4);
    SECTION("without pageable access that run falls back with the driver's reason") {
        auto cuda = fake_cuda_importer(discrete_opt_in());
        fake.fail_at("cuMemHostRegister_v2", 1, CUDA_ERROR_NOT_SUPPORTED);
        auto refused = cuda->import(f.page(0), page);
        REQUIRE_FALSE(refused.ok());
        CHECK(refused.error().kind == ErrorKind::import_failed);
        CHECK_THAT(refused.error().message,
                   Catch::Contains("CUDA_ERROR_NOT_SUPPORTED (801): operation not supported"));
        CHECK(state_of(*cuda).method == CudaImportMethod::register_host);
        auto next = cuda->import(f.page(1), page); // the next run registers again
        REQUIRE(next.ok());
        CHECK(state_of(*cuda).registrations == 1);
        REQUIRE(cuda->release(next.value()).ok());
    }
    SECTION("with it (HMM) the importer switches to direct, once, and says so") {
        fake.set_attribute(0, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 1);
        wm::test::CaptureLog log;
        auto cuda = fake_cuda_importer(discrete_opt_in());
        CHECK(state_of(*cuda).method == CudaImportMethod::register_host);
        fake.fail_at("cuMemHostRegister_v2", 1, CUDA_ERROR_NOT_SUPPORTED);
        auto first = cuda->import(f.page(0), page);
        auto second = cuda->import(f.page(2), page);
        const std::vector<std::string>& warnings = log.warnings;
        REQUIRE(first.ok());
        REQUIRE(second.ok());
        CHECK(first->device_address == f.page(0));
        CHECK(fake.calls("cuMemHostRegister_v2") == 1); // the second never asked
        CHECK(state_of(*cuda).method == CudaImportMethod::direct);
        CHECK(state_of(*cuda).direct_imports == 2);
        REQUIRE(warnings.size() == 1);
        CHECK_THAT(warnings[0], Catch::Contains("CUDA_ERROR_NOT_SUPPORTED (801)") &&
                                    Catch::Contains("uses the mapping directly"));
        const auto bytes = read_through(*cuda, second.value(), 0, page);
        CHECK(wm::test::equals_file_bytes(bytes, 2 * page));
        REQUIRE(cuda->release(first.value()).ok());
        REQUIRE(cuda->release(second.value()).ok());
    }
    CHECK(fake.live_registrations() == 0);
    CHECK(fake.misuse_count() == 0);
}

TEST_CASE("B300: no READ_ONLY, so a writable mapping registers and a read-only one is refused",
          "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_device_model(0, Model::b300);
    auto cuda = fake_cuda_importer(discrete_opt_in());
    CHECK(state_of(*cuda).method == CudaImportMethod::register_host);
    CHECK(cuda->caps().needs_writable_mapping);
    CHECK_THAT(std::string(cuda->notes().device_memory),
               Catch::Contains("import method register (no READ_ONLY_HOST_REGISTER_SUPPORTED: "
                               "the files are opened O_RDWR"));
    MappedPatternFile read_only(2), writable(2, true);
    auto refused = cuda->import(read_only.page(0), page);
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(refused.error().message,
               Catch::Contains("CUDA_ERROR_INVALID_VALUE") &&
                   Catch::Contains("need CU_MEMHOSTREGISTER_READ_ONLY"));
    auto imported = cuda->import(writable.page(0), page);
    REQUIRE(imported.ok());
    CHECK(fake.registration_flags(writable.page(0), page) == CU_MEMHOSTREGISTER_DEVICEMAP);
    CHECK(state_of(*cuda).registrations == 1);
    REQUIRE(cuda->release(imported.value()).ok());
}

TEST_CASE("a Jetson Nano can neither register nor read pageable memory: unavailable", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_device_model(0, Model::tegra_x1);
    auto cuda = fake_cuda_importer();
    CHECK_FALSE(cuda->available().available);
    CHECK_THAT(cuda->available().reason,
               Catch::Contains("'NVIDIA Tegra X1' does not support cuMemHostRegister") &&
                   Catch::Contains("host's page tables"));
    const CudaImporterState state = state_of(*cuda);
    CHECK(state.method == CudaImportMethod::unavailable);
    CHECK(state.method_note == cuda->available().reason);
    MappedPatternFile f(1);
    CHECK_FALSE(cuda->import(f.page(0), page).ok());
    CHECK(fake.calls("cuMemHostRegister_v2") == 0);
}

TEST_CASE("cuda_importer_state refuses an importer it did not make", "[cuda]") {
    auto cpu = make_cpu_importer();
    auto state = cuda_importer_state(*cpu);
    REQUIRE_FALSE(state.ok());
    CHECK(state.error().kind == ErrorKind::invalid_argument);
    CHECK(std::string(to_string(CudaImportMethod::register_host)) == "register");
}
