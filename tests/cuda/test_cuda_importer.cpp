// SPDX-License-Identifier: MIT
// The CUDA importer on the fake driver: availability and its reasons, the integrated/discrete
// decision, read-only registration of a PROT_READ mapping, device pointers that are the driver's,
// read_back through the device, refusals that never reach the driver, injected failures leaving
// nothing registered, copies, the engine's own context, teardown, and concurrent use.
#include <catch2/catch.hpp>

#include <mutex>
#include <thread>
#include <vector>

#include "cuda/cuda_fixture.hpp"
#include "support/alloc_fault.hpp"
#include "support/capture_log.hpp"
#include "weightmap/log.hpp"

using namespace wm;
using namespace wm::cuda;
using wm::test::FakeCuda;
using wm::test::fake_cuda_importer;
using wm::test::MappedPatternFile;

namespace {
const std::uint64_t page = host_page_size();
using Model = FakeCuda::Model;

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Reads `size` bytes at `offset` of `buffer` through the importer; fails the test on an error.
std::vector<std::uint8_t> read_through(Importer& importer, const ImportedBuffer& buffer,
                                       std::uint64_t offset, std::uint64_t size) {
    std::vector<std::uint8_t> bytes(size);
    Status read = importer.read_back(buffer, offset, size, bytes.data());
    INFO("read_back: " << (read ? "ok" : read.error().message));
    REQUIRE(read.ok());
    return bytes;
}

} // namespace

TEST_CASE("an integrated device is available, unified, and imports without a writable mapping",
          "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    {
        auto cuda = fake_cuda_importer();
        CHECK(cuda->name() == "cuda");
        CHECK(cuda->available().available);
        CHECK(cuda->available().reason.empty());
        const ImporterCaps caps = cuda->caps();
        CHECK_FALSE(caps.needs_writable_mapping); // READ_ONLY_HOST_REGISTER_SUPPORTED
        CHECK(caps.alignment == page);
        CHECK(caps.max_import_size == 0);
        CHECK_FALSE(caps.is_cpu);
        CHECK(caps.device_memory == DeviceMemory::unified);
        CHECK(cuda->notes().device_memory ==
              "Orin: CU_DEVICE_ATTRIBUTE_INTEGRATED 1; import method register");
        // Asking costs no context: the primary context is retained on the first import.
        CHECK(fake.primary_ctx_refcount(0) == 0);
        MappedPatternFile f(4);
        auto imported = cuda->import(f.page(1), 2 * page);
        REQUIRE(imported.ok());
        CHECK(fake.primary_ctx_refcount(0) == 1);
        REQUIRE(cuda->release(imported.value()).ok());
    }
    CHECK(fake.primary_ctx_refcount(0) == 0); // released by the destructor
    CHECK(fake.live_registrations() == 0);
}

TEST_CASE("device memory comes from INTEGRATED and PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES",
          "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_device_model(0, Model::coherent);
    auto coherent_importer = fake_cuda_importer();
    const ImporterCaps coherent = coherent_importer->caps();
    // GH200 has HBM of its own: coherent, which the default policy copies (issue 43)
    CHECK(coherent.device_memory == DeviceMemory::coherent);
    CHECK(coherent_importer->available().available);
    CHECK_THAT(std::string(coherent_importer->notes().device_memory),
               Catch::StartsWith("NVIDIA GH200 480GB: CU_DEVICE_ATTRIBUTE_INTEGRATED 0") &&
                   Catch::EndsWith("PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 1; import "
                                   "method direct"));

    fake.set_device_model(0, Model::discrete);
    auto refused = fake_cuda_importer();
    CHECK(refused->caps().device_memory == DeviceMemory::discrete);
    CHECK_FALSE(refused->available().available);
    CHECK_THAT(refused->available().reason,
               Catch::Contains("'NVIDIA H200' is a discrete GPU") &&
                   Catch::Contains("allow_discrete") && Catch::Contains("cuda_pin_fallbacks"));
    MappedPatternFile f(2);
    auto imported = refused->import(f.page(0), page);
    REQUIRE_FALSE(imported.ok());
    CHECK(imported.error().kind == ErrorKind::unsupported);
    CHECK(fake.calls("cuMemHostRegister_v2") == 0);

    CudaImporterParams opt_in;
    opt_in.allow_discrete = true;
    auto allowed = fake_cuda_importer(opt_in);
    CHECK(allowed->available().available);
    CHECK(allowed->caps().device_memory == DeviceMemory::discrete); // still: the plan decides

    CudaImporterParams told;
    told.device_memory = DeviceMemory::unified;
    auto overridden = fake_cuda_importer(told);
    CHECK(overridden->available().available);
    CHECK(overridden->caps().device_memory == DeviceMemory::unified);
    CHECK_THAT(std::string(overridden->notes().device_memory),
               Catch::StartsWith("CudaImporterParams::device_memory; the driver says discrete"));
}

