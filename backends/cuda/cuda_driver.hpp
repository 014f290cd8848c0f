// SPDX-License-Identifier: MIT
// The part of the CUDA Driver API the importer uses, declared here so that no CUDA toolkit is
// needed to build: types, constants and entry-point signatures as NVIDIA's Driver API reference
// and cuda.h define them (docs/cuda.md cites each), and the driver as the importer uses it:
// dlopened, its entry points resolved by the versioned names cuda.h maps to, cuInit called.
// Private to backends/cuda; the fake driver in tests/cuda/ includes it too, so a signature used
// by both cannot drift between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "weightmap/result.hpp"

namespace wm::cuda {

// --- types (cuda.h) ---------------------------------------------------------------------------
using CUresult = int;                    // enum cudaError_enum
using CUdevice = int;                    // CUdevice_v1
using CUdeviceptr = unsigned long long;  // CUdeviceptr_v2 on LP64
using CUcontext = struct CUctx_st*;
using CUdevice_attribute = int;          // enum CUdevice_attribute_enum

// --- results (enum cudaError_enum) ------------------------------------------------------------
constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_INSUFFICIENT_DRIVER = 35;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712;
constexpr CUresult CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713;
constexpr CUresult CUDA_ERROR_NOT_PERMITTED = 800;
constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

// --- device attributes (enum CUdevice_attribute_enum) -----------------------------------------
/// The device is integrated with the host memory system (Jetson, GB10).
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_INTEGRATED = 18;
/// The device can map host memory into its address space (DEVICEMAP).
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19;
/// The device shares a unified address space with the host.
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41;
/// "Device supports coherently accessing pageable memory without calling cudaHostRegister on it"
/// (HMM or ATS): a kernel may dereference a pointer into a plain mapping.
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS = 88;
/// The device can use the host pointer of registered memory as its own address.
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91;
/// cuMemHostRegister is supported at all.
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99;
/// The device reads pageable memory through the host's page tables (GH200's ATS over
/// NVLink-C2C): it reaches host memory coherently.
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 100;
/// cuMemHostRegister takes CU_MEMHOSTREGISTER_READ_ONLY.
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113;

// --- cuMemHostRegister flags ------------------------------------------------------------------
constexpr unsigned CU_MEMHOSTREGISTER_PORTABLE = 0x01;
constexpr unsigned CU_MEMHOSTREGISTER_DEVICEMAP = 0x02;
constexpr unsigned CU_MEMHOSTREGISTER_IOMEMORY = 0x04;
/// The device treats the memory as read-only; required to register memory the CPU maps
/// read-only on platforms without PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, and refused with
/// CUDA_ERROR_NOT_SUPPORTED where READ_ONLY_HOST_REGISTER_SUPPORTED is not set.
constexpr unsigned CU_MEMHOSTREGISTER_READ_ONLY = 0x08;

// --- entry points, by the exported (versioned) symbol cuda.h maps each name to -----------------
extern "C" {
using PFN_cuInit = CUresult (*)(unsigned int flags);
using PFN_cuDriverGetVersion = CUresult (*)(int* driver_version);
using PFN_cuGetErrorName = CUresult (*)(CUresult error, const char** name);
using PFN_cuGetErrorString = CUresult (*)(CUresult error, const char** text);
using PFN_cuDeviceGetCount = CUresult (*)(int* count);
using PFN_cuDeviceGet = CUresult (*)(CUdevice* device, int ordinal);
using PFN_cuDeviceGetName = CUresult (*)(char* name, int length, CUdevice device);
using PFN_cuDeviceGetAttribute = CUresult (*)(int* value, CUdevice_attribute attribute,
                                              CUdevice device);
using PFN_cuDevicePrimaryCtxRetain = CUresult (*)(CUcontext* context, CUdevice device);
using PFN_cuDevicePrimaryCtxRelease = CUresult (*)(CUdevice device);  // _v2
using PFN_cuCtxPushCurrent = CUresult (*)(CUcontext context);         // _v2
using PFN_cuCtxPopCurrent = CUresult (*)(CUcontext* context);         // _v2
using PFN_cuCtxGetDevice = CUresult (*)(CUdevice* device);
using PFN_cuMemHostRegister = CUresult (*)(void* p, std::size_t size, unsigned int flags); // _v2
using PFN_cuMemHostUnregister = CUresult (*)(void* p);
using PFN_cuMemHostGetDevicePointer = CUresult (*)(CUdeviceptr* device_pointer, void* p,
                                                   unsigned int flags); // _v2
using PFN_cuMemAlloc = CUresult (*)(CUdeviceptr* device_pointer, std::size_t size); // _v2
using PFN_cuMemFree = CUresult (*)(CUdeviceptr device_pointer);                     // _v2
using PFN_cuMemcpyHtoD = CUresult (*)(CUdeviceptr dst, const void* src, std::size_t size); // _v2
using PFN_cuMemcpyDtoH = CUresult (*)(void* dst, CUdeviceptr src, std::size_t size);       // _v2
using PFN_cuMemcpyDtoD = CUresult (*)(CUdeviceptr dst, CUdeviceptr src, std::size_t size); // _v2
using PFN_cuMemcpy = CUresult (*)(CUdeviceptr dst, CUdeviceptr src, std::size_t size);
}

/// The entry points and the symbol each is resolved from.
struct Api {
    PFN_cuInit init = nullptr;                                   // cuInit
    PFN_cuDriverGetVersion driver_get_version = nullptr;         // cuDriverGetVersion
    PFN_cuGetErrorName get_error_name = nullptr;                 // cuGetErrorName
    PFN_cuGetErrorString get_error_string = nullptr;             // cuGetErrorString
    PFN_cuDeviceGetCount device_get_count = nullptr;             // cuDeviceGetCount
    PFN_cuDeviceGet device_get = nullptr;                        // cuDeviceGet
    PFN_cuDeviceGetName device_get_name = nullptr;               // cuDeviceGetName
    PFN_cuDeviceGetAttribute device_get_attribute = nullptr;     // cuDeviceGetAttribute
    PFN_cuDevicePrimaryCtxRetain primary_ctx_retain = nullptr;   // cuDevicePrimaryCtxRetain
    PFN_cuDevicePrimaryCtxRelease primary_ctx_release = nullptr; // cuDevicePrimaryCtxRelease_v2
    PFN_cuCtxPushCurrent ctx_push_current = nullptr;             // cuCtxPushCurrent_v2
    PFN_cuCtxPopCurrent ctx_pop_current = nullptr;               // cuCtxPopCurrent_v2
    PFN_cuCtxGetDevice ctx_get_device = nullptr;                 // cuCtxGetDevice
    PFN_cuMemHostRegister mem_host_register = nullptr;           // cuMemHostRegister_v2
    PFN_cuMemHostUnregister mem_host_unregister = nullptr;       // cuMemHostUnregister
    PFN_cuMemHostGetDevicePointer mem_host_get_device_pointer = nullptr; // ..._v2
    PFN_cuMemAlloc mem_alloc = nullptr;                          // cuMemAlloc_v2
    PFN_cuMemFree mem_free = nullptr;                            // cuMemFree_v2
    PFN_cuMemcpyHtoD memcpy_htod = nullptr;                      // cuMemcpyHtoD_v2
    PFN_cuMemcpyDtoH memcpy_dtoh = nullptr;                      // cuMemcpyDtoH_v2
    PFN_cuMemcpyDtoD memcpy_dtod = nullptr;                      // cuMemcpyDtoD_v2
    PFN_cuMemcpy memcpy_unified = nullptr;                       // cuMemcpy (kind from UVA)
};

/// One loaded driver with cuInit done. Destruction dlcloses it (the driver has no counterpart
/// of cuInit to undo). The Api may be used from any thread.
class Driver {
public:
    /// dlopens `path`, resolves every entry point and calls cuInit(0). The error (kind
    /// `unsupported`) is the reason the importer gives for being unavailable: dlerror(), the
    /// missing symbol, or cuInit's error name and string. Nothing stays loaded on failure.
    static Result<std::unique_ptr<Driver>> open(const std::string& path);
    ~Driver();
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;

    const Api& api() const noexcept { return api_; }
    const std::string& path() const noexcept { return path_; }
    /// cuDriverGetVersion, e.g. 12040 for CUDA 12.4; 0 when the query failed.
    int version() const noexcept { return version_; }

    /// "CUDA_ERROR_INVALID_VALUE (1): invalid argument" - the driver's own name and string, or
    /// the number when the driver has none for it.
    std::string describe(CUresult result) const;

private:
    Driver() = default;
    void* handle_ = nullptr;
    std::string path_;
    int version_ = 0;
    Api api_;
};

} // namespace wm::cuda
