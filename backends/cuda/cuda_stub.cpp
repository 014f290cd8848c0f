// SPDX-License-Identifier: MIT
// Compiled instead of the CUDA importer where it is not built (meson -Dcuda=disabled):
// backends/cuda.hpp still links, and its factories say why they cannot help.
#include "weightmap/backends/cuda.hpp"

namespace wm {
namespace {

Error built_without_cuda() {
    return make_error(ErrorKind::unsupported,
                      "unavailable: built without CUDA support (meson -Dcuda=disabled)");
}

} // namespace

Result<CudaImporterState> cuda_importer_state(const Importer&) {
    return built_without_cuda();
}

Result<std::unique_ptr<Importer>> make_cuda_importer(const CudaImporterParams&) {
    return built_without_cuda();
}

Result<CudaPinReport> cuda_pin_fallbacks(Importer&, Placement&, const ModelDesc&,
                                         Span<const MappedFile>, std::uint32_t) {
    return built_without_cuda();
}

} // namespace wm
