// SPDX-License-Identifier: MIT
// backends/vulkan.hpp - the Vulkan importer: VK_EXT_external_memory_host on the engine's device.
//
// The engine owns Vulkan. It hands the importer its instance, physical device, device and the
// two vkGet*ProcAddr entry points; the importer resolves every function it calls through them,
// so libweightmap compiles against the Vulkan headers only and never links the loader. Each
// import is one VkDeviceMemory allocated with VkImportMemoryHostPointerInfoEXT
// (HOST_ALLOCATION handle type) over a range of the weight file's mapping, and optionally one
// VkBuffer bound to it with the usage the engine asks for.
//
// This is the only public header that includes a Vulkan header, so including it needs the Vulkan
// headers (vulkan/vulkan_core.h, libvulkan-dev), in the engine as in libweightmap. A build
// without the Vulkan importer (meson -Dvulkan=disabled, or no Vulkan loader package) that had the
// headers defines make_vulkan_importer() and vulkan_importer_facts() to return
// ErrorKind::unsupported, "unavailable: built without Vulkan support (...)"; a build without the
// headers defines neither (registry.hpp's importer_registry() says whether it is built).
//
// What the importer enforces itself, because drivers do not all do it (lavapipe accepts what the
// specification forbids; docs/vulkan.md, "What the importer enforces itself" and "Drivers"):
//   * the start and the size of every import are multiples of
//     max(minImportedHostPointerAlignment, page size) - anything else is refused before any
//     Vulkan call is made;
//   * no import is larger than maxMemoryAllocationSize, nor (when a storage buffer is asked for)
//     maxStorageBufferRange, nor (when a buffer is asked for and the device says) maxBufferSize;
//   * every VkResult other than VK_SUCCESS becomes the import's error, with the result's name,
//     and nothing stays allocated; after VK_ERROR_DEVICE_LOST the importer reports itself
//     unavailable and makes no further driver calls for imports;
//   * whether the driver imports file-backed pages at all: a one-page memfd probe when the
//     importer is made. Where it refuses them (RADV), caps().refuses_file_pages is set with the
//     driver and the VkResult in notes().file_pages, and every region falls back with that reason.
// caps().needs_writable_mapping is false: a writable mapping would let a stray device write reach
// the model file, and the one driver known to pin host pointers for write refuses file pages.
//
// Imported memory is the file's page cache seen by the device: engines must treat it as
// read-only. A device write into an import of a PROT_READ mapping is undefined (lavapipe: the
// process dies with SIGSEGV; a real GPU: an IOMMU fault), and into a writable mapping it would
// modify the model file.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include <vulkan/vulkan_core.h>

#include "weightmap/export.h"
#include "weightmap/importer.hpp"
#include "weightmap/log.hpp"
#include "weightmap/result.hpp"

namespace wm {

/// Everything make_vulkan_importer() needs from the engine. The importer borrows every handle:
/// the engine keeps them alive (and does not destroy the device) until the importer is destroyed.
struct VulkanImporterParams {
    /// The engine's instance. Required. Must be Vulkan 1.1 or have
    /// VK_KHR_get_physical_device_properties2 enabled: minImportedHostPointerAlignment can only
    /// be queried through vkGetPhysicalDeviceProperties2.
    VkInstance instance = VK_NULL_HANDLE;
    /// The physical device `device` was created on. Required; Vulkan 1.1 or newer
    /// (VK_EXT_external_memory_host depends on external memory, core in 1.1).
    VkPhysicalDevice physical_device = VK_NULL_HANDLE;
    /// The engine's logical device. Required.
    VkDevice device = VK_NULL_HANDLE;
    /// The loader's (or a layer's) vkGetInstanceProcAddr. Required: used for the
    /// physical-device queries.
    PFN_vkGetInstanceProcAddr get_instance_proc_addr = nullptr;
    /// vkGetDeviceProcAddr for `device`. Optional: null means "ask get_instance_proc_addr for
    /// it". Every device-level function the importer calls is resolved through it, which is also
    /// how an engine (or a test) interposes its own wrappers.
    PFN_vkGetDeviceProcAddr get_device_proc_addr = nullptr;
    /// True only if the engine listed "VK_EXT_external_memory_host" in
    /// VkDeviceCreateInfo::ppEnabledExtensionNames. Vulkan has no query for the extensions a
    /// device was created with, so the engine must say. When false the importer is created but
    /// available() is false with the reason.
    bool external_memory_host_enabled = false;

    /// Queue family of `queue`: one with GRAPHICS, COMPUTE or TRANSFER (all of them support
    /// transfers). Required with `queue`; VK_QUEUE_FAMILY_IGNORED otherwise.
    std::uint32_t queue_family_index = VK_QUEUE_FAMILY_IGNORED;
    /// A queue of `queue_family_index` for the importer's own transfers. Optional: without it
    /// read_back() and allocate_copy() return `unsupported`; import() and release() never submit
    /// anything and do not need it.
    VkQueue queue = VK_NULL_HANDLE;
    /// The mutex the engine holds while it submits to `queue` from other threads (Vulkan requires
    /// external synchronisation of vkQueueSubmit). The importer locks it around each of its own
    /// vkQueueSubmit calls only, so the engine must not call read_back() or allocate_copy() while
    /// holding it. Optional: null when the engine never submits to `queue` concurrently with the
    /// importer; the importer serialises its own submissions either way. Borrowed; must outlive
    /// the importer.
    std::mutex* queue_mutex = nullptr;

