// SPDX-License-Identifier: MIT
#include "cuda_driver.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include "internal/dl_resolve.hpp"

namespace wm::cuda {
namespace {

using internal::resolve_symbol;

// The exported names cuda.h maps each call to (#define cuMemHostRegister cuMemHostRegister_v2,
// ...): the unversioned ones are the pre-CUDA-3.2/6.5 ABI, kept only for old binaries.
bool resolve_all(void* h, Api& api, std::string& missing) {
    return resolve_symbol(h, "cuInit", api.init, missing) &&
           resolve_symbol(h, "cuDriverGetVersion", api.driver_get_version, missing) &&
           resolve_symbol(h, "cuGetErrorName", api.get_error_name, missing) &&
           resolve_symbol(h, "cuGetErrorString", api.get_error_string, missing) &&
           resolve_symbol(h, "cuDeviceGetCount", api.device_get_count, missing) &&
           resolve_symbol(h, "cuDeviceGet", api.device_get, missing) &&
           resolve_symbol(h, "cuDeviceGetName", api.device_get_name, missing) &&
           resolve_symbol(h, "cuDeviceGetAttribute", api.device_get_attribute, missing) &&
           resolve_symbol(h, "cuDevicePrimaryCtxRetain", api.primary_ctx_retain, missing) &&
           resolve_symbol(h, "cuDevicePrimaryCtxRelease_v2", api.primary_ctx_release, missing) &&
           resolve_symbol(h, "cuCtxPushCurrent_v2", api.ctx_push_current, missing) &&
           resolve_symbol(h, "cuCtxPopCurrent_v2", api.ctx_pop_current, missing) &&
           resolve_symbol(h, "cuCtxGetDevice", api.ctx_get_device, missing) &&
           resolve_symbol(h, "cuMemHostRegister_v2", api.mem_host_register, missing) &&
           resolve_symbol(h, "cuMemHostUnregister", api.mem_host_unregister, missing) &&
           resolve_symbol(h, "cuMemHostGetDevicePointer_v2", api.mem_host_get_device_pointer, missing) &&
           resolve_symbol(h, "cuMemAlloc_v2", api.mem_alloc, missing) &&
           resolve_symbol(h, "cuMemFree_v2", api.mem_free, missing) &&
           resolve_symbol(h, "cuMemcpyHtoD_v2", api.memcpy_htod, missing) &&
           resolve_symbol(h, "cuMemcpyDtoH_v2", api.memcpy_dtoh, missing) &&
           resolve_symbol(h, "cuMemcpyDtoD_v2", api.memcpy_dtod, missing) &&
           resolve_symbol(h, "cuMemcpy", api.memcpy_unified, missing);
}

} // namespace

Result<std::unique_ptr<Driver>> Driver::open(const std::string& path) {
    std::unique_ptr<Driver> driver(new Driver());
    driver->path_ = path;
    dlerror();
    // RTLD_LOCAL: the driver's symbols must not satisfy anyone else's lookups through us. If the
    // engine already loaded it, this returns the engine's instance (shared contexts).
    driver->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (driver->handle_ == nullptr) {
        const char* why = dlerror();
        return make_error(ErrorKind::unsupported,
                          fmt::format("cannot load the CUDA driver '{}': {}", path,
                                      why != nullptr ? why : "dlopen failed"));
    }
    std::string missing;
    if (!resolve_all(driver->handle_, driver->api_, missing))
        return make_error(ErrorKind::unsupported,
                          fmt::format("the CUDA driver '{}' lacks {}", path, missing));
    // Without a GPU the driver answers CUDA_ERROR_NO_DEVICE; without the kernel module,
    // CUDA_ERROR_INSUFFICIENT_DRIVER or a stub library's CUDA_ERROR_STUB_LIBRARY.
    const CUresult init = driver->api_.init(0);
    if (init != CUDA_SUCCESS)
        return make_error(ErrorKind::unsupported,
                          fmt::format("cuInit failed in '{}': {}", path, driver->describe(init)));
    if (driver->api_.driver_get_version(&driver->version_) != CUDA_SUCCESS) driver->version_ = 0;
    return driver;
}

Driver::~Driver() {
    if (handle_ != nullptr) dlclose(handle_);
}

std::string Driver::describe(CUresult result) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (api_.get_error_name == nullptr || api_.get_error_name(result, &name) != CUDA_SUCCESS ||
        name == nullptr)
        return fmt::format("CUresult {} (the driver has no name for it)", result);
    if (api_.get_error_string(result, &text) != CUDA_SUCCESS || text == nullptr)
        return fmt::format("{} ({})", name, result);
    return fmt::format("{} ({}): {}", name, result, text);
}

} // namespace wm::cuda