TEST_CASE("a PROT_READ mapping is registered READ_ONLY and read back as the device sees it",
          "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    auto cuda = fake_cuda_importer();
    MappedPatternFile f(8); // read-only mapping
    auto imported = cuda->import(f.page(2), 3 * page);
    REQUIRE(imported.ok());
    const ImportedBuffer& buffer = imported.value();
    CHECK(buffer.host_address == f.page(2));
    CHECK(buffer.size == 3 * page);
    CHECK(buffer.imported);
    CHECK(fake.registration_flags(f.page(2), 3 * page) ==
          (CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_READ_ONLY));
    // The driver's device pointer, not the host pointer.
    CHECK(address(buffer.device_address) == address(f.page(2)) + fake.mapped_aperture());
    CHECK(fake.context_depth() == 0); // every call pops what it pushed

    const std::uint64_t before = fake.dtoh_bytes();
    const auto bytes = read_through(*cuda, buffer, 777, 5000);
    CHECK(wm::test::equals_file_bytes(bytes, 2 * page + 777));
    CHECK(fake.dtoh_bytes() == before + 5000); // through cuMemcpyDtoH, not memcpy
    std::uint8_t two[2];
    CHECK_FALSE(cuda->read_back(buffer, 3 * page - 1, 2, two).ok());

    REQUIRE(cuda->release(buffer).ok());
    CHECK(fake.live_registrations() == 0);
    CHECK_FALSE(cuda->release(buffer).ok()); // exactly once
    CHECK(fake.calls("cuMemHostUnregister") == 1);
}

TEST_CASE("without read-only registration the importer asks for a writable mapping", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_attribute(0, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0);
    auto cuda = fake_cuda_importer();
    CHECK(cuda->caps().needs_writable_mapping);
    MappedPatternFile read_only(2), writable(2, true);
    auto refused = cuda->import(read_only.page(0), page);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().kind == ErrorKind::import_failed);
    CHECK_THAT(refused.error().message,
               Catch::Contains("cuMemHostRegister(") && Catch::Contains(", DEVICEMAP)") &&
                   Catch::Contains("CUDA_ERROR_INVALID_VALUE (1): invalid argument") &&
                   Catch::Contains("need CU_MEMHOSTREGISTER_READ_ONLY"));
    CHECK(fake.live_registrations() == 0);
    auto imported = cuda->import(writable.page(0), page);
    REQUIRE(imported.ok());
    CHECK(fake.registration_flags(writable.page(0), page) == CU_MEMHOSTREGISTER_DEVICEMAP);
    REQUIRE(cuda->release(imported.value()).ok());

    // A device that reads through the host's page tables needs neither.
    fake.set_device_model(0, Model::coherent);
    fake.set_attribute(0, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0);
    auto coherent = fake_cuda_importer();
    CHECK_FALSE(coherent->caps().needs_writable_mapping);
    auto in_place = coherent->import(read_only.page(1), page);
    REQUIRE(in_place.ok());
    REQUIRE(coherent->release(in_place.value()).ok());
}

TEST_CASE("a driver that is missing, wrong or failing is a reason, not a failure", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    CudaImporterParams params;
    params.library_path = "/nonexistent/libcuda.so.1";
    auto missing = make_cuda_importer(params);
    REQUIRE(missing.ok());
    CHECK_FALSE(missing.value()->available().available);
    CHECK_THAT(missing.value()->available().reason,
               Catch::Contains("cannot load the CUDA driver '/nonexistent/libcuda.so.1'"));
    CHECK_FALSE(missing.value()->caps().needs_writable_mapping);

    params.library_path = "libm.so.6";
    auto wrong = make_cuda_importer(params);
    REQUIRE(wrong.ok());
    CHECK_THAT(wrong.value()->available().reason, Catch::Contains("'libm.so.6' lacks cuInit"));

    fake.set_init_result(CUDA_ERROR_NO_DEVICE);
    auto no_gpu = fake_cuda_importer();
    CHECK_THAT(no_gpu->available().reason,
               Catch::Contains("cuInit failed") &&
                   Catch::Contains("CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device"));
    fake.set_init_result(CUDA_SUCCESS);

    CudaImporterParams third;
    third.device_ordinal = 3;
    CHECK_THAT(fake_cuda_importer(third)->available().reason,
               Catch::Contains("no CUDA device 3") && Catch::Contains("(it has 1)"));

    fake.set_attribute(0, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0);
    CHECK_THAT(fake_cuda_importer()->available().reason,
               Catch::Contains("HOST_REGISTER_SUPPORTED 0"));

    CudaImporterParams negative;
    negative.device_ordinal = -1;
    auto bad = make_cuda_importer(negative);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(bad.error().message, Catch::Contains("device_ordinal is -1"));
}

