// SPDX-License-Identifier: MIT
// The tests' handle on the fake CUDA driver (fake_cuda_driver.cpp): its control and observation
// functions, and its entry points for a test that calls the driver itself, as an engine would.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <dlfcn.h>

#include "cuda/cuda_driver.hpp"

#ifndef WEIGHTMAP_FAKE_CUDA_PATH
#error "tests/cuda/meson.build passes the fake driver's path as WEIGHTMAP_FAKE_CUDA_PATH"
#endif

namespace wm::test {

inline constexpr const char* fake_cuda_path = WEIGHTMAP_FAKE_CUDA_PATH;

/// Opens the fake (an importer's dlopen of the same path then shares this instance) and keeps it
/// open for the whole process, so its unload-time leak check runs at exit.
class FakeCuda {
public:
    /// The process's one handle, reset to the default configuration: call it at the start of
    /// every test case.
    static FakeCuda& fresh() {
        static FakeCuda fake;
        fake.reset();
        return fake;
    }

    FakeCuda() {
        handle_ = dlopen(fake_cuda_path, RTLD_NOW | RTLD_LOCAL);
        if (handle_ == nullptr) throw std::runtime_error(std::string("dlopen fake: ") + dlerror());
        bind(reset_, "fake_cuda_reset");
        bind(set_init_result_, "fake_cuda_set_init_result");
        bind(set_driver_version_, "fake_cuda_set_driver_version");
        bind(set_device_count_, "fake_cuda_set_device_count");
        bind(set_device_model_, "fake_cuda_set_device_model");
        bind(set_attribute_, "fake_cuda_set_attribute");
        bind(fail_at_, "fake_cuda_fail_at");
        bind(calls_, "fake_cuda_calls");
        bind(live_registrations_, "fake_cuda_live_registrations");
        bind(live_registered_bytes_, "fake_cuda_live_registered_bytes");
        bind(pinned_bytes_total_, "fake_cuda_pinned_bytes_total");
        bind(populated_bytes_total_, "fake_cuda_populated_bytes_total");
        bind(registration_flags_, "fake_cuda_registration_flags");
        bind(last_register_flags_, "fake_cuda_last_register_flags");
        bind(live_allocations_, "fake_cuda_live_allocations");
        bind(live_allocated_bytes_, "fake_cuda_live_allocated_bytes");
        bind(htod_bytes_, "fake_cuda_htod_bytes");
        bind(dtoh_bytes_, "fake_cuda_dtoh_bytes");
        bind(dtod_bytes_, "fake_cuda_dtod_bytes");
        bind(primary_ctx_refcount_, "fake_cuda_primary_ctx_refcount");
        bind(context_depth_, "fake_cuda_context_depth");
        bind(misuse_count_, "fake_cuda_misuse_count");
        bind(forgive_misuse_, "fake_cuda_forgive_misuse");
        bind(mapped_aperture_, "fake_cuda_mapped_aperture");
        bind(alloc_base_, "fake_cuda_alloc_base");
        bind(device_memory_, "fake_cuda_device_memory");
        bind_api();
    }
    // The handle is deliberately never closed (see above).
    FakeCuda(const FakeCuda&) = delete;
    FakeCuda& operator=(const FakeCuda&) = delete;

    /// What a device is: its name, attributes and registration answer (fake_cuda_driver.cpp's
    /// models, docs/cuda.md's table). The first three keep their older names as aliases.
    enum class Model {
        orin = 0,     ///< Jetson AGX Orin: integrated, registers (READ_ONLY)
        gh200 = 1,    ///< hardware coherent: direct
        h200 = 2,     ///< PCIe: discrete, registers (READ_ONLY)
        gb10 = 3,     ///< integrated, coherent (direct); registration refused 801
        b300 = 4,     ///< discrete, registers, no READ_ONLY
        tegra_x1 = 5, ///< Jetson Nano: no registration, no pageable access
        integrated = orin,
        coherent = gh200,
        discrete = h200,
    };

