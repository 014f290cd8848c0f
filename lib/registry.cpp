// SPDX-License-Identifier: MIT
// The importer table. The only place in the library where build options select code (#if).
#include "weightmap/registry.hpp"

#include <string>

#include <fmt/format.h>

#include "backend_factories.hpp"
#include "weightmap_config.h"

namespace wm {
namespace {

std::unique_ptr<Importer> create_cpu() { return make_cpu_importer(); }

// Sized by its rows: adding an importer is its row here, its folder and its build option; every
// list of names (create_importer's message, wm-load's --importer) is read from this table.
const ImporterEntry table[] = {
    // Never asked up front: HSA maps read-only first and goes writable only after its runtime
    // refused a read-only lock (load_model's retry), so decide_mapping need not load a runtime.
#if WEIGHTMAP_HAVE_HSA
    {"hsa", true, {}, false, &create_default_hsa_importer},
#else
    {"hsa", false, "built without the HSA importer (meson -Dhsa=enabled needs libhsa-runtime-dev)",
     false, nullptr},
#endif
#if WEIGHTMAP_HAVE_CUDA
    // May: it asks for a writable mapping only where the device lacks read-only registration.
    {"cuda", true, {}, true, &create_default_cuda_importer},
#else
    {"cuda", false, "built without the CUDA importer (meson -Dcuda=disabled)", true, nullptr},
#endif
#if WEIGHTMAP_HAVE_VULKAN
    {"vulkan", true, {}, false, &create_default_vulkan_importer},
#else
    {"vulkan", false, "built without the Vulkan importer (meson -Dvulkan=enabled needs "
                      "libvulkan-dev)", false, nullptr},
#endif
    {"cpu", true, {}, false, &create_cpu},
};

// "hsa, cuda, vulkan, cpu, auto": every name create_importer accepts.
std::string known_names() {
    std::string names;
    for (const ImporterEntry& entry : table) names += fmt::format("{}, ", entry.name);
    return names + "auto";
}

} // namespace

Span<const ImporterEntry> importer_registry() noexcept { return table; }

Result<std::unique_ptr<Importer>> create_importer(std::string_view name) {
    std::string refusals;
    for (const ImporterEntry& entry : table) {
        if (name != "auto" && entry.name != name) continue;
        if (!entry.built) {
            if (name != "auto")
                return make_error(ErrorKind::unsupported,
                                  fmt::format("importer '{}': {}", entry.name, entry.build_note));
            continue;
        }
        std::unique_ptr<Importer> importer = entry.create_default();
        Availability availability = importer->available();
        if (availability.available) return importer;
        if (name != "auto")
            return make_error(ErrorKind::unsupported,
                              fmt::format("importer '{}' is not available: {}", entry.name,
                                          availability.reason));
        refusals += fmt::format("{}{}: {}", refusals.empty() ? "" : "; ", entry.name,
                                availability.reason);
    }
    if (name == "auto")
        return make_error(ErrorKind::unsupported,
                          fmt::format("no importer is available ({})", refusals));
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("unknown importer '{}' (known: {})", name, known_names()));
}

} // namespace wm