TEST_CASE("the engine's context is used as given and never retained or released", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    fake.set_device_count(2);
    const Api& api = fake.api();
    REQUIRE(api.init(0) == CUDA_SUCCESS);
    CUcontext engine = nullptr;
    REQUIRE(api.primary_ctx_retain(&engine, 1) == CUDA_SUCCESS); // the engine's, on device 1
    {
        CudaImporterParams params;
        params.context = reinterpret_cast<std::uintptr_t>(engine);
        auto cuda = fake_cuda_importer(params);
        REQUIRE(cuda->available().available);
        MappedPatternFile f(2);
        auto imported = cuda->import(f.page(0), page);
        REQUIRE(imported.ok());
        CHECK(fake.primary_ctx_refcount(1) == 1); // only the engine's retain
        CHECK(fake.primary_ctx_refcount(0) == 0);
        REQUIRE(cuda->release(imported.value()).ok());
    }
    CHECK(fake.primary_ctx_refcount(1) == 1);
    REQUIRE(api.primary_ctx_release(1) == CUDA_SUCCESS);

    CudaImporterParams bogus;
    bogus.library_path = wm::test::fake_cuda_path;
    bogus.context = 0x1234;
    auto refused = make_cuda_importer(bogus);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(refused.error().message,
               Catch::Contains("CudaImporterParams::context 0x1234 cannot be made current") &&
                   Catch::Contains("CUDA_ERROR_INVALID_CONTEXT"));
    CHECK(fake.context_depth() == 0);
}

TEST_CASE("unusable ranges are refused without a driver call", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    auto cuda = fake_cuda_importer();
    MappedPatternFile f(4);
    struct Bad {
        void* host;
        std::uint64_t size;
        const char* why;
    };
    const Bad bad[] = {
        {nullptr, page, "null address"},
        {f.page(0), 0, "zero size"},
        {f.page(0) + 8, page, "not aligned"},
        {f.page(0), page + 1, "not aligned"},
        {reinterpret_cast<void*>(UINTPTR_MAX - page + 1), 2 * page, "wraps"},
    };
    for (const Bad& b : bad) {
        INFO(b.why);
        auto imported = cuda->import(b.host, b.size);
        REQUIRE_FALSE(imported.ok());
        CHECK(imported.error().kind == ErrorKind::invalid_argument);
        CHECK_THAT(imported.error().message, Catch::Contains(b.why));
    }
    CHECK(fake.calls("cuMemHostRegister_v2") == 0);
    ImportedBuffer forged;
    forged.host_address = f.page(1);
    forged.size = page;
    forged.device_address = reinterpret_cast<void*>(address(f.page(1)) + fake.mapped_aperture());
    CHECK_FALSE(cuda->release(forged).ok());
    std::uint8_t byte = 0;
    CHECK_FALSE(cuda->read_back(forged, 0, 1, &byte).ok());
    CHECK(fake.calls("cuMemHostUnregister") == 0);
    CHECK(fake.calls("cuMemcpyDtoH_v2") == 0);
}

TEST_CASE("a refused registration, device pointer or context leaves nothing registered",
          "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    auto cuda = fake_cuda_importer();
    MappedPatternFile f(4);

    fake.fail_at("cuDevicePrimaryCtxRetain", 1, CUDA_ERROR_OUT_OF_MEMORY);
    auto no_context = cuda->import(f.page(0), page);
    REQUIRE_FALSE(no_context.ok());
    CHECK_THAT(no_context.error().message,
               Catch::Contains("cuDevicePrimaryCtxRetain(device 0 'Orin') failed") &&
                   Catch::Contains("CUDA_ERROR_OUT_OF_MEMORY"));

    fake.fail_at("cuMemHostRegister_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
    auto refused = cuda->import(f.page(0), page);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().kind == ErrorKind::import_failed);
    CHECK_THAT(refused.error().message,
               Catch::Contains("DEVICEMAP|READ_ONLY) failed on 'Orin'") &&
                   Catch::Contains("CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"));

    fake.fail_at("cuMemHostGetDevicePointer_v2", 1, CUDA_ERROR_INVALID_VALUE);
    auto unmapped = cuda->import(f.page(0), page);
    REQUIRE_FALSE(unmapped.ok());
    CHECK_THAT(unmapped.error().message,
               Catch::Contains("cuMemHostGetDevicePointer(") && Catch::Contains("unregistered it"));
    CHECK(fake.live_registrations() == 0);

    // A second import of registered pages: the driver's own refusal, with what it means.
    auto first = cuda->import(f.page(0), 2 * page);
    REQUIRE(first.ok());
    auto overlap = cuda->import(f.page(1), 2 * page);
    REQUIRE_FALSE(overlap.ok());
    CHECK_THAT(overlap.error().message,
               Catch::Contains("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED") &&
                   Catch::Contains("already registered in this process"));
    REQUIRE(cuda->release(first.value()).ok());
    CHECK(fake.live_registrations() == 0);
    CHECK(fake.context_depth() == 0);
}

