// SPDX-License-Identifier: MIT
// The Vulkan importer's class, shared by the engine-owned (make_vulkan_importer) and the
// self-owned (create_default_vulkan_importer) variants. Private to the library.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <vulkan/vulkan_core.h>

#include "vulkan_device_memory.hpp"

#include "weightmap/backends/vulkan.hpp"
#include "internal/undo.hpp"
#include "weightmap/importer.hpp"

namespace wm::vulkan {

template <class Handle>
std::uint64_t handle_to_u64(Handle handle) noexcept {
    if constexpr (std::is_pointer_v<Handle>)
        return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle));
    else
        return static_cast<std::uint64_t>(handle);
}

using internal::Undo; // runs a release on scope exit unless dismissed

/// Device-level entry points, all resolved through the engine's vkGetDeviceProcAddr.
struct DeviceFns {
    PFN_vkGetMemoryHostPointerPropertiesEXT get_memory_host_pointer_properties = nullptr;
    PFN_vkAllocateMemory allocate_memory = nullptr;
    PFN_vkFreeMemory free_memory = nullptr;
    PFN_vkMapMemory map_memory = nullptr;
    PFN_vkUnmapMemory unmap_memory = nullptr;
    PFN_vkFlushMappedMemoryRanges flush_mapped_memory_ranges = nullptr;
    PFN_vkInvalidateMappedMemoryRanges invalidate_mapped_memory_ranges = nullptr;
    PFN_vkCreateBuffer create_buffer = nullptr;
    PFN_vkDestroyBuffer destroy_buffer = nullptr;
    PFN_vkGetBufferMemoryRequirements get_buffer_memory_requirements = nullptr;
    PFN_vkBindBufferMemory bind_buffer_memory = nullptr;
    PFN_vkCreateCommandPool create_command_pool = nullptr;
    PFN_vkDestroyCommandPool destroy_command_pool = nullptr;
    PFN_vkAllocateCommandBuffers allocate_command_buffers = nullptr;
    PFN_vkResetCommandBuffer reset_command_buffer = nullptr;
    PFN_vkBeginCommandBuffer begin_command_buffer = nullptr;
    PFN_vkEndCommandBuffer end_command_buffer = nullptr;
    PFN_vkCmdCopyBuffer cmd_copy_buffer = nullptr;
    PFN_vkQueueSubmit queue_submit = nullptr;
    PFN_vkCreateFence create_fence = nullptr;
    PFN_vkDestroyFence destroy_fence = nullptr;
    PFN_vkResetFences reset_fences = nullptr;
    PFN_vkWaitForFences wait_for_fences = nullptr;
};

/// The physical-device queries init() makes, resolved through the engine's vkGetInstanceProcAddr.
struct InstanceFns {
    PFN_vkGetPhysicalDeviceProperties get_properties = nullptr;
    PFN_vkGetPhysicalDeviceMemoryProperties get_memory_properties = nullptr;
    PFN_vkEnumerateDeviceExtensionProperties enumerate_extensions = nullptr;
    PFN_vkGetPhysicalDeviceProperties2 get_properties2 = nullptr; // or its KHR alias
};

/// What the physical device offers that init() chains into vkGetPhysicalDeviceProperties2.
struct DeviceExtensions {
    bool external_memory_host = false;
    bool driver_properties = false; // Vulkan 1.2 or VK_KHR_driver_properties
    bool maintenance4 = false;      // Vulkan 1.3 or VK_KHR_maintenance4
};

/// Vulkan objects a self-owned importer destroys after everything it made (declared first in
/// VulkanImporter, so it is destroyed last).
class OwnedVulkan {
public:
    virtual ~OwnedVulkan() = default;
};

class VulkanImporter final : public Importer {
public:
    /// An importer that was never able to reach a device: available() is false with `reason`.
    explicit VulkanImporter(std::string unavailable_reason);
    /// Over the engine's (or `owned`'s) device. Required handles are checked by the caller.
    VulkanImporter(const VulkanImporterParams& params, std::unique_ptr<OwnedVulkan> owned);
    ~VulkanImporter() override;
    VulkanImporter(const VulkanImporter&) = delete;
    VulkanImporter& operator=(const VulkanImporter&) = delete;

    std::string_view name() const noexcept override { return "vulkan"; }
    ImporterCaps caps() const noexcept override;
    ImporterNotes notes() const noexcept override;
    Availability available() const override;
    Status release_checked(const ImportedBuffer& buffer) noexcept override;
    Status read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                             std::uint64_t size, void* dst) override;
    Result<ImportedBuffer> allocate_copy(const void* src, std::uint64_t size) override;
    Status free_copy(const ImportedBuffer& buffer) noexcept override;

    Result<VulkanImporterFacts> facts() const;

protected:
    Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) override;

