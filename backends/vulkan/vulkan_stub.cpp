// SPDX-License-Identifier: MIT
// Compiled instead of the Vulkan importer where it is not built (meson -Dvulkan=disabled, or no
// Vulkan loader package) but the Vulkan headers are there, which backends/vulkan.hpp includes:
// it still links, and its factories say why they cannot help.
#include "weightmap/backends/vulkan.hpp"

namespace wm {
namespace {

Error built_without_vulkan() {
    return make_error(ErrorKind::unsupported,
                      "unavailable: built without Vulkan support (meson -Dvulkan=enabled needs "
                      "libvulkan-dev)");
}

} // namespace

Result<std::unique_ptr<Importer>> make_vulkan_importer(const VulkanImporterParams&) {
    return built_without_vulkan();
}

Result<VulkanImporterFacts> vulkan_importer_facts(const Importer&) {
    return built_without_vulkan();
}

} // namespace wm