TEST_CASE("copies are device allocations, read back, freed once, and cleaned up on failure",
          "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    auto cuda = fake_cuda_importer();
    MappedPatternFile f(4);
    auto copy = cuda->allocate_copy(f.page(0) + 100, 3000);
    REQUIRE(copy.ok());
    CHECK_FALSE(copy->imported);
    CHECK(address(copy->device_address) >= fake.alloc_base());
    CHECK(fake.live_allocations() == 1);
    CHECK(wm::test::equals_file_bytes(read_through(*cuda, copy.value(), 10, 2990), 110));
    ImportedBuffer as_import = copy.value();
    as_import.imported = true;
    CHECK_FALSE(cuda->free_copy(as_import).ok());
    REQUIRE(cuda->free_copy(copy.value()).ok());
    CHECK_FALSE(cuda->free_copy(copy.value()).ok());
    CHECK(fake.live_allocations() == 0);

    fake.fail_at("cuMemcpyHtoD_v2", 1, CUDA_ERROR_INVALID_VALUE);
    auto failed = cuda->allocate_copy(f.page(0), 100);
    REQUIRE_FALSE(failed.ok());
    CHECK_THAT(failed.error().message, Catch::Contains("cuMemcpyHtoD(100 bytes) failed"));
    CHECK(fake.live_allocations() == 0); // freed again
    fake.fail_at("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_FALSE(cuda->allocate_copy(f.page(0), 100).ok());
    CHECK_FALSE(cuda->allocate_copy(nullptr, 100).ok());
}

TEST_CASE("destruction releases what the caller left, with a warning", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    wm::test::CaptureLog log;
    MappedPatternFile f(4);
    {
        auto cuda = fake_cuda_importer();
        REQUIRE(cuda->import(f.page(0), page).ok());
        REQUIRE(cuda->allocate_copy(f.page(2), 64).ok());
        CHECK(fake.live_registrations() == 1);
        CHECK(fake.live_allocations() == 1);
    }
    CHECK(fake.live_registrations() == 0);
    CHECK(fake.live_allocations() == 0);
    CHECK(fake.primary_ctx_refcount(0) == 0);
    REQUIRE(log.warnings.size() == 1);
    CHECK_THAT(log.warnings[0], Catch::Contains("1 registration(s) and 1 copy buffer(s)"));
}

TEST_CASE("imports and releases from several threads at once", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    auto cuda = fake_cuda_importer();
    constexpr int threads = 4, rounds = 25;
    MappedPatternFile f(threads);
    std::vector<std::thread> pool;
    std::vector<int> failures(threads, 0);
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            for (int r = 0; r < rounds; ++r) {
                auto imported = cuda->import(f.page(t), page);
                if (!imported || !cuda->release(imported.value())) ++failures[t];
            }
        });
    for (auto& thread : pool) thread.join();
    CHECK(failures == std::vector<int>(threads, 0));
    CHECK(fake.calls("cuMemHostRegister_v2") == threads * rounds);
    CHECK(fake.live_registrations() == 0);
    CHECK(fake.primary_ctx_refcount(0) == 1); // retained once, whichever thread came first
}

TEST_CASE("an import or copy whose record runs out of memory is undone, and says out of memory",
          "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    auto cuda = fake_cuda_importer();
    MappedPatternFile f(4);
    const std::uint64_t faults = wm::test::check_import_out_of_memory(
        *cuda, f.page(0), 2 * page, [&] { return fake.live_registrations(); });
    CHECK(faults >= 1);

    wm::test::fail_each_allocation(
        [&] {
            auto copy = cuda->allocate_copy(f.page(0), page);
            if (copy) (void)cuda->free_copy(copy.value());
        },
        [&] { CHECK(fake.live_allocations() == 0); });
}
