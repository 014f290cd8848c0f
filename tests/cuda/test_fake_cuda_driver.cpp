// SPDX-License-Identifier: MIT
// The fake CUDA driver itself, called directly: each rule it enforces has a case here that fails
// if the rule goes, so the importer's tests can trust a refusal or an acceptance to be the
// driver's. Every case ends with nothing live, and forgives the misuse it provokes on purpose.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "cuda/cuda_driver.hpp"
#include "cuda/fake_cuda.hpp"

using namespace wm::cuda;
using wm::test::FakeCuda;
using Model = FakeCuda::Model;

namespace {
const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));

// A test's own anonymous MAP_SHARED mapping of `count` pages.
class Pages {
public:
    explicit Pages(std::size_t count, int prot = PROT_READ | PROT_WRITE) : size_(count * page) {
        void* p = mmap(nullptr, size_, prot, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::runtime_error("mmap");
        base_ = static_cast<std::byte*>(p);
    }
    ~Pages() { munmap(base_, size_); }
    Pages(const Pages&) = delete;
    Pages& operator=(const Pages&) = delete;
    std::byte* at(std::size_t index) const { return base_ + index * page; }
    std::size_t size() const { return size_; }

private:
    std::byte* base_ = nullptr;
    std::size_t size_ = 0;
};

// The fake, reset and initialised, as every case after the cuInit ones wants it.
FakeCuda& initialised() {
    FakeCuda& fake = FakeCuda::fresh();
    REQUIRE(fake.api().init(0) == CUDA_SUCCESS);
    return fake;
}

// Device `device`'s primary context, retained and current on this thread as an engine would
// have it; popped and released on destruction.
class CurrentContext {
public:
    CurrentContext(const FakeCuda& fake, CUdevice device) : api_(fake.api()), device_(device) {
        REQUIRE(api_.primary_ctx_retain(&context_, device) == CUDA_SUCCESS);
        REQUIRE(api_.ctx_push_current(context_) == CUDA_SUCCESS);
    }
    ~CurrentContext() {
        CUcontext popped = nullptr;
        api_.ctx_pop_current(&popped);
        api_.primary_ctx_release(device_);
    }
    CurrentContext(const CurrentContext&) = delete;
    CurrentContext& operator=(const CurrentContext&) = delete;
    CUcontext get() const { return context_; }

private:
    const Api& api_;
    CUdevice device_;
    CUcontext context_ = nullptr;
};

// Devices 0, 1 and 2 become `first`, `second` and `third`.
void three_devices(FakeCuda& fake, Model first, Model second, Model third) {
    fake.set_device_count(3);
    fake.set_device_model(0, first);
    fake.set_device_model(1, second);
    fake.set_device_model(2, third);
}

void check_nothing_live(const FakeCuda& fake) {
    CHECK(fake.live_registrations() == 0);
    CHECK(fake.live_allocations() == 0);
    for (int device = 0; device < 8; ++device) CHECK(fake.primary_ctx_refcount(device) == 0);
    CHECK(fake.context_depth() == 0);
    CHECK(fake.misuse_count() == 0);
}

std::string error_name(const FakeCuda& fake, CUresult code) {
    const char* name = nullptr;
    return fake.api().get_error_name(code, &name) == CUDA_SUCCESS ? name : "?";
}
} // namespace

TEST_CASE("the fake exports the entry points under cuda.h's versioned names only", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    const char* const versioned[][2] = {
        {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"},
        {"cuCtxPushCurrent", "cuCtxPushCurrent_v2"},
        {"cuCtxPopCurrent", "cuCtxPopCurrent_v2"},
        {"cuMemHostRegister", "cuMemHostRegister_v2"},
        {"cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2"},
        {"cuMemAlloc", "cuMemAlloc_v2"},
        {"cuMemFree", "cuMemFree_v2"},
        {"cuMemcpyHtoD", "cuMemcpyHtoD_v2"},
        {"cuMemcpyDtoH", "cuMemcpyDtoH_v2"},
    };
    for (const auto& names : versioned) {
        INFO(names[0]);
        CHECK(fake.entry<void (*)()>(names[0]) == nullptr);
        CHECK(fake.entry<void (*)()>(names[1]) != nullptr);
    }
    // api() resolved all twenty in the constructor; these have no versioned name.
    CHECK(fake.entry<PFN_cuMemHostUnregister>("cuMemHostUnregister") ==
          fake.api().mem_host_unregister);
    CHECK(fake.entry<PFN_cuDevicePrimaryCtxRetain>("cuDevicePrimaryCtxRetain") ==
          fake.api().primary_ctx_retain);
}

TEST_CASE("before cuInit(0) only the version and the error texts answer", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    const Api& cu = fake.api();
    int value = 0;
    CUdevice device = 0;
    CUcontext context = nullptr;
    CUdeviceptr pointer = 0;
    char name[64] = {};
    Pages pages(1);
    CHECK(cu.device_get_count(&value) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.device_get(&device, 0) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.device_get_name(name, sizeof name, 0) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_INTEGRATED, 0) ==
          CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.primary_ctx_retain(&context, 0) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.primary_ctx_release(0) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.ctx_push_current(context) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.ctx_pop_current(&context) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.ctx_get_device(&device) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.mem_host_register(pages.at(0), page, 0) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.mem_host_get_device_pointer(&pointer, pages.at(0), 0) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.mem_alloc(&pointer, 64) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.mem_free(fake.alloc_base()) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.memcpy_htod(fake.alloc_base(), name, 1) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.memcpy_dtoh(name, fake.alloc_base(), 1) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.driver_get_version(&value) == CUDA_SUCCESS);
    CHECK(value == 12040);
    CHECK(error_name(fake, CUDA_ERROR_NOT_INITIALIZED) == "CUDA_ERROR_NOT_INITIALIZED");

    CHECK(cu.init(1) == CUDA_ERROR_INVALID_VALUE); // "the Flags parameter must be 0"
    CHECK(cu.device_get_count(&value) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cu.init(0) == CUDA_SUCCESS);
    CHECK(cu.init(0) == CUDA_SUCCESS); // any number of times
    CHECK(cu.device_get_count(&value) == CUDA_SUCCESS);
    CHECK(value == 1);
    CHECK(fake.calls("cuInit") == 3);
    CHECK(fake.calls("cuMemHostRegister_v2") == 1); // refused calls count too
    check_nothing_live(fake);
}

