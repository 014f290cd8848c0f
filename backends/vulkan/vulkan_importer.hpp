// SPDX-License-Identifier: MIT
// The Vulkan importer's class, shared by the engine-owned (make_vulkan_importer) and the
// self-owned (create_default_vulkan_importer) variants. Private to the library.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <vulkan/vulkan_core.h>

#include "weightmap/backends/vulkan.hpp"
#include "weightmap/importer.hpp"

namespace wm::vk {

template <class Handle>
std::uint64_t handle_to_u64(Handle handle) noexcept {
    if constexpr (std::is_pointer_v<Handle>)
        return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle));
    else
        return static_cast<std::uint64_t>(handle);
}

/// Runs `f` on scope exit unless dismissed: unwinds partial work on every failure path.
template <class F>
class Undo {
public:
    explicit Undo(F f) : f_(std::move(f)) {}
    ~Undo() {
        if (armed_) f_();
    }
    Undo(const Undo&) = delete;
    Undo& operator=(const Undo&) = delete;
    void dismiss() noexcept { armed_ = false; }

private:
    F f_;
    bool armed_ = true;
};

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
    Availability available() const override;
    Result<ImportedBuffer> import(void* host_address, std::uint64_t size) override;
    Status release(const ImportedBuffer& buffer) noexcept override;
    Status read_back(const ImportedBuffer& buffer, std::uint64_t offset, std::uint64_t size,
                     void* dst) override;
    Result<ImportedBuffer> allocate_copy(const void* src, std::uint64_t size) override;
    Status free_copy(const ImportedBuffer& buffer) noexcept override;

    Result<VulkanImporterFacts> facts() const;

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

    void init(const VulkanImporterParams& params);
    Status check_usable(std::string_view what) const;
    Status check_extent(std::string_view what, const void* host_address, std::uint64_t size) const;
    // Turns a failed VkResult into an Error naming the call, and remembers a lost device.
    Error vk_error(VkResult result, std::string_view call, std::string_view detail);
    int choose_memory_type(std::uint32_t type_bits, VkMemoryPropertyFlags preferred) const;
    Result<VkBuffer> create_buffer(std::uint64_t size, VkBufferUsageFlags usage, bool external,
                                   VkMemoryRequirements& requirements, std::string_view what);
    Result<Staging> create_staging(std::uint64_t size, VkBufferUsageFlags usage);
    void destroy_staging(Staging& staging) noexcept;
    // Records, submits and waits for one vkCmdCopyBuffer. Caller holds transfer_mutex_.
    Status copy_and_wait(VkBuffer src, VkBuffer dst, const VkBufferCopy& region);
    Status ensure_transfer_objects();
    Result<Record> find(const ImportedBuffer& buffer, bool imported, std::string_view what) const;
    void destroy_record(VkDeviceMemory memory, const Record& record) noexcept;

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
    bool survives_read_only_reprotect_ = false;

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

} // namespace wm::vk
