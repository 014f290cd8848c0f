// SPDX-License-Identifier: MIT
// The Vulkan importer's optional entries: read_back (verification) and allocate_copy/free_copy
// (the copy control arm). Both move bytes with vkCmdCopyBuffer on the engine's queue.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "vulkan_result.hpp"
#include "vulkan_importer.hpp"

namespace wm::vulkan {
namespace {

// Staging chunk: bounds the importer's own host-visible memory to this much per transfer.
constexpr std::uint64_t staging_chunk = std::uint64_t{64} << 20;

} // namespace

Status VulkanImporter::ensure_transfer_objects() {
    if (command_buffer_ != VK_NULL_HANDLE) return {};
    VkCommandPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, nullptr,
                                      VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                      params_.queue_family_index};
    if (command_pool_ == VK_NULL_HANDLE) {
        if (VkResult r =
                fns_.create_command_pool(params_.device, &pool_info, nullptr, &command_pool_);
            r != VK_SUCCESS) {
            command_pool_ = VK_NULL_HANDLE;
            return vk_error(r, "vkCreateCommandPool",
                            fmt::format("queue family {}", params_.queue_family_index));
        }
    }
    if (fence_ == VK_NULL_HANDLE) {
        VkFenceCreateInfo fence_info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO, nullptr, 0};
        if (VkResult r = fns_.create_fence(params_.device, &fence_info, nullptr, &fence_);
            r != VK_SUCCESS) {
            fence_ = VK_NULL_HANDLE;
            return vk_error(r, "vkCreateFence", "transfer fence");
        }
    }
    VkCommandBufferAllocateInfo buffer_info{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, nullptr,
                                            command_pool_, VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
    if (VkResult r = fns_.allocate_command_buffers(params_.device, &buffer_info, &command_buffer_);
        r != VK_SUCCESS) {
        command_buffer_ = VK_NULL_HANDLE;
        return vk_error(r, "vkAllocateCommandBuffers", "transfer command buffer");
    }
    return {};
}

Status VulkanImporter::copy_and_wait(VkBuffer src, VkBuffer dst, const VkBufferCopy& region) {
    const std::string what = fmt::format("copy of {} bytes", region.size);
    if (VkResult r = fns_.reset_command_buffer(command_buffer_, 0); r != VK_SUCCESS)
        return vk_error(r, "vkResetCommandBuffer", what);
    VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, nullptr,
                                   VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT, nullptr};
    if (VkResult r = fns_.begin_command_buffer(command_buffer_, &begin); r != VK_SUCCESS)
        return vk_error(r, "vkBeginCommandBuffer", what);
    fns_.cmd_copy_buffer(command_buffer_, src, dst, 1, &region);
    if (VkResult r = fns_.end_command_buffer(command_buffer_); r != VK_SUCCESS)
        return vk_error(r, "vkEndCommandBuffer", what);
    if (VkResult r = fns_.reset_fences(params_.device, 1, &fence_); r != VK_SUCCESS)
        return vk_error(r, "vkResetFences", what);
    VkSubmitInfo submit{};
    submit.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &command_buffer_;
    VkResult r = VK_SUCCESS;
    if (params_.queue_mutex != nullptr) {
        std::lock_guard queue_lock(*params_.queue_mutex);
        r = fns_.queue_submit(params_.queue, 1, &submit, fence_);
    } else {
        r = fns_.queue_submit(params_.queue, 1, &submit, fence_);
    }
    if (r != VK_SUCCESS) return vk_error(r, "vkQueueSubmit", what);
    // No timeout: a hung device ends in VK_ERROR_DEVICE_LOST, and returning early would free the
    // staging buffer under a copy still in flight.
    r = fns_.wait_for_fences(params_.device, 1, &fence_, VK_TRUE,
                             std::numeric_limits<std::uint64_t>::max());
    if (r != VK_SUCCESS) return vk_error(r, "vkWaitForFences", what);
    return {};
}

