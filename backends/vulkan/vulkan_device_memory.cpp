// SPDX-License-Identifier: MIT
#include "vulkan_device_memory.hpp"

#include <fmt/format.h>

namespace wm::vulkan {
namespace {

const char* type_name(VkPhysicalDeviceType type) {
    switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_OTHER: return "OTHER";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "INTEGRATED_GPU";
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "DISCRETE_GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "VIRTUAL_GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "unrecognised";
    }
}

// Every heap device-local, and a device-local type the host sees coherently: memory is shared.
bool heaps_are_host_memory(const VkPhysicalDeviceMemoryProperties& memory) {
    if (memory.memoryHeapCount == 0) return false;
    for (std::uint32_t h = 0; h < memory.memoryHeapCount && h < VK_MAX_MEMORY_HEAPS; ++h)
        if ((memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) == 0) return false;
    constexpr VkMemoryPropertyFlags shared = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT |
                                             VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                             VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    for (std::uint32_t t = 0; t < memory.memoryTypeCount && t < VK_MAX_MEMORY_TYPES; ++t)
        if ((memory.memoryTypes[t].propertyFlags & shared) == shared) return true;
    return false;
}

} // namespace

DeviceMemoryVerdict classify_device_memory(VkPhysicalDeviceType type,
                                           const VkPhysicalDeviceMemoryProperties& memory,
                                           const std::string& device_name) {
    const std::string seen =
        fmt::format("VkPhysicalDeviceType {} on '{}'", type_name(type), device_name);
    switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return {DeviceMemory::unified, seen};
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return {DeviceMemory::discrete, seen};
    default: break;
    }
    if (heaps_are_host_memory(memory))
        return {DeviceMemory::unified,
                seen + ", every heap device-local and host-coherent"};
    return {DeviceMemory::unknown, seen + ", heaps do not say"};
}

} // namespace wm::vulkan
