// SPDX-License-Identifier: MIT
// The method's name, compiled with or without the CUDA importer (wm-load prints it either way).
#include "weightmap/backends/cuda.hpp"

namespace wm {

const char* to_string(CudaImportMethod method) noexcept {
    switch (method) {
    case CudaImportMethod::direct: return "direct";
    case CudaImportMethod::register_host: return "register";
    case CudaImportMethod::unavailable: break;
    }
    return "unavailable";
}

} // namespace wm