Result<VulkanImporter::Staging> VulkanImporter::create_staging(std::uint64_t size,
                                                               VkBufferUsageFlags usage) {
    Staging staging;
    VkMemoryRequirements requirements{};
    Result<VkBuffer> buffer = create_buffer(size, usage, false, requirements, "staging");
    if (!buffer) return std::move(buffer).error();
    staging.buffer = buffer.value();
    staging.size = size;
    int type =
        choose_memory_type(requirements.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                                            VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    if (type < 0 || (memory_properties_.memoryTypes[type].propertyFlags &
                     VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) == 0) {
        destroy_staging(staging);
        return make_error(ErrorKind::unsupported,
                          fmt::format("vulkan staging: no host-visible memory type for a buffer "
                                      "(memoryTypeBits {:#x})",
                                      requirements.memoryTypeBits));
    }
    staging.coherent = (memory_properties_.memoryTypes[type].propertyFlags &
                        VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
    VkMemoryAllocateInfo info{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, nullptr, requirements.size,
                              static_cast<std::uint32_t>(type)};
    if (VkResult r = fns_.allocate_memory(params_.device, &info, nullptr, &staging.memory);
        r != VK_SUCCESS) {
        staging.memory = VK_NULL_HANDLE;
        destroy_staging(staging);
        return vk_error(r, "vkAllocateMemory", fmt::format("staging, {} bytes", requirements.size));
    }
    VkResult r = fns_.bind_buffer_memory(params_.device, staging.buffer, staging.memory, 0);
    if (r == VK_SUCCESS)
        r = fns_.map_memory(params_.device, staging.memory, 0, VK_WHOLE_SIZE, 0, &staging.mapped);
    if (r != VK_SUCCESS) {
        staging.mapped = nullptr;
        destroy_staging(staging);
        return vk_error(r, "vkBindBufferMemory/vkMapMemory", "staging");
    }
    return staging;
}

void VulkanImporter::destroy_staging(Staging& staging) noexcept {
    if (staging.mapped != nullptr) fns_.unmap_memory(params_.device, staging.memory);
    if (staging.buffer != VK_NULL_HANDLE)
        fns_.destroy_buffer(params_.device, staging.buffer, nullptr);
    if (staging.memory != VK_NULL_HANDLE) fns_.free_memory(params_.device, staging.memory, nullptr);
    staging = Staging{};
}

Status VulkanImporter::staged_copy(const StagedCopy& copy) {
    const bool to_host = copy.to_host != nullptr;
    Result<Staging> staging =
        create_staging(std::min(copy.size, staging_chunk),
                       to_host ? VK_BUFFER_USAGE_TRANSFER_DST_BIT : VK_BUFFER_USAGE_TRANSFER_SRC_BIT);
    if (!staging) return std::move(staging).error();
    Undo destroy_staging_buffer([&] { destroy_staging(staging.value()); });
    const std::string what = fmt::format("{} staging", copy.what);
    VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, staging->memory, 0,
                              VK_WHOLE_SIZE};
    for (std::uint64_t done = 0; done < copy.size;) {
        const std::uint64_t n = std::min(copy.size - done, staging->size);
        if (!to_host) {
            std::memcpy(staging->mapped, copy.from_host + done, n);
            if (!staging->coherent) {
                if (VkResult r = fns_.flush_mapped_memory_ranges(params_.device, 1, &range);
                    r != VK_SUCCESS)
                    return vk_error(r, "vkFlushMappedMemoryRanges", what);
            }
        }
        const std::uint64_t device_offset = copy.device_offset + done;
        Status copied =
            to_host ? copy_and_wait(copy.device_buffer, staging->buffer,
                                    VkBufferCopy{device_offset, 0, n})
                    : copy_and_wait(staging->buffer, copy.device_buffer,
                                    VkBufferCopy{0, device_offset, n});
        if (!copied) return copied;
        if (to_host) {
            if (!staging->coherent) {
                if (VkResult r = fns_.invalidate_mapped_memory_ranges(params_.device, 1, &range);
                    r != VK_SUCCESS)
                    return vk_error(r, "vkInvalidateMappedMemoryRanges", what);
            }
            std::memcpy(copy.to_host + done, staging->mapped, n);
        }
        done += n;
    }
    return {};
}

Status VulkanImporter::read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                                         std::uint64_t size, void* dst) {
    if (Status s = check_usable("read_back"); !s) return s;
    if (params_.queue == VK_NULL_HANDLE)
        return make_error(ErrorKind::unsupported,
                          "vulkan read_back: no transfer queue (VulkanImporterParams::queue is "
                          "null)");
    Result<Record> found = find(buffer, buffer.imported, "read_back");
    if (!found) return std::move(found).error();
    const Record record = found.value();
    if (offset > record.size || size > record.size - offset)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("vulkan read_back: [{}, +{}) outside a buffer of {} bytes",
                                      offset, size, record.size));
    if (size == 0) return {};
    if (dst == nullptr)
        return make_error(ErrorKind::invalid_argument, "vulkan read_back: null destination");

    std::lock_guard transfer_lock(transfer_mutex_);
    if (Status s = ensure_transfer_objects(); !s) return s;
    VkBuffer alias = VK_NULL_HANDLE;
    Undo destroy_alias([&] {
        if (alias != VK_NULL_HANDLE) fns_.destroy_buffer(params_.device, alias, nullptr);
    });
    Result<VkBuffer> source = transfer_source(buffer, record, alias);
    if (!source) return std::move(source).error();
    StagedCopy copy;
    copy.device_buffer = source.value();
    copy.device_offset = offset;
    copy.size = size;
    copy.to_host = static_cast<std::byte*>(dst);
    copy.what = "read_back";
    return staged_copy(copy);
}