TEST_CASE("cuInit returns the configured result and initialises only on success", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    const Api& cu = fake.api();
    int count = 0;
    for (CUresult result : {CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INSUFFICIENT_DRIVER}) {
        fake.set_init_result(result);
        CHECK(cu.init(0) == result);
        CHECK(cu.device_get_count(&count) == CUDA_ERROR_NOT_INITIALIZED);
    }
    fake.set_init_result(CUDA_SUCCESS);
    CHECK(cu.init(0) == CUDA_SUCCESS);
    CHECK(cu.device_get_count(&count) == CUDA_SUCCESS);
    fake.reset(); // forgets cuInit
    CHECK(cu.device_get_count(&count) == CUDA_ERROR_NOT_INITIALIZED);
    check_nothing_live(fake);
}

TEST_CASE("cuDriverGetVersion reports the configured version", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    int version = 0;
    fake.set_driver_version(13000);
    CHECK(fake.api().driver_get_version(&version) == CUDA_SUCCESS);
    CHECK(version == 13000);
    CHECK(fake.api().driver_get_version(nullptr) == CUDA_ERROR_INVALID_VALUE);
    check_nothing_live(fake);
}

TEST_CASE("cuGetErrorName and cuGetErrorString give the driver's texts", "[cuda]") {
    FakeCuda& fake = FakeCuda::fresh();
    const Api& cu = fake.api();
    struct Text {
        CUresult code;
        const char* name;
        const char* text;
    };
    const Text texts[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
        {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
        {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
         "part or all of the requested memory range is already mapped"},
        {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
         "pointer does not correspond to a registered memory region"},
        {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
        {CUDA_ERROR_INSUFFICIENT_DRIVER, "CUDA_ERROR_INSUFFICIENT_DRIVER",
         "CUDA driver version is insufficient for CUDA runtime version"},
    };
    for (const Text& t : texts) {
        const char* name = nullptr;
        const char* text = nullptr;
        REQUIRE(cu.get_error_name(t.code, &name) == CUDA_SUCCESS);
        REQUIRE(cu.get_error_string(t.code, &text) == CUDA_SUCCESS);
        CHECK(std::string(name) == t.name);
        CHECK(std::string(text) == t.text);
    }
    // Documented: an unknown code is CUDA_ERROR_INVALID_VALUE and *pStr becomes NULL.
    const char* out = "untouched";
    CHECK(cu.get_error_name(12345, &out) == CUDA_ERROR_INVALID_VALUE);
    CHECK(out == nullptr);
    out = "untouched";
    CHECK(cu.get_error_string(12345, &out) == CUDA_ERROR_INVALID_VALUE);
    CHECK(out == nullptr);
    CHECK(cu.get_error_name(CUDA_SUCCESS, nullptr) == CUDA_ERROR_INVALID_VALUE);
    check_nothing_live(fake);
}

TEST_CASE("devices are the ordinals below the configured count", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    CUdevice device = -1;
    CHECK(cu.device_get(&device, 0) == CUDA_SUCCESS);
    CHECK(device == 0);
    CHECK(cu.device_get(&device, 1) == CUDA_ERROR_INVALID_DEVICE);
    fake.set_device_count(3);
    int count = 0;
    CHECK(cu.device_get_count(&count) == CUDA_SUCCESS);
    CHECK(count == 3);
    CHECK(cu.device_get(&device, 2) == CUDA_SUCCESS);
    CHECK(device == 2);
    CHECK(cu.device_get(&device, 3) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(cu.device_get(&device, -1) == CUDA_ERROR_INVALID_DEVICE);
    char name[64] = {};
    CHECK(cu.device_get_name(name, sizeof name, 3) == CUDA_ERROR_INVALID_DEVICE);
    int value = 0;
    CHECK(cu.device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_INTEGRATED, 3) ==
          CUDA_ERROR_INVALID_DEVICE);
    check_nothing_live(fake);
}

TEST_CASE("each device model has its name and attributes", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    fake.set_device_count(6);
    const Model models[] = {Model::orin, Model::gh200, Model::h200,
                            Model::gb10, Model::b300, Model::tegra_x1};
    for (int d = 0; d < 6; ++d) fake.set_device_model(d, models[d]);
    const char* const names[] = {"Orin",        "NVIDIA GH200 480GB", "NVIDIA H200",
                                 "NVIDIA GB10", "NVIDIA B300",        "NVIDIA Tegra X1"};
    // INTEGRATED, CAN_MAP_HOST_MEMORY, UNIFIED_ADDRESSING, PAGEABLE_MEMORY_ACCESS,
    // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, HOST_REGISTER_SUPPORTED,
    // PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, READ_ONLY_HOST_REGISTER_SUPPORTED
    const CUdevice_attribute attributes[] = {18, 19, 41, 88, 91, 99, 100, 113};
    const int expected[6][8] = {
        {1, 1, 1, 0, 1, 1, 0, 1}, {0, 1, 1, 1, 1, 1, 1, 1}, {0, 1, 1, 0, 1, 1, 0, 1},
        {1, 1, 1, 1, 1, 1, 1, 0}, {0, 1, 1, 0, 1, 1, 0, 0}, {1, 1, 1, 0, 0, 0, 0, 0},
    };
    for (int d = 0; d < 6; ++d) {
        INFO("device " << d);
        char name[64] = {};
        CHECK(cu.device_get_name(name, sizeof name, d) == CUDA_SUCCESS);
        CHECK(std::string(name) == names[d]);
        for (int a = 0; a < 8; ++a) {
            INFO("device " << d << " attribute " << attributes[a]);
            int value = -1;
            CHECK(cu.device_get_attribute(&value, attributes[a], d) == CUDA_SUCCESS);
            CHECK(value == expected[d][a]);
        }
    }
    char short_name[3] = {};
    CHECK(cu.device_get_name(short_name, sizeof short_name, 0) == CUDA_SUCCESS);
    CHECK(std::string(short_name) == "Or"); // truncated, NUL-terminated
    int value = 0;
    CHECK(cu.device_get_attribute(&value, 75, 0) == CUDA_ERROR_INVALID_VALUE); // not modelled
    check_nothing_live(fake);
}

TEST_CASE("an attribute override lasts until the device's model is set again", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    int value = -1;
    fake.set_attribute(0, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0);
    CHECK(cu.device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
                                  0) == CUDA_SUCCESS);
    CHECK(value == 0);
    fake.set_device_model(0, Model::integrated);
    CHECK(cu.device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
                                  0) == CUDA_SUCCESS);
    CHECK(value == 1);
    CHECK_THROWS_AS(fake.set_attribute(0, 75, 1), std::invalid_argument);
    CHECK_THROWS_AS(fake.set_attribute(8, CU_DEVICE_ATTRIBUTE_INTEGRATED, 1),
                    std::invalid_argument);
    check_nothing_live(fake);
}

