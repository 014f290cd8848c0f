// SPDX-License-Identifier: MIT
// Compiled instead of the HSA importer where it is not built (meson -Dhsa=disabled, or no HSA
// headers): backends/hsa.hpp still links, and its factories say why they cannot help.
#include "weightmap/backends/hsa.hpp"

namespace wm {
namespace {

Error built_without_hsa() {
    return make_error(ErrorKind::unsupported,
                      "unavailable: built without HSA support (meson -Dhsa=enabled needs "
                      "libhsa-runtime-dev)");
}

} // namespace

Result<std::unique_ptr<Importer>> make_hsa_importer(const HsaImporterParams&) {
    return built_without_hsa();
}

Result<HsaLockedRange> hsa_lock_superset(Importer&, const void*, std::uint64_t) {
    return built_without_hsa();
}

Result<std::uint32_t> hsa_lock_agent_count(const Importer&) {
    return built_without_hsa();
}

} // namespace wm