// The copy must come from the device's view of the memory, so the source is a buffer bound to
// it: the importer's own when its usage allows transfers, else a temporary alias (left in
// `alias` for the caller to destroy).
Result<VkBuffer> VulkanImporter::transfer_source(const ImportedBuffer& buffer,
                                                 const Record& record, VkBuffer& alias) {
    if (record.buffer_is_transfer_source) return record.buffer;
    VkMemoryRequirements requirements{};
    Result<VkBuffer> created = create_buffer(record.size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                             record.imported, requirements, "read_back alias");
    if (!created) return created;
    alias = created.value();
    if ((requirements.memoryTypeBits & (1u << record.memory_type)) == 0 ||
        requirements.size > record.size)
        return make_error(ErrorKind::unsupported,
                          fmt::format("vulkan read_back: a transfer-source buffer cannot alias "
                                      "memory type {} of {} bytes (needs types {:#x}, {} bytes)",
                                      record.memory_type, record.size,
                                      requirements.memoryTypeBits, requirements.size));
    if (VkResult r = fns_.bind_buffer_memory(params_.device, alias, vulkan_memory(buffer), 0);
        r != VK_SUCCESS)
        return vk_error(r, "vkBindBufferMemory", "read_back alias");
    return alias;
}

Result<ImportedBuffer> VulkanImporter::allocate_copy(const void* src, std::uint64_t size) {
    if (Status s = check_usable("allocate_copy"); !s) return std::move(s).error();
    if (params_.queue == VK_NULL_HANDLE)
        return make_error(ErrorKind::unsupported,
                          "vulkan allocate_copy: no transfer queue (VulkanImporterParams::queue "
                          "is null)");
    if (src == nullptr || size == 0)
        return make_error(
            ErrorKind::invalid_argument,
            fmt::format("vulkan allocate_copy: null source or zero size ({} +{})", src, size));
    if (size > max_import_size_)
        return make_error(ErrorKind::limit,
                          fmt::format("vulkan allocate_copy: {} bytes is over the device's {} of "
                                      "{} bytes on '{}'",
                                      size, max_import_limit_, max_import_size_,
                                      facts_.device_name));

    VkMemoryRequirements requirements{};
    Result<VkBuffer> created = create_copy_buffer(size, requirements);
    if (!created) return std::move(created).error();
    VkBuffer buffer = created.value();
    VkDeviceMemory memory = VK_NULL_HANDLE;
    Undo destroy_copy([&] {
        fns_.destroy_buffer(params_.device, buffer, nullptr);
        if (memory != VK_NULL_HANDLE) fns_.free_memory(params_.device, memory, nullptr);
    });
    int type = -1;
    Result<VkDeviceMemory> allocated = allocate_copy_memory(requirements, type);
    if (!allocated) return std::move(allocated).error();
    memory = allocated.value();
    if (VkResult r = fns_.bind_buffer_memory(params_.device, buffer, memory, 0); r != VK_SUCCESS)
        return vk_error(r, "vkBindBufferMemory", "allocate_copy");
    if (Status s = write_copy(buffer, memory, type, src, size); !s) return std::move(s).error();

    const Record record{buffer, size, static_cast<std::uint32_t>(type), /*imported=*/false,
                        /*buffer_is_transfer_source=*/true};
    ImportedBuffer result = remember(memory, record, nullptr);
    destroy_copy.dismiss();
    return result;
}

