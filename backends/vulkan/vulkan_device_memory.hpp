// SPDX-License-Identifier: MIT
// How a Vulkan device reaches imported host memory: from VkPhysicalDeviceType, and from the
// memory heaps where the type does not say.
#pragma once

#include <string>

#include <vulkan/vulkan_core.h>

#include "weightmap/import_policy.hpp"

namespace wm::vulkan {

struct DeviceMemoryVerdict {
    DeviceMemory memory = DeviceMemory::unknown;
    std::string note; ///< what it was read from, for ImporterCaps::device_memory_note
};

/// CPU and INTEGRATED_GPU: unified. DISCRETE_GPU: discrete, whatever its heaps (a resizable-BAR
/// card has host-visible device-local memory, yet an imported host range stays behind PCIe).
/// VIRTUAL_GPU and OTHER: unified only when every heap is device-local and some device-local
/// type is host-visible and coherent (the device has no memory apart from the host's); unknown
/// otherwise. Heaps alone cannot tell an APU (RADV: a device-local carve-out plus a GTT heap)
/// from a discrete card, so they never decide "discrete".
DeviceMemoryVerdict classify_device_memory(VkPhysicalDeviceType type,
                                           const VkPhysicalDeviceMemoryProperties& memory,
                                           const std::string& device_name);

} // namespace wm::vulkan
