// SPDX-License-Identifier: MIT
// The Vulkan importer's optional entries: read_back (verification) and allocate_copy/free_copy
// (the copy control arm). Both move bytes with vkCmdCopyBuffer on the engine's queue.
#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "vk_result.hpp"
#include "vulkan_importer.hpp"

namespace wm::vk {
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

Status VulkanImporter::read_back(const ImportedBuffer& buffer, std::uint64_t offset,
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

    // The copy must come from the device's view of the memory, so the source is a buffer bound
    // to it: the importer's own when its usage allows transfers, else a temporary alias.
    VkBuffer source = record.buffer_is_transfer_source ? record.buffer : VK_NULL_HANDLE;
    VkBuffer alias = VK_NULL_HANDLE;
    Undo destroy_alias([&] {
        if (alias != VK_NULL_HANDLE) fns_.destroy_buffer(params_.device, alias, nullptr);
    });
    if (source == VK_NULL_HANDLE) {
        VkMemoryRequirements requirements{};
        Result<VkBuffer> created = create_buffer(record.size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                                 record.imported, requirements, "read_back alias");
        if (!created) return std::move(created).error();
        alias = created.value();
        if ((requirements.memoryTypeBits & (1u << record.memory_type)) == 0 ||
            requirements.size > record.size)
            return make_error(ErrorKind::unsupported,
                              fmt::format("vulkan read_back: a transfer-source buffer cannot alias "
                                          "memory type {} of {} bytes (needs types {:#x}, {} "
                                          "bytes)",
                                          record.memory_type, record.size,
                                          requirements.memoryTypeBits, requirements.size));
        if (VkResult r = fns_.bind_buffer_memory(params_.device, alias, vulkan_memory(buffer), 0);
            r != VK_SUCCESS)
            return vk_error(r, "vkBindBufferMemory", "read_back alias");
        source = alias;
    }

    Result<Staging> staging =
        create_staging(std::min(size, staging_chunk), VK_BUFFER_USAGE_TRANSFER_DST_BIT);
    if (!staging) return std::move(staging).error();
    Undo destroy_staging_buffer([&] { destroy_staging(staging.value()); });

    auto* out = static_cast<std::byte*>(dst);
    for (std::uint64_t done = 0; done < size;) {
        const std::uint64_t n = std::min(size - done, staging->size);
        if (Status s = copy_and_wait(source, staging->buffer, VkBufferCopy{offset + done, 0, n});
            !s)
            return s;
        if (!staging->coherent) {
            VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr,
                                      staging->memory, 0, VK_WHOLE_SIZE};
            if (VkResult r = fns_.invalidate_mapped_memory_ranges(params_.device, 1, &range);
                r != VK_SUCCESS)
                return vk_error(r, "vkInvalidateMappedMemoryRanges", "read_back staging");
        }
        std::memcpy(out + done, staging->mapped, n);
        done += n;
    }
    return {};
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

    // The engine's usage plus the transfers this arm needs; the copy is a plain device buffer.
    VkMemoryRequirements requirements{};
    Result<VkBuffer> created = create_buffer(
        size,
        params_.buffer_usage | VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
        false, requirements, "allocate_copy");
    if (!created) return std::move(created).error();
    VkBuffer buffer = created.value();
    VkDeviceMemory memory = VK_NULL_HANDLE;
    Undo destroy_copy([&] {
        fns_.destroy_buffer(params_.device, buffer, nullptr);
        if (memory != VK_NULL_HANDLE) fns_.free_memory(params_.device, memory, nullptr);
    });

    const int type =
        choose_memory_type(requirements.memoryTypeBits, params_.preferred_memory_flags);
    if (type < 0)
        return make_error(ErrorKind::unsupported,
                          fmt::format("vulkan allocate_copy: no memory type for a buffer "
                                      "(memoryTypeBits {:#x})",
                                      requirements.memoryTypeBits));
    VkMemoryAllocateInfo info{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, nullptr, requirements.size,
                              static_cast<std::uint32_t>(type)};
    if (VkResult r = fns_.allocate_memory(params_.device, &info, nullptr, &memory);
        r != VK_SUCCESS) {
        memory = VK_NULL_HANDLE;
        return vk_error(
            r, "vkAllocateMemory",
            fmt::format("allocate_copy, {} bytes, memory type {}", requirements.size, type));
    }
    if (VkResult r = fns_.bind_buffer_memory(params_.device, buffer, memory, 0); r != VK_SUCCESS)
        return vk_error(r, "vkBindBufferMemory", "allocate_copy");

    const VkMemoryPropertyFlags flags = memory_properties_.memoryTypes[type].propertyFlags;
    if ((flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0) {
        // The chosen type is host-visible (lavapipe's only type is): write it directly, as an
        // engine would.
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
    } else {
        std::lock_guard transfer_lock(transfer_mutex_);
        if (Status s = ensure_transfer_objects(); !s) return std::move(s).error();
        Result<Staging> staging =
            create_staging(std::min(size, staging_chunk), VK_BUFFER_USAGE_TRANSFER_SRC_BIT);
        if (!staging) return std::move(staging).error();
        Undo destroy_staging_buffer([&] { destroy_staging(staging.value()); });
        const auto* in = static_cast<const std::byte*>(src);
        for (std::uint64_t done = 0; done < size;) {
            const std::uint64_t n = std::min(size - done, staging->size);
            std::memcpy(staging->mapped, in + done, n);
            if (!staging->coherent) {
                VkMappedMemoryRange range{VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, nullptr,
                                          staging->memory, 0, VK_WHOLE_SIZE};
                if (VkResult r = fns_.flush_mapped_memory_ranges(params_.device, 1, &range);
                    r != VK_SUCCESS)
                    return vk_error(r, "vkFlushMappedMemoryRanges", "allocate_copy staging");
            }
            if (Status s = copy_and_wait(staging->buffer, buffer, VkBufferCopy{0, done, n}); !s)
                return std::move(s).error();
            done += n;
        }
    }

    Record record;
    record.buffer = buffer;
    record.size = size;
    record.memory_type = static_cast<std::uint32_t>(type);
    record.imported = false;
    record.buffer_is_transfer_source = true;
    {
        std::lock_guard lock(mutex_);
        records_.emplace(memory, record);
    }
    destroy_copy.dismiss();

    ImportedBuffer result;
    result.host_address = nullptr; // the copy lives in device memory, not in the mapping
    result.size = size;
    result.native_memory = handle_to_u64(memory);
    result.native_buffer = handle_to_u64(buffer);
    result.imported = false;
    return result;
}

Status VulkanImporter::free_copy(const ImportedBuffer& buffer) noexcept {
    try {
        Result<Record> record = find(buffer, false, "free_copy");
        if (!record) return std::move(record).error();
        VkDeviceMemory memory = vulkan_memory(buffer);
        {
            std::lock_guard lock(mutex_);
            if (records_.erase(memory) == 0)
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("vulkan free_copy: VkDeviceMemory {:#x} was freed "
                                              "concurrently",
                                              buffer.native_memory));
        }
        destroy_record(memory, record.value());
        return {};
    } catch (const std::exception& e) {
        return make_error(ErrorKind::internal, fmt::format("vulkan free_copy: {}", e.what()));
    }
}

} // namespace wm::vk