// The engine's usage plus the transfers the copy arm needs; the copy is a plain device buffer.
Result<VkBuffer> VulkanImporter::create_copy_buffer(std::uint64_t size,
                                                    VkMemoryRequirements& requirements) {
    return create_buffer(
        size,
        params_.buffer_usage | VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
        false, requirements, "allocate_copy");
}

Result<VkDeviceMemory> VulkanImporter::allocate_copy_memory(
    const VkMemoryRequirements& requirements, int& type) {
    type = choose_memory_type(requirements.memoryTypeBits, params_.preferred_memory_flags);
    if (type < 0)
        return make_error(ErrorKind::unsupported,
                          fmt::format("vulkan allocate_copy: no memory type for a buffer "
                                      "(memoryTypeBits {:#x})",
                                      requirements.memoryTypeBits));
    VkMemoryAllocateInfo info{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, nullptr, requirements.size,
                              static_cast<std::uint32_t>(type)};
    VkDeviceMemory memory = VK_NULL_HANDLE;
    if (VkResult r = fns_.allocate_memory(params_.device, &info, nullptr, &memory);
        r != VK_SUCCESS)
        return vk_error(
            r, "vkAllocateMemory",
            fmt::format("allocate_copy, {} bytes, memory type {}", requirements.size, type));
    return memory;
}

// The copy's bytes: written through a mapping when the memory type is host-visible (lavapipe's
// only type is), as an engine would, else through staging buffers and the transfer queue.
Status VulkanImporter::write_copy(VkBuffer buffer, VkDeviceMemory memory, int type,
                                  const void* src, std::uint64_t size) {
    const VkMemoryPropertyFlags flags = memory_properties_.memoryTypes[type].propertyFlags;
    if ((flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0) {
        void* mapped = nullptr;
        if (VkResult r = fns_.map_memory(params_.device, memory, 0, VK_WHOLE_SIZE, 0, &mapped);
            r != VK_SUCCESS)
            return vk_error(r, "vkMapMemory", "allocate_copy");
        std::memcpy(mapped, src, size);
        VkResult r = VK_SUCCESS;
        if ((flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) == 0) {
            VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr, memory, 0,
                                      VK_WHOLE_SIZE};
            r = fns_.flush_mapped_memory_ranges(params_.device, 1, &range);
        }
        fns_.unmap_memory(params_.device, memory);
        if (r != VK_SUCCESS) return vk_error(r, "vkFlushMappedMemoryRanges", "allocate_copy");
        return {};
    }
    std::lock_guard transfer_lock(transfer_mutex_);
    if (Status s = ensure_transfer_objects(); !s) return s;
    StagedCopy copy;
    copy.device_buffer = buffer;
    copy.size = size;
    copy.from_host = static_cast<const std::byte*>(src);
    copy.what = "allocate_copy";
    return staged_copy(copy);
}

Status VulkanImporter::free_copy(const ImportedBuffer& buffer) noexcept {
    return destroy_buffer(buffer, false, "free_copy");
}

} // namespace wm::vulkan