TEST_CASE("primary contexts are one per device and reference-counted", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    fake.set_device_count(2);
    CUcontext first = nullptr, again = nullptr, other = nullptr;
    REQUIRE(cu.primary_ctx_retain(&first, 0) == CUDA_SUCCESS);
    REQUIRE(cu.primary_ctx_retain(&again, 0) == CUDA_SUCCESS);
    REQUIRE(cu.primary_ctx_retain(&other, 1) == CUDA_SUCCESS);
    CHECK(first != nullptr);
    CHECK(first == again);
    CHECK(other != first);
    CHECK(fake.primary_ctx_refcount(0) == 2);
    CHECK(cu.primary_ctx_retain(&other, 2) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(cu.primary_ctx_release(0) == CUDA_SUCCESS);
    CHECK(cu.primary_ctx_release(0) == CUDA_SUCCESS);
    CHECK(cu.primary_ctx_release(1) == CUDA_SUCCESS);
    CHECK(fake.misuse_count() == 0);
    CHECK(cu.primary_ctx_release(0) == CUDA_ERROR_INVALID_CONTEXT); // not retained: misuse
    CHECK(fake.misuse_count() == 1);
    fake.forgive_misuse();
    check_nothing_live(fake);
}

TEST_CASE("the context stack takes live contexts only and pops what was pushed", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    fake.set_device_count(2);
    CUdevice device = -1;
    CHECK(cu.ctx_get_device(&device) == CUDA_ERROR_INVALID_CONTEXT); // nothing current
    CUcontext context = nullptr;
    REQUIRE(cu.primary_ctx_retain(&context, 0) == CUDA_SUCCESS);
    REQUIRE(cu.primary_ctx_release(0) == CUDA_SUCCESS);
    CHECK(cu.ctx_push_current(context) == CUDA_ERROR_INVALID_CONTEXT); // released: not live
    CHECK(cu.ctx_push_current(nullptr) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(fake.context_depth() == 0);
    {
        CurrentContext zero(fake, 0);
        CurrentContext one(fake, 1);
        CHECK(fake.context_depth() == 2);
        CHECK(cu.ctx_get_device(&device) == CUDA_SUCCESS);
        CHECK(device == 1); // the top of the stack
        CUcontext popped = nullptr;
        REQUIRE(cu.ctx_pop_current(&popped) == CUDA_SUCCESS);
        CHECK(popped == one.get());
        CHECK(cu.ctx_get_device(&device) == CUDA_SUCCESS);
        CHECK(device == 0);
        REQUIRE(cu.ctx_push_current(popped) == CUDA_SUCCESS); // for one's destructor to pop
    }
    CHECK(cu.ctx_pop_current(&context) == CUDA_ERROR_INVALID_CONTEXT); // empty: misuse
    CHECK(fake.misuse_count() == 1);
    fake.forgive_misuse();
    check_nothing_live(fake);
}

TEST_CASE("memory calls need a current context that is still retained", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(1);
    char byte = 0;
    CUdeviceptr pointer = 0;
    auto all_refused = [&] {
        CHECK(cu.mem_host_register(pages.at(0), page, 0) == CUDA_ERROR_INVALID_CONTEXT);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_ERROR_INVALID_CONTEXT);
        CHECK(cu.mem_host_get_device_pointer(&pointer, pages.at(0), 0) ==
              CUDA_ERROR_INVALID_CONTEXT);
        CHECK(cu.mem_alloc(&pointer, 64) == CUDA_ERROR_INVALID_CONTEXT);
        CHECK(cu.mem_free(fake.alloc_base()) == CUDA_ERROR_INVALID_CONTEXT);
        CHECK(cu.memcpy_htod(fake.alloc_base(), &byte, 1) == CUDA_ERROR_INVALID_CONTEXT);
        CHECK(cu.memcpy_dtoh(&byte, fake.alloc_base(), 1) == CUDA_ERROR_INVALID_CONTEXT);
    };
    all_refused(); // no context at all
    CUcontext context = nullptr;
    REQUIRE(cu.primary_ctx_retain(&context, 0) == CUDA_SUCCESS);
    REQUIRE(cu.ctx_push_current(context) == CUDA_SUCCESS);
    REQUIRE(cu.primary_ctx_release(0) == CUDA_SUCCESS); // the release pops nothing
    CHECK(fake.context_depth() == 1);
    all_refused(); // a dead context is current
    REQUIRE(cu.ctx_pop_current(&context) == CUDA_SUCCESS);
    check_nothing_live(fake);
}

TEST_CASE("cuMemHostRegister refuses bad arguments, flags and devices", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(2);
    {
        CurrentContext context(fake, 0);
        CHECK(cu.mem_host_register(nullptr, page, 0) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.mem_host_register(pages.at(0), 0, 0) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.mem_host_register(pages.at(0), page, 0x10) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.mem_host_register(pages.at(0), page, CU_MEMHOSTREGISTER_IOMEMORY) ==
              CUDA_ERROR_NOT_SUPPORTED);
        CHECK(cu.mem_host_register(pages.at(0) + 64, page, 0) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.mem_host_register(pages.at(0), page + 1, 0) == CUDA_ERROR_INVALID_VALUE);
        fake.set_attribute(0, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0);
        CHECK(cu.mem_host_register(pages.at(0), page, 0) == CUDA_ERROR_NOT_SUPPORTED);
        CHECK(fake.live_registrations() == 0);
        fake.set_device_model(0, Model::integrated);

        const unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
        REQUIRE(cu.mem_host_register(pages.at(0), 2 * page, flags) == CUDA_SUCCESS);
        CHECK(fake.live_registrations() == 1);
        CHECK(fake.live_registered_bytes() == 2 * page);
        CHECK(fake.registration_flags(pages.at(0), 2 * page) == flags);
        CHECK(fake.registration_flags(pages.at(0), page) == -1); // not exactly the registration
        CHECK(fake.last_register_flags() == flags);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_SUCCESS);
    }
    check_nothing_live(fake);
}