    /// One device, model orin, cuInit succeeds, version 12040, no injected failure, no
    /// overrides, counters zeroed, cuInit forgotten. Live state and misuse are kept.
    void reset() { reset_(); }
    void set_init_result(cuda::CUresult result) { set_init_result_(result); }
    void set_driver_version(int version) { set_driver_version_(version); }
    /// 0 to 8 devices.
    void set_device_count(int count) { check(set_device_count_(count) == 0, "device count"); }
    void set_device_model(int device, Model model) {
        check(set_device_model_(device, static_cast<int>(model)) == 0, "device model");
    }
    void set_attribute(int device, cuda::CUdevice_attribute attribute, int value) {
        check(set_attribute_(device, attribute, value) == 0, "attribute override");
    }
    /// The n-th call (1-based, from now) of exported entry `entry` returns `result` without
    /// changing anything, if it gets past the entry's own checks; n = 0 disarms.
    void fail_at(const char* entry, long n, cuda::CUresult result) {
        check(fail_at_(entry, n, result) == 0, entry);
    }
    /// Calls of exported entry `entry` since reset, whatever they returned.
    long calls(const char* entry) const {
        const long n = calls_(entry);
        check(n >= 0, entry);
        return n;
    }
    long live_registrations() const { return live_registrations_(); }
    std::uint64_t live_registered_bytes() const { return live_registered_bytes_(); }
    /// Bytes registrations page-locked since reset, and bytes they only populated (a device
    /// that reads pageable memory through the host's page tables: cuMemHostRegister's reference).
    std::uint64_t pinned_bytes_total() const { return pinned_bytes_total_(); }
    std::uint64_t populated_bytes_total() const { return populated_bytes_total_(); }
    /// Flags of the live registration that is exactly [host, host + size); -1: none is.
    long registration_flags(const void* host, std::uint64_t size) const {
        return registration_flags_(host, size);
    }
    /// Flags of the last cuMemHostRegister_v2 call made with a current context; -1: none.
    long last_register_flags() const { return last_register_flags_(); }
    long live_allocations() const { return live_allocations_(); }
    std::uint64_t live_allocated_bytes() const { return live_allocated_bytes_(); }
    std::uint64_t htod_bytes() const { return htod_bytes_(); }
    std::uint64_t dtoh_bytes() const { return dtoh_bytes_(); }
    std::uint64_t dtod_bytes() const { return dtod_bytes_(); }
    long primary_ctx_refcount(int device) const { return primary_ctx_refcount_(device); }
    /// Depth of the calling thread's context stack.
    int context_depth() const { return context_depth_(); }
    long misuse_count() const { return misuse_count_(); }
    /// Forgets misuse a test provoked on purpose, so the unload check does not fail for it.
    void forgive_misuse() { forgive_misuse_(); }
    std::uint64_t mapped_aperture() const { return mapped_aperture_(); }
    std::uint64_t alloc_base() const { return alloc_base_(); }
    std::uint64_t device_memory(int device) const { return device_memory_(device); }

    /// The fake's export `name` as an Fn; null when it has none by that name.
    template <class Fn>
    Fn entry(const char* name) const {
        return reinterpret_cast<Fn>(dlsym(handle_, name));
    }
    /// Every entry point, resolved by the versioned names, as the importer resolves them.
    const cuda::Api& api() const { return api_; }

private:
    template <class Fn>
    void bind(Fn& fn, const char* name) {
        fn = entry<Fn>(name);
        if (fn == nullptr) throw std::runtime_error(std::string("fake lacks ") + name);
    }
    void bind_api() {
        bind(api_.init, "cuInit");
        bind(api_.driver_get_version, "cuDriverGetVersion");
        bind(api_.get_error_name, "cuGetErrorName");
        bind(api_.get_error_string, "cuGetErrorString");
        bind(api_.device_get_count, "cuDeviceGetCount");
        bind(api_.device_get, "cuDeviceGet");
        bind(api_.device_get_name, "cuDeviceGetName");
        bind(api_.device_get_attribute, "cuDeviceGetAttribute");
        bind(api_.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
        bind(api_.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
        bind(api_.ctx_push_current, "cuCtxPushCurrent_v2");
        bind(api_.ctx_pop_current, "cuCtxPopCurrent_v2");
        bind(api_.ctx_get_device, "cuCtxGetDevice");
        bind(api_.mem_host_register, "cuMemHostRegister_v2");
        bind(api_.mem_host_unregister, "cuMemHostUnregister");
        bind(api_.mem_host_get_device_pointer, "cuMemHostGetDevicePointer_v2");
        bind(api_.mem_alloc, "cuMemAlloc_v2");
        bind(api_.mem_free, "cuMemFree_v2");
        bind(api_.memcpy_htod, "cuMemcpyHtoD_v2");
        bind(api_.memcpy_dtoh, "cuMemcpyDtoH_v2");
        bind(api_.memcpy_dtod, "cuMemcpyDtoD_v2");
        bind(api_.memcpy_unified, "cuMemcpy");
    }
    // A control call's -1 is the test's mistake (a bad device, attribute or entry name).
    static void check(bool ok, const std::string& what) {
        if (!ok) throw std::invalid_argument("fake CUDA driver refused " + what);
    }

    void* handle_ = nullptr;
    cuda::Api api_;
    void (*reset_)() = nullptr;
    void (*set_init_result_)(int) = nullptr;
    void (*set_driver_version_)(int) = nullptr;
    int (*set_device_count_)(int) = nullptr;
    int (*set_device_model_)(int, int) = nullptr;
    int (*set_attribute_)(int, int, int) = nullptr;
    int (*fail_at_)(const char*, long, int) = nullptr;
    long (*calls_)(const char*) = nullptr;
    long (*live_registrations_)() = nullptr;
    std::uint64_t (*live_registered_bytes_)() = nullptr;
    std::uint64_t (*pinned_bytes_total_)() = nullptr;
    std::uint64_t (*populated_bytes_total_)() = nullptr;
    long (*registration_flags_)(const void*, std::uint64_t) = nullptr;
    long (*last_register_flags_)() = nullptr;
    long (*live_allocations_)() = nullptr;
    std::uint64_t (*live_allocated_bytes_)() = nullptr;
    std::uint64_t (*htod_bytes_)() = nullptr;
    std::uint64_t (*dtoh_bytes_)() = nullptr;
    std::uint64_t (*dtod_bytes_)() = nullptr;
    long (*primary_ctx_refcount_)(int) = nullptr;
    int (*context_depth_)() = nullptr;
    long (*misuse_count_)() = nullptr;
    void (*forgive_misuse_)() = nullptr;
    std::uint64_t (*mapped_aperture_)() = nullptr;
    std::uint64_t (*alloc_base_)() = nullptr;
    std::uint64_t (*device_memory_)(int) = nullptr;
};

} // namespace wm::test
