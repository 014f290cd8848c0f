// SPDX-License-Identifier: MIT
// Proves the fake driver's leak check bites: this program calls the fake directly, as an engine
// would - cuInit, retain and push device 0's primary context - registers one page and returns 0
// without unregistering or releasing. The fake's unload-time check must turn that into exit
// status 1; meson runs it with should_fail, so a silent leak check fails the suite. Every path
// that does not reach the leak returns 0 too, so it cannot pass by accident.
#include <cstdio>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda/cuda_driver.hpp"

using namespace wm::cuda;

template <class Fn>
Fn resolve(void* driver, const char* name) {
    return reinterpret_cast<Fn>(dlsym(driver, name));
}

int main() {
    void* driver = dlopen(WEIGHTMAP_FAKE_CUDA_PATH, RTLD_NOW | RTLD_LOCAL);
    if (driver == nullptr) {
        std::printf("the fake driver did not load (%s): nothing to leak\n", dlerror());
        return 0;
    }
    const auto init = resolve<PFN_cuInit>(driver, "cuInit");
    const auto retain = resolve<PFN_cuDevicePrimaryCtxRetain>(driver, "cuDevicePrimaryCtxRetain");
    const auto push = resolve<PFN_cuCtxPushCurrent>(driver, "cuCtxPushCurrent_v2");
    const auto host_register = resolve<PFN_cuMemHostRegister>(driver, "cuMemHostRegister_v2");
    if (init == nullptr || retain == nullptr || push == nullptr || host_register == nullptr) {
        std::puts("the fake driver lacks an entry point: nothing to leak");
        return 0;
    }
    CUcontext context = nullptr;
    if (init(0) != CUDA_SUCCESS || retain(&context, 0) != CUDA_SUCCESS ||
        push(context) != CUDA_SUCCESS) {
        std::puts("no current context: nothing to leak");
        return 0;
    }
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 0;
    const CUresult registered = host_register(p, page, CU_MEMHOSTREGISTER_DEVICEMAP);
    if (registered != CUDA_SUCCESS) {
        std::printf("registration failed with %d: nothing to leak\n", registered);
        return 0;
    }
    // Leaked on purpose: the registration and the retained context outlive everything.
    std::puts("leaked one registration; the fake must now fail the process at unload");
    return 0;
}