TEST_CASE("cuMemHostRegister refuses a range with an unmapped page", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(3);
    REQUIRE(munmap(pages.at(1), page) == 0);
    {
        CurrentContext context(fake, 0);
        CHECK(cu.mem_host_register(pages.at(0), 3 * page, 0) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.mem_host_register(pages.at(1), page, CU_MEMHOSTREGISTER_READ_ONLY) ==
              CUDA_ERROR_INVALID_VALUE);
        REQUIRE(cu.mem_host_register(pages.at(2), page, 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(2)) == CUDA_SUCCESS);
    }
    check_nothing_live(fake);
}

TEST_CASE("read-only pages need CU_MEMHOSTREGISTER_READ_ONLY unless the device uses the host's "
          "page tables",
          "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages read_only(1, PROT_READ);
    Pages writable(1);
    three_devices(fake, Model::orin, Model::gh200, Model::h200);
    for (CUdevice device : {0, 2}) {
        INFO("device " << device);
        CurrentContext context(fake, device);
        CHECK(cu.mem_host_register(read_only.at(0), page, 0) == CUDA_ERROR_INVALID_VALUE);
        REQUIRE(cu.mem_host_register(read_only.at(0), page, CU_MEMHOSTREGISTER_READ_ONLY) ==
                CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(read_only.at(0)) == CUDA_SUCCESS);
    }
    {
        CurrentContext context(fake, 1); // coherent: PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
        REQUIRE(cu.mem_host_register(read_only.at(0), page, 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(read_only.at(0)) == CUDA_SUCCESS);
    }
    fake.set_attribute(0, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0);
    {
        CurrentContext context(fake, 0);
        CHECK(cu.mem_host_register(read_only.at(0), page, CU_MEMHOSTREGISTER_READ_ONLY) ==
              CUDA_ERROR_NOT_SUPPORTED);
        CHECK(cu.mem_host_register(writable.at(0), page, CU_MEMHOSTREGISTER_READ_ONLY) ==
              CUDA_ERROR_NOT_SUPPORTED);
    }
    check_nothing_live(fake);
}

TEST_CASE("the models answer registration as their sources report", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages read_only(1, PROT_READ);
    Pages writable(1);
    three_devices(fake, Model::gb10, Model::b300, Model::tegra_x1);
    for (CUdevice refuses_all : {0, 2}) { // GB10 (ds4#158), Jetson Nano (CUDAdrv.jl#142)
        CurrentContext context(fake, refuses_all);
        CHECK(cu.mem_host_register(writable.at(0), page, CU_MEMHOSTREGISTER_DEVICEMAP) ==
              CUDA_ERROR_NOT_SUPPORTED);
    }
    {
        // B300 (vllm-omni#6240): read-only + READ_ONLY 801, without INVALID_VALUE, writable ok.
        CurrentContext context(fake, 1);
        CHECK(cu.mem_host_register(read_only.at(0), page, CU_MEMHOSTREGISTER_READ_ONLY) ==
              CUDA_ERROR_NOT_SUPPORTED);
        CHECK(cu.mem_host_register(read_only.at(0), page, 0) == CUDA_ERROR_INVALID_VALUE);
        REQUIRE(cu.mem_host_register(writable.at(0), page, 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(writable.at(0)) == CUDA_SUCCESS);
    }
    check_nothing_live(fake);
}

TEST_CASE("cuMemHostRegister pins, except where the device uses the host's page tables: there "
          "it only populates", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(3);
    three_devices(fake, Model::orin, Model::gh200, Model::h200);
    for (CUdevice device : {0, 1}) {
        CurrentContext context(fake, device);
        REQUIRE(cu.mem_host_register(pages.at(device), page, 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(device)) == CUDA_SUCCESS);
    }
    CHECK(fake.pinned_bytes_total() == page);    // Orin's
    CHECK(fake.populated_bytes_total() == page); // GH200's (HPT 1)
    check_nothing_live(fake);
}

TEST_CASE("each model allocates up to its own memory: GH200 its 96 GiB of HBM", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    three_devices(fake, Model::gh200, Model::gb10, Model::h200);
    CHECK(fake.device_memory(0) == (std::uint64_t{96} << 30));
    CHECK(fake.device_memory(1) == (std::uint64_t{128} << 30));
    CHECK(fake.device_memory(3) == 0);
    {
        CurrentContext context(fake, 0);
        CUdeviceptr p = 0;
        CHECK(cu.mem_alloc(&p, (std::size_t{96} << 30) + 1) == CUDA_ERROR_OUT_OF_MEMORY);
    }
    check_nothing_live(fake);
}

TEST_CASE("cuMemHostRegister refuses any overlap with a live registration", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(4);
    {
        CurrentContext context(fake, 0);
        REQUIRE(cu.mem_host_register(pages.at(1), 2 * page, 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_register(pages.at(1), 2 * page, 0) ==
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        CHECK(cu.mem_host_register(pages.at(0), 2 * page, 0) ==
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        CHECK(cu.mem_host_register(pages.at(2), 2 * page, 0) ==
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        CHECK(cu.mem_host_register(pages.at(0), 4 * page, 0) ==
              CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        REQUIRE(cu.mem_host_register(pages.at(3), page, 0) == CUDA_SUCCESS); // adjacent is fine
        CHECK(fake.live_registrations() == 2);
        CHECK(cu.mem_host_unregister(pages.at(1)) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(3)) == CUDA_SUCCESS);
    }
    check_nothing_live(fake);
}

TEST_CASE("cuMemHostUnregister takes a registration's base only, once", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(2);
    {
        CurrentContext context(fake, 0);
        REQUIRE(cu.mem_host_register(pages.at(0), 2 * page, 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(1)) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
        CHECK(fake.misuse_count() == 1);
        CHECK(fake.live_registrations() == 1);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
        CHECK(fake.misuse_count() == 2);
        fake.forgive_misuse();
    }
    check_nothing_live(fake);
}

TEST_CASE("mapped host memory has the driver's device pointer, not the host one", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    fake.set_device_count(2);
    Pages mapped(2), unmapped(1), portable(1);
    CUdeviceptr pointer = 0;
    {
        CurrentContext context(fake, 0);
        REQUIRE(cu.mem_host_register(mapped.at(0), 2 * page, CU_MEMHOSTREGISTER_DEVICEMAP) ==
                CUDA_SUCCESS);
        REQUIRE(cu.mem_host_register(unmapped.at(0), page, 0) == CUDA_SUCCESS);
        REQUIRE(cu.mem_host_register(portable.at(0), page,
                                     CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE) ==
                CUDA_SUCCESS);
        REQUIRE(cu.mem_host_get_device_pointer(&pointer, mapped.at(0), 0) == CUDA_SUCCESS);
        const auto host = reinterpret_cast<CUdeviceptr>(mapped.at(0));
        CHECK(pointer != host);
        CHECK(pointer == host + fake.mapped_aperture());
        REQUIRE(cu.mem_host_get_device_pointer(&pointer, mapped.at(1) + 8, 0) == CUDA_SUCCESS);
        CHECK(pointer == host + page + 8 + fake.mapped_aperture()); // inside the registration
        CHECK(cu.mem_host_get_device_pointer(&pointer, mapped.at(0), 1) ==
              CUDA_ERROR_INVALID_VALUE); // "Flags ... must be set to 0"
        CHECK(cu.mem_host_get_device_pointer(&pointer, unmapped.at(0), 0) ==
              CUDA_ERROR_INVALID_VALUE); // registered without DEVICEMAP
        CHECK(cu.mem_host_get_device_pointer(&pointer, mapped.at(0) + 2 * page, 0) ==
              CUDA_ERROR_INVALID_VALUE); // past the registration
        fake.set_attribute(0, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0);
        CHECK(cu.mem_host_get_device_pointer(&pointer, mapped.at(0), 0) ==
              CUDA_ERROR_INVALID_VALUE); // DEVICEMAP's failure deferred to here
    }
    {
        CurrentContext other(fake, 1); // registered in device 0's context
        CHECK(cu.mem_host_get_device_pointer(&pointer, mapped.at(0), 0) ==
              CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.mem_host_get_device_pointer(&pointer, portable.at(0), 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(mapped.at(0)) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(unmapped.at(0)) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(portable.at(0)) == CUDA_SUCCESS);
    }
    check_nothing_live(fake);
}

TEST_CASE("device allocations are zeroed, aligned and in a range of their own", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    {
        CurrentContext context(fake, 0);
        CUdeviceptr a = 0, b = 0;
        CHECK(cu.mem_alloc(&a, 0) == CUDA_ERROR_INVALID_VALUE);
        REQUIRE(cu.mem_alloc(&a, 100) == CUDA_SUCCESS);
        REQUIRE(cu.mem_alloc(&b, 1000) == CUDA_SUCCESS);
        CHECK(a >= fake.alloc_base());
        CHECK(a % 512 == 0);
        CHECK(b % 512 == 0);
        CHECK(b >= a + 100);
        // Mapped host pointers are host + aperture, below 2 * aperture; allocations are above.
        CHECK(a >= 2 * fake.mapped_aperture());
        CHECK(fake.live_allocations() == 2);
        CHECK(fake.live_allocated_bytes() == 1100);
        std::vector<unsigned char> bytes(1000, 0xff);
        REQUIRE(cu.memcpy_dtoh(bytes.data(), b, bytes.size()) == CUDA_SUCCESS);
        CHECK(bytes == std::vector<unsigned char>(1000, 0));
        CHECK(cu.mem_alloc(&a, fake.device_memory(0)) == CUDA_ERROR_OUT_OF_MEMORY);
        CHECK(cu.mem_free(b + 512) == CUDA_ERROR_INVALID_VALUE); // not a base: misuse
        CHECK(fake.misuse_count() == 1);
        CHECK(cu.mem_free(a) == CUDA_SUCCESS);
        CHECK(cu.mem_free(b) == CUDA_SUCCESS);
        CHECK(cu.mem_free(b) == CUDA_ERROR_INVALID_VALUE); // freed twice: misuse
        CHECK(fake.misuse_count() == 2);
        fake.forgive_misuse();
    }
    check_nothing_live(fake);
}

TEST_CASE("copies stay inside one allocation or one mapped registration", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    std::vector<unsigned char> in(1024), out(1024);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7);
    {
        CurrentContext context(fake, 0);
        CUdeviceptr d = 0;
        REQUIRE(cu.mem_alloc(&d, 1024) == CUDA_SUCCESS);
        CHECK(cu.memcpy_htod(d, in.data(), 1024) == CUDA_SUCCESS);
        CHECK(cu.memcpy_dtoh(out.data(), d, 1024) == CUDA_SUCCESS);
        CHECK(out == in);
        CHECK(cu.memcpy_htod(d, in.data(), 1025) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.memcpy_htod(d + 512, in.data(), 513) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.memcpy_dtoh(out.data(), d - 1, 2) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.memcpy_htod(d, nullptr, 1) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.memcpy_dtoh(nullptr, d, 1) == CUDA_ERROR_INVALID_VALUE);
        CHECK(fake.htod_bytes() == 1024);
        CHECK(fake.dtoh_bytes() == 1024);
        REQUIRE(cu.mem_free(d) == CUDA_SUCCESS);
        CHECK(cu.memcpy_dtoh(out.data(), d, 1) == CUDA_ERROR_INVALID_VALUE); // freed
    }
    check_nothing_live(fake);
}

TEST_CASE("copies through a registration reach the host bytes, read-only ones one way",
          "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    fake.set_device_count(2);
    fake.set_device_model(1, Model::coherent);
    Pages mapped(1), read_only(1), bare(1), cpu_read_only(1, PROT_READ);
    const CUdeviceptr aperture = fake.mapped_aperture();
    auto device = [&](const Pages& p) { return reinterpret_cast<CUdeviceptr>(p.at(0)) + aperture; };
    const char text[] = "weights";
    char back[sizeof text] = {};
    {
        CurrentContext context(fake, 0);
        REQUIRE(cu.mem_host_register(mapped.at(0), page, CU_MEMHOSTREGISTER_DEVICEMAP) ==
                CUDA_SUCCESS);
        REQUIRE(cu.mem_host_register(read_only.at(0), page,
                                     CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_READ_ONLY) ==
                CUDA_SUCCESS);
        REQUIRE(cu.mem_host_register(bare.at(0), page, 0) == CUDA_SUCCESS);
        CHECK(cu.memcpy_htod(device(mapped) + 16, text, sizeof text) == CUDA_SUCCESS);
        CHECK(std::memcmp(mapped.at(0) + 16, text, sizeof text) == 0); // the host bytes changed
        std::memcpy(read_only.at(0), text, sizeof text);
        CHECK(cu.memcpy_dtoh(back, device(read_only), sizeof back) == CUDA_SUCCESS);
        CHECK(std::memcmp(back, text, sizeof text) == 0);
        CHECK(cu.memcpy_htod(device(read_only), text, 1) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.memcpy_dtoh(back, device(bare), 1) == CUDA_ERROR_INVALID_VALUE); // no DEVICEMAP
        CHECK(cu.memcpy_dtoh(back, device(mapped) + page - 1, 2) == CUDA_ERROR_INVALID_VALUE);
        for (const Pages* p : {&mapped, &read_only, &bare})
            CHECK(cu.mem_host_unregister(p->at(0)) == CUDA_SUCCESS);
    }
    {
        CurrentContext context(fake, 1); // registers CPU-read-only pages without the flag
        REQUIRE(cu.mem_host_register(cpu_read_only.at(0), page, CU_MEMHOSTREGISTER_DEVICEMAP) ==
                CUDA_SUCCESS);
        CHECK(cu.memcpy_dtoh(back, device(cpu_read_only), 1) == CUDA_SUCCESS);
        CHECK(cu.memcpy_htod(device(cpu_read_only), text, 1) == CUDA_ERROR_INVALID_VALUE);
        CHECK(cu.mem_host_unregister(cpu_read_only.at(0)) == CUDA_SUCCESS);
    }
    check_nothing_live(fake);
}

TEST_CASE("fail_at makes the n-th call of each armed entry fail without effect", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(3);
    CHECK_THROWS_AS(fake.fail_at("cuMemHostRegister", 1, CUDA_ERROR_OUT_OF_MEMORY),
                    std::invalid_argument); // the unversioned name is not exported
    fake.fail_at("cuDevicePrimaryCtxRetain", 1, CUDA_ERROR_UNKNOWN);
    CUcontext context = nullptr;
    CHECK(cu.primary_ctx_retain(&context, 0) == CUDA_ERROR_UNKNOWN);
    CHECK(fake.primary_ctx_refcount(0) == 0);
    {
        CurrentContext current(fake, 0); // the injection was spent
        fake.fail_at("cuMemHostRegister_v2", 2, CUDA_ERROR_OUT_OF_MEMORY);
        fake.fail_at("cuMemHostUnregister", 1, CUDA_ERROR_UNKNOWN);
        fake.fail_at("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
        fake.fail_at("cuMemcpyHtoD_v2", 1, CUDA_ERROR_UNKNOWN);
        REQUIRE(cu.mem_host_register(pages.at(0), page, CU_MEMHOSTREGISTER_DEVICEMAP) ==
                CUDA_SUCCESS);
        CHECK(cu.mem_host_register(pages.at(1), page, 0) == CUDA_ERROR_OUT_OF_MEMORY);
        CHECK(fake.live_registrations() == 1);
        REQUIRE(cu.mem_host_register(pages.at(1), page, 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_ERROR_UNKNOWN);
        CHECK(fake.live_registrations() == 2);
        CUdeviceptr d = 0;
        CHECK(cu.mem_alloc(&d, 64) == CUDA_ERROR_OUT_OF_MEMORY);
        CHECK(fake.live_allocations() == 0);
        REQUIRE(cu.mem_alloc(&d, 64) == CUDA_SUCCESS);
        const char byte = 1;
        CHECK(cu.memcpy_htod(d, &byte, 1) == CUDA_ERROR_UNKNOWN);
        CHECK(fake.htod_bytes() == 0);
        CHECK(cu.memcpy_htod(d, &byte, 1) == CUDA_SUCCESS);
        fake.fail_at("cuMemFree_v2", 1, CUDA_ERROR_UNKNOWN);
        fake.fail_at("cuMemFree_v2", 0, CUDA_ERROR_UNKNOWN); // n = 0 disarms
        CHECK(cu.mem_free(d) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(1)) == CUDA_SUCCESS);
        CHECK(fake.calls("cuMemHostRegister_v2") == 3);
        CHECK(fake.calls("cuMemHostUnregister") == 3);
    }
    check_nothing_live(fake);
}

TEST_CASE("an armed call that fails its own checks spends the injection", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(1);
    {
        CurrentContext context(fake, 0);
        fake.fail_at("cuMemHostRegister_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
        CHECK(cu.mem_host_register(pages.at(0), 0, 0) == CUDA_ERROR_INVALID_VALUE);
        REQUIRE(cu.mem_host_register(pages.at(0), page, 0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_SUCCESS);
    }
    check_nothing_live(fake);
}

TEST_CASE("reset keeps what is live and zeroes the counters", "[cuda]") {
    FakeCuda& fake = initialised();
    const Api& cu = fake.api();
    Pages pages(1);
    {
        CurrentContext context(fake, 0);
        REQUIRE(cu.mem_host_register(pages.at(0), page, 0) == CUDA_SUCCESS);
        fake.reset();
        CHECK(fake.live_registrations() == 1);
        CHECK(fake.primary_ctx_refcount(0) == 1);
        CHECK(fake.context_depth() == 1);
        CHECK(fake.calls("cuMemHostRegister_v2") == 0);
        CHECK(fake.last_register_flags() == -1);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_ERROR_NOT_INITIALIZED); // forgot cuInit
        REQUIRE(cu.init(0) == CUDA_SUCCESS);
        CHECK(cu.mem_host_unregister(pages.at(0)) == CUDA_SUCCESS);
    }
    check_nothing_live(fake);
}

namespace {
// What one thread saw; checked on the main thread (Catch2's assertions are not thread-safe).
struct ThreadReport {
    CUresult first_error = CUDA_SUCCESS;
    CUdevice device = -1;
    int depth_inside = -1, depth_after = -1;
};

void note(ThreadReport& report, CUresult result) {
    if (report.first_error == CUDA_SUCCESS) report.first_error = result;
}

// Makes device `device` current on this thread and registers, maps, copies through and frees
// its own page and allocation many times over.
void use_device(const FakeCuda& fake, CUdevice device, std::byte* host, ThreadReport& report) {
    const Api& cu = fake.api();
    CUcontext context = nullptr;
    note(report, cu.primary_ctx_retain(&context, device));
    note(report, cu.ctx_push_current(context));
    report.depth_inside = fake.context_depth();
    note(report, cu.ctx_get_device(&report.device));
    for (int i = 0; i < 200; ++i) {
        CUdeviceptr mapped = 0, allocated = 0;
        const char byte = static_cast<char>(i);
        note(report, cu.mem_host_register(host, page, CU_MEMHOSTREGISTER_DEVICEMAP));
        note(report, cu.mem_host_get_device_pointer(&mapped, host, 0));
        note(report, cu.memcpy_htod(mapped, &byte, 1));
        note(report, cu.mem_host_unregister(host));
        note(report, cu.mem_alloc(&allocated, 256));
        note(report, cu.mem_free(allocated));
    }
    note(report, cu.ctx_pop_current(&context));
    note(report, cu.primary_ctx_release(device));
    report.depth_after = fake.context_depth();
}
} // namespace

TEST_CASE("each thread has its own context stack", "[cuda]") {
    FakeCuda& fake = initialised();
    fake.set_device_count(2);
    Pages pages(2);
    ThreadReport reports[2];
    {
        CurrentContext main_context(fake, 0);
        std::thread zero(use_device, std::cref(fake), 0, pages.at(0), std::ref(reports[0]));
        std::thread one(use_device, std::cref(fake), 1, pages.at(1), std::ref(reports[1]));
        zero.join();
        one.join();
        CHECK(fake.context_depth() == 1); // the threads' pushes and pops were theirs alone
    }
    for (CUdevice d = 0; d < 2; ++d) {
        INFO("thread on device " << d << ": " << error_name(fake, reports[d].first_error));
        CHECK(reports[d].first_error == CUDA_SUCCESS);
        CHECK(reports[d].device == d);
        CHECK(reports[d].depth_inside == 1);
        CHECK(reports[d].depth_after == 0);
    }
    check_nothing_live(fake);
}