    /// Memory type preference for imports and device copies: the first type offered by
    /// vkGetMemoryHostPointerPropertiesEXT (and the buffer's requirements) whose property flags
    /// contain all of these; else the first offered HOST_VISIBLE type; else the first offered
    /// type. 0 means "no preference" (the first offered type).
    VkMemoryPropertyFlags preferred_memory_flags = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    /// Usage of the VkBuffer created over each import (with VkExternalMemoryBufferCreateInfo for
    /// the HOST_ALLOCATION handle type) and bound at offset 0. 0: no buffer is created and
    /// ImportedBuffer::native_buffer is 0. With VK_BUFFER_USAGE_STORAGE_BUFFER_BIT the largest
    /// import is also bounded by maxStorageBufferRange, because an engine binds a weight buffer
    /// as one storage descriptor.
    VkBufferUsageFlags buffer_usage = 0;

    /// Where warnings go (e.g. buffers still imported when the importer is destroyed).
    /// Empty: the process-wide default of log.hpp.
    LogCallback log;
};

/// Creates a Vulkan importer over the engine's device.
///
/// Fails (invalid_argument) only when a required handle or entry point is null, or `queue` is
/// set without its `queue_family_index`. Everything the
/// device lacks - the extension, Vulkan 1.1, an entry point - still yields an importer, whose
/// available() is false with the reason and whose import() returns `unsupported`; so an engine can
/// always hand it to execute_plan() and get fallbacks with reasons.
///
/// Thread-safety of the importer: import(), release(), read_back(), allocate_copy() and
/// free_copy() may be called concurrently from any threads. It frees any buffer still imported
/// when it is destroyed (with a warning), so the device must outlive it.
WM_API Result<std::unique_ptr<Importer>> make_vulkan_importer(const VulkanImporterParams& params);

/// What a Vulkan importer read from its device, for reports and for engines that size their own
/// buffers the same way. Plain data.
struct VulkanImporterFacts {
    std::string device_name;                           ///< VkPhysicalDeviceProperties::deviceName
    std::uint32_t api_version = 0;                     ///< of the physical device
    /// VkPhysicalDeviceProperties::deviceType: with the heaps, what caps().device_memory is
    /// read from (CPU and INTEGRATED_GPU unified, DISCRETE_GPU discrete).
    VkPhysicalDeviceType device_type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
    VkDriverId driver_id = static_cast<VkDriverId>(0); ///< 0 when the device cannot say
    /// VkPhysicalDeviceExternalMemoryHostPropertiesEXT; 0 when the device lacks the extension.
    /// caps().alignment is the larger of this and the page size.
    std::uint64_t min_imported_host_pointer_alignment = 0;
    std::uint64_t max_memory_allocation_size = 0; ///< VkPhysicalDeviceMaintenance3Properties
    std::uint64_t max_storage_buffer_range = 0;   ///< VkPhysicalDeviceLimits
    std::uint64_t max_buffer_size = 0;            ///< maintenance4; 0 when not reported
    /// vkGetPhysicalDeviceMemoryProperties: the flags of each memory type and its heap's size.
    std::uint32_t memory_type_count = 0;
    VkMemoryPropertyFlags memory_type_flags[VK_MAX_MEMORY_TYPES] = {};
    std::uint64_t memory_type_heap_size[VK_MAX_MEMORY_TYPES] = {};
    /// memoryTypeBits that vkGetMemoryHostPointerPropertiesEXT reported for the last import
    /// (0 before the first one).
    std::uint32_t last_host_pointer_memory_type_bits = 0;
};

/// The facts of `importer` when it is a Vulkan importer (make_vulkan_importer() or the
/// registry's default one) that got as far as reading its device; otherwise unsupported with the
/// reason. Thread-safe.
WM_API Result<VulkanImporterFacts> vulkan_importer_facts(const Importer& importer);

namespace detail {
template <class Handle>
Handle vulkan_handle_from_u64(std::uint64_t value) noexcept {
    if constexpr (std::is_pointer_v<Handle>)
        return reinterpret_cast<Handle>(static_cast<std::uintptr_t>(value));
    else
        return static_cast<Handle>(value);
}
} // namespace detail

/// The VkDeviceMemory of a buffer returned by a Vulkan importer's import() or allocate_copy().
/// Borrowed: valid until the buffer is released / freed.
inline VkDeviceMemory vulkan_memory(const ImportedBuffer& buffer) noexcept {
    return detail::vulkan_handle_from_u64<VkDeviceMemory>(buffer.native_memory);
}

/// The VkBuffer bound at offset 0 of that memory, or VK_NULL_HANDLE when the importer was made
/// with buffer_usage 0. Borrowed, like vulkan_memory().
inline VkBuffer vulkan_buffer(const ImportedBuffer& buffer) noexcept {
    return detail::vulkan_handle_from_u64<VkBuffer>(buffer.native_buffer);
}

} // namespace wm