private:
    // What the importer made: keyed by the VkDeviceMemory handle.
    struct Record {
        VkBuffer buffer = VK_NULL_HANDLE;
        std::uint64_t size = 0;
        std::uint32_t memory_type = 0;
        bool imported = true;
        bool buffer_is_transfer_source = false;
    };
    // One staging buffer, host-visible and mapped.
    struct Staging {
        VkBuffer buffer = VK_NULL_HANDLE;
        VkDeviceMemory memory = VK_NULL_HANDLE;
        void* mapped = nullptr;
        std::uint64_t size = 0;
        bool coherent = false;
    };

    // init(): each step returns why the importer is unavailable, or an empty string.
    void init(const VulkanImporterParams& params);
    std::string initialise(const VulkanImporterParams& params);
    std::string resolve_instance_fns(InstanceFns& fns);
    std::string read_properties(const InstanceFns& fns);
    std::string read_extensions(const InstanceFns& fns, DeviceExtensions& extensions);
    void read_properties2(const InstanceFns& fns, const DeviceExtensions& extensions);
    std::string check_host_import(const VulkanImporterParams& params,
                                  const DeviceExtensions& extensions);
    std::string resolve_device_fns();
    std::string set_import_limit();

    // The file-page probe (vulkan_probe.cpp): imports one page of a memfd mapping at
    // availability and records in refuses_file_pages_ / file_pages_note_ whether the driver
    // takes file-backed pages.
    void probe_file_pages();
    // Imports, then frees, the probe's page; empty when the driver took it, else what failed.
    std::string import_probe_page(void* page);
    // "radv (VK_DRIVER_ID_MESA_RADV) on '<device>'", or "'<device>'" without driver properties.
    std::string driver_label() const;
    // import()'s early refusal of a file-backed range when the probe found the driver refuses
    // file pages: no driver call is made for it.
    Status check_file_pages(const void* host_address, std::uint64_t size) const;

    Status check_usable(std::string_view what) const;
    // Turns a failed VkResult into an Error naming the call, and remembers a lost device.
    Error vk_error(VkResult result, std::string_view call, std::string_view detail);
    int choose_memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags preferred) const;
    Result<VkBuffer> create_buffer(std::uint64_t size, VkBufferUsageFlags usage, bool external,
                                   VkMemoryRequirements& requirements, std::string_view what);
    // import(): the VkBuffer over an import (narrowing `type_bits` to what it allows), and the
    // imported VkDeviceMemory.
    Result<VkBuffer> create_import_buffer(std::uint64_t size, const std::string& where,
                                          std::uint32_t& type_bits);
    Result<VkDeviceMemory> import_memory(void* host_address, std::uint64_t size,
                                         std::uint32_t type, const std::string& where);
    // Records a buffer made by import() or allocate_copy() and describes it to the caller.
    ImportedBuffer remember(VkDeviceMemory memory, const Record& record, void* host_address);

    Result<Staging> create_staging(std::uint64_t size, VkBufferUsageFlags usage);
    void destroy_staging(Staging& staging) noexcept;
    // One direction of a transfer through a staging buffer, in chunks of at most staging_chunk
    // bytes: read_back() copies device -> host, allocate_copy() host -> device.
    struct StagedCopy {
        VkBuffer device_buffer = VK_NULL_HANDLE;
        std::uint64_t device_offset = 0;
        std::uint64_t size = 0;
        std::byte* to_host = nullptr;           // set for device -> host
        const std::byte* from_host = nullptr;   // set for host -> device
        const char* what = "";                  // "read_back" / "allocate_copy", for messages
    };
    // Caller holds transfer_mutex_ and has made the transfer objects.
    Status staged_copy(const StagedCopy& copy);
    // read_back(): a transfer-source buffer over `record`'s memory (its own, or `alias`).
    Result<VkBuffer> transfer_source(const ImportedBuffer& buffer, const Record& record,
                                     VkBuffer& alias);
    // allocate_copy(): the device buffer and memory of a copy, then its bytes.
    Result<VkBuffer> create_copy_buffer(std::uint64_t size, VkMemoryRequirements& requirements);
    Result<VkDeviceMemory> allocate_copy_memory(const VkMemoryRequirements& requirements,
                                                int& type);
    Status write_copy(VkBuffer buffer, VkDeviceMemory memory, int type, const void* src,
                      std::uint64_t size);
    // Records, submits and waits for one vkCmdCopyBuffer. Caller holds transfer_mutex_.
    Status copy_and_wait(VkBuffer src, VkBuffer dst, const VkBufferCopy& region);
    Status ensure_transfer_objects();
    Result<Record> find(const ImportedBuffer& buffer, bool imported, std::string_view what) const;
    void destroy_record(VkDeviceMemory memory, const Record& record) noexcept;
    // release() and free_copy(): forget the record of `buffer` (an import when `imported`) and
    // destroy its Vulkan objects.
    Status destroy_buffer(const ImportedBuffer& buffer, bool imported,
                          const char* operation) noexcept;

    std::unique_ptr<OwnedVulkan> owned_; // destroyed last: the device must outlive the rest

    VulkanImporterParams params_;
    DeviceFns fns_;
    std::string unavailable_reason_; // empty: usable (as far as init could tell)
    bool facts_read_ = false;
    VulkanImporterFacts facts_;
    VkPhysicalDeviceMemoryProperties memory_properties_{};
    std::uint64_t alignment_ = 0;
    std::uint64_t max_import_size_ = 0;
    std::string max_import_limit_; // which limit max_import_size_ comes from, for messages
    std::string alignment_note_, max_import_note_; // notes(): where alignment_ and the limit come from
    bool survives_read_only_reprotect_ = false;
    std::string driver_name_; // VkPhysicalDeviceDriverProperties::driverName; empty if unknown
    bool refuses_file_pages_ = false; // set once the probe saw the driver refuse file pages
    std::string file_pages_note_;     // why, when refuses_file_pages_ is set
    DeviceMemoryVerdict device_memory_; // from the device type and heaps

    std::atomic<bool> device_lost_{false};
    std::atomic<std::uint32_t> last_host_pointer_bits_{0};
    mutable std::mutex mutex_; // guards records_ and device_lost_reason_
    std::string device_lost_reason_;
    std::unordered_map<VkDeviceMemory, Record> records_;

    std::mutex transfer_mutex_; // guards the command pool, its command buffer and the fence
    VkCommandPool command_pool_ = VK_NULL_HANDLE;
    VkCommandBuffer command_buffer_ = VK_NULL_HANDLE;
    VkFence fence_ = VK_NULL_HANDLE;
};

} // namespace wm::vulkan
