// SPDX-License-Identifier: MIT
// The Vulkan importer: VK_EXT_external_memory_host over the engine's device.
#include "vulkan_importer.hpp"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "internal/align.hpp"
#include "internal/nothrow.hpp"
#include "vulkan_result.hpp"
#include "weightmap/planner.hpp"

namespace wm::vulkan {
namespace {

constexpr const char* extension_name = VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME;
constexpr VkExternalMemoryHandleTypeFlagBits host_handle_type =
    VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;

std::string version_string(std::uint32_t v) {
    return fmt::format("{}.{}.{}", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v),
                       VK_API_VERSION_PATCH(v));
}

} // namespace

VulkanImporter::VulkanImporter(std::string unavailable_reason)
    : unavailable_reason_(std::move(unavailable_reason)) {}

VulkanImporter::VulkanImporter(const VulkanImporterParams& params,
                               std::unique_ptr<OwnedVulkan> owned)
    : owned_(std::move(owned)), params_(params) {
    init(params);
}

void VulkanImporter::init(const VulkanImporterParams& params) {
    unavailable_reason_ = initialise(params);
    if (!unavailable_reason_.empty()) return;
    // Measured on Mesa 22.3 lavapipe: an import of a writable MAP_SHARED mapping that is then
    // mprotect()ed PROT_READ still reads back the file's bytes through vkCmdCopyBuffer
    // (tests/vulkan/test_vulkan_read_only.cpp). Unmeasured drivers are not assumed to do the same.
    survives_read_only_reprotect_ = facts_.driver_id == VK_DRIVER_ID_MESA_LLVMPIPE;
    probe_file_pages();
}

// The steps of init(), in order; the first that fails says why the importer is unavailable.
std::string VulkanImporter::initialise(const VulkanImporterParams& params) {
    InstanceFns fns;
    if (std::string why = resolve_instance_fns(fns); !why.empty()) return why;
    if (std::string why = read_properties(fns); !why.empty()) return why;
    DeviceExtensions extensions;
    if (std::string why = read_extensions(fns, extensions); !why.empty()) return why;
    read_properties2(fns, extensions);
    if (std::string why = check_host_import(params, extensions); !why.empty()) return why;
    if (std::string why = resolve_device_fns(); !why.empty()) return why;
    return set_import_limit();
}

std::string VulkanImporter::resolve_instance_fns(InstanceFns& fns) {
    PFN_vkGetInstanceProcAddr gipa = params_.get_instance_proc_addr;
    auto instance_fn = [&](auto& slot, const char* name) {
        slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(
            gipa(params_.instance, name));
    };
    instance_fn(fns.get_properties, "vkGetPhysicalDeviceProperties");
    instance_fn(fns.get_memory_properties, "vkGetPhysicalDeviceMemoryProperties");
    instance_fn(fns.enumerate_extensions, "vkEnumerateDeviceExtensionProperties");
    instance_fn(fns.get_properties2, "vkGetPhysicalDeviceProperties2");
    if (fns.get_properties2 == nullptr)
        instance_fn(fns.get_properties2, "vkGetPhysicalDeviceProperties2KHR");
    if (params_.get_device_proc_addr == nullptr)
        instance_fn(params_.get_device_proc_addr, "vkGetDeviceProcAddr");
    for (auto [fn, name] :
         {std::pair{reinterpret_cast<void*>(fns.get_properties), "vkGetPhysicalDeviceProperties"},
          {reinterpret_cast<void*>(fns.get_memory_properties),
           "vkGetPhysicalDeviceMemoryProperties"},
          {reinterpret_cast<void*>(fns.enumerate_extensions),
           "vkEnumerateDeviceExtensionProperties"},
          {reinterpret_cast<void*>(params_.get_device_proc_addr), "vkGetDeviceProcAddr"}}) {
        if (fn == nullptr) return fmt::format("vkGetInstanceProcAddr returned null for {}", name);
    }
    if (fns.get_properties2 == nullptr)
        return "vkGetInstanceProcAddr returned null for vkGetPhysicalDeviceProperties2 "
               "and its KHR alias: minImportedHostPointerAlignment cannot be queried "
               "(the instance needs Vulkan 1.1 or VK_KHR_get_physical_device_properties2)";
    return {};
}

// The Vulkan 1.0 properties and memory types, into facts_.
std::string VulkanImporter::read_properties(const InstanceFns& fns) {
    VkPhysicalDeviceProperties properties{};
    fns.get_properties(params_.physical_device, &properties);
    facts_.device_name = properties.deviceName;
    facts_.api_version = properties.apiVersion;
    facts_.device_type = properties.deviceType;
    facts_.max_storage_buffer_range = properties.limits.maxStorageBufferRange;
    fns.get_memory_properties(params_.physical_device, &memory_properties_);
    facts_.memory_type_count = memory_properties_.memoryTypeCount;
    for (std::uint32_t i = 0; i < memory_properties_.memoryTypeCount; ++i) {
        facts_.memory_type_flags[i] = memory_properties_.memoryTypes[i].propertyFlags;
        facts_.memory_type_heap_size[i] =
            memory_properties_.memoryHeaps[memory_properties_.memoryTypes[i].heapIndex].size;
    }
    device_memory_ = classify_device_memory(properties.deviceType, memory_properties_,
                                            facts_.device_name);
    if (properties.apiVersion < VK_API_VERSION_1_1)
        return fmt::format("physical device '{}' is Vulkan {}; the importer needs 1.1 "
                           "(external memory is core there)",
                           facts_.device_name, version_string(properties.apiVersion));
    return {};
}

std::string VulkanImporter::read_extensions(const InstanceFns& fns,
                                            DeviceExtensions& extensions) {
    std::uint32_t count = 0;
    std::vector<VkExtensionProperties> listed;
    VkResult r = fns.enumerate_extensions(params_.physical_device, nullptr, &count, nullptr);
    if (r == VK_SUCCESS) {
        listed.resize(count);
        r = fns.enumerate_extensions(params_.physical_device, nullptr, &count, listed.data());
        listed.resize(count);
    }
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        return fmt::format("vkEnumerateDeviceExtensionProperties on '{}' failed: {}",
                           facts_.device_name, result_name(r));
    auto has = [&](const char* name) {
        return std::any_of(listed.begin(), listed.end(), [&](const VkExtensionProperties& e) {
            return std::strcmp(e.extensionName, name) == 0;
        });
    };
    extensions.external_memory_host = has(extension_name);
    extensions.driver_properties = facts_.api_version >= VK_API_VERSION_1_2 ||
                                   has(VK_KHR_DRIVER_PROPERTIES_EXTENSION_NAME);
    extensions.maintenance4 =
        facts_.api_version >= VK_API_VERSION_1_3 || has(VK_KHR_MAINTENANCE_4_EXTENSION_NAME);
    return {};
}

// The limits and identity behind vkGetPhysicalDeviceProperties2, into facts_ and driver_name_.
void VulkanImporter::read_properties2(const InstanceFns& fns, const DeviceExtensions& extensions) {
    // Chain only structures the device knows: an unknown sType in pNext is invalid usage.
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host_properties{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT, nullptr, 0};
    VkPhysicalDeviceMaintenance3Properties maintenance3_properties{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, nullptr, 0, 0};
    VkPhysicalDeviceMaintenance4Properties maintenance4_properties{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_PROPERTIES, nullptr, 0};
    VkPhysicalDeviceDriverProperties driver{};
    driver.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES;
    VkPhysicalDeviceProperties2 properties2{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &maintenance3_properties, {}};
    void** tail = &maintenance3_properties.pNext;
    if (extensions.external_memory_host) {
        *tail = &host_properties;
        tail = &host_properties.pNext;
    }
    if (extensions.maintenance4) {
        *tail = &maintenance4_properties;
        tail = &maintenance4_properties.pNext;
    }
    if (extensions.driver_properties) *tail = &driver;
    fns.get_properties2(params_.physical_device, &properties2);
    facts_.max_memory_allocation_size = maintenance3_properties.maxMemoryAllocationSize;
    facts_.max_buffer_size = extensions.maintenance4 ? maintenance4_properties.maxBufferSize : 0;
    facts_.driver_id = extensions.driver_properties ? driver.driverID : static_cast<VkDriverId>(0);
    if (extensions.driver_properties)
        driver_name_.assign(driver.driverName, strnlen(driver.driverName, sizeof driver.driverName));
    facts_.min_imported_host_pointer_alignment = host_properties.minImportedHostPointerAlignment;
    facts_read_ = true;
}

// The extension is there, enabled, and its alignment usable; sets alignment_.
std::string VulkanImporter::check_host_import(const VulkanImporterParams& params,
                                              const DeviceExtensions& extensions) {
    if (!extensions.external_memory_host)
        return fmt::format("physical device '{}' does not support {}", facts_.device_name,
                           extension_name);
    if (!params.external_memory_host_enabled)
        return fmt::format("{} was not enabled at vkCreateDevice on '{}' "
                           "(VulkanImporterParams::external_memory_host_enabled is false)",
                           extension_name, facts_.device_name);
    const std::uint64_t min_alignment = facts_.min_imported_host_pointer_alignment;
    if (!is_power_of_two(min_alignment))
        return fmt::format("'{}' reports minImportedHostPointerAlignment {}, not a power of two",
                           facts_.device_name, min_alignment);
    alignment_ = std::max<std::uint64_t>(min_alignment, host_page_size());
    // Never handed to the driver: lavapipe would accept it, a real driver would not, and the
    // spec makes it invalid usage (VUID-VkImportMemoryHostPointerInfoEXT-pHostPointer-01733,
    // VUID-VkMemoryAllocateInfo-allocationSize-01745).
    alignment_note_ = fmt::format("max of minImportedHostPointerAlignment {} and the page size {}",
                                  min_alignment, host_page_size());
    return {};
}

std::string VulkanImporter::resolve_device_fns() {
    PFN_vkGetDeviceProcAddr gdpa = params_.get_device_proc_addr;
    std::string missing;
    auto device_fn = [&](auto& slot, const char* name) {
        slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(gdpa(params_.device, name));
        if (slot == nullptr) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
    };
    device_fn(fns_.get_memory_host_pointer_properties, "vkGetMemoryHostPointerPropertiesEXT");
    // Measured on lavapipe: vkGetDeviceProcAddr returns null exactly when the device was
    // created without the extension, whatever the engine claimed.
    if (fns_.get_memory_host_pointer_properties == nullptr)
        return fmt::format("vkGetDeviceProcAddr returned null for "
                           "vkGetMemoryHostPointerPropertiesEXT: {} is not enabled on "
                           "this VkDevice of '{}'",
                           extension_name, facts_.device_name);
    missing.clear();
    device_fn(fns_.allocate_memory, "vkAllocateMemory");
    device_fn(fns_.free_memory, "vkFreeMemory");
    device_fn(fns_.map_memory, "vkMapMemory");
    device_fn(fns_.unmap_memory, "vkUnmapMemory");
    device_fn(fns_.flush_mapped_memory_ranges, "vkFlushMappedMemoryRanges");
    device_fn(fns_.invalidate_mapped_memory_ranges, "vkInvalidateMappedMemoryRanges");
    device_fn(fns_.create_buffer, "vkCreateBuffer");
    device_fn(fns_.destroy_buffer, "vkDestroyBuffer");
    device_fn(fns_.get_buffer_memory_requirements, "vkGetBufferMemoryRequirements");
    device_fn(fns_.bind_buffer_memory, "vkBindBufferMemory");
    device_fn(fns_.create_command_pool, "vkCreateCommandPool");
    device_fn(fns_.destroy_command_pool, "vkDestroyCommandPool");
    device_fn(fns_.allocate_command_buffers, "vkAllocateCommandBuffers");
    device_fn(fns_.reset_command_buffer, "vkResetCommandBuffer");
    device_fn(fns_.begin_command_buffer, "vkBeginCommandBuffer");
    device_fn(fns_.end_command_buffer, "vkEndCommandBuffer");
    device_fn(fns_.cmd_copy_buffer, "vkCmdCopyBuffer");
    device_fn(fns_.queue_submit, "vkQueueSubmit");
    device_fn(fns_.create_fence, "vkCreateFence");
    device_fn(fns_.destroy_fence, "vkDestroyFence");
    device_fn(fns_.reset_fences, "vkResetFences");
    device_fn(fns_.wait_for_fences, "vkWaitForFences");
    if (!missing.empty()) return fmt::format("vkGetDeviceProcAddr returned null for {}", missing);
    return {};
}

// The alignment and the largest import: one allocation, and one buffer over it when the engine
// wants one.
std::string VulkanImporter::set_import_limit() {
    max_import_size_ = facts_.max_memory_allocation_size;
    max_import_limit_ = "maxMemoryAllocationSize";
    if ((params_.buffer_usage & VK_BUFFER_USAGE_STORAGE_BUFFER_BIT) != 0 &&
        facts_.max_storage_buffer_range < max_import_size_) {
        max_import_size_ = facts_.max_storage_buffer_range;
        max_import_limit_ = "maxStorageBufferRange";
    }
    if (params_.buffer_usage != 0 && facts_.max_buffer_size != 0 &&
        facts_.max_buffer_size < max_import_size_) {
        max_import_size_ = facts_.max_buffer_size;
        max_import_limit_ = "maxBufferSize";
    }
    // Aligned down so the planner never cuts an extent whose size is not a multiple of alignment
    // (NVIDIA-style limits such as 0xffffffff are not).
    max_import_size_ = align_down(max_import_size_, alignment_);
    max_import_note_ = fmt::format("the device's {} on '{}'", max_import_limit_, facts_.device_name);
    if (max_import_size_ == 0)
        return fmt::format("'{}': {} is smaller than the import alignment {}", facts_.device_name,
                           max_import_limit_, alignment_);
    return {};
}

VulkanImporter::~VulkanImporter() {
    std::unordered_map<VkDeviceMemory, Record> left;
    {
        std::lock_guard lock(mutex_);
        left.swap(records_);
    }
    if (!left.empty())
        log_message(params_.log, LogLevel::warning,
                    fmt::format("vulkan importer destroyed with {} buffers still imported or "
                                "copied; freeing them now (release them before destroying the "
                                "importer)",
                                left.size()));
    for (const auto& [memory, record] : left)
        destroy_record(memory, record);
    std::lock_guard transfer_lock(transfer_mutex_);
    if (fence_ != VK_NULL_HANDLE) fns_.destroy_fence(params_.device, fence_, nullptr);
    // Destroying the pool frees its command buffer.
    if (command_pool_ != VK_NULL_HANDLE)
        fns_.destroy_command_pool(params_.device, command_pool_, nullptr);
}

ImporterCaps VulkanImporter::caps() const noexcept {
    ImporterCaps caps;
    // False: the driver known to pin host pointers for write (RADV, through libdrm's
    // amdgpu_create_bo_from_user_mem) refuses file pages whatever their protection, which the
    // file-page probe reports below; a writable mapping would gain nothing there and would let a
    // stray device write reach the model file (docs/vulkan.md, "Drivers").
    caps.needs_writable_mapping = false;
    caps.alignment = alignment_ != 0 ? alignment_ : host_page_size();
    caps.max_import_size = max_import_size_;
    caps.is_cpu = false;
    caps.survives_read_only_reprotect = survives_read_only_reprotect_;
    caps.refuses_file_pages = refuses_file_pages_;
    caps.device_memory = device_memory_.memory;
    return caps;
}

ImporterNotes VulkanImporter::notes() const noexcept {
    return {file_pages_note_, device_memory_.note, alignment_note_, max_import_note_};
}

Availability VulkanImporter::available() const {
    if (!unavailable_reason_.empty()) return {false, unavailable_reason_};
    if (device_lost_.load()) {
        std::lock_guard lock(mutex_);
        return {false, device_lost_reason_};
    }
    return {true, {}};
}

Status VulkanImporter::check_usable(std::string_view what) const {
    if (Availability a = available(); !a.available)
        return make_error(ErrorKind::unsupported,
                          fmt::format("vulkan {}: importer not available: {}", what, a.reason));
    return {};
}

Error VulkanImporter::vk_error(VkResult result, std::string_view call, std::string_view detail) {
    std::string message = fmt::format("{}({}) failed: {}", call, detail, result_name(result));
    if (result == VK_ERROR_DEVICE_LOST) {
        std::lock_guard lock(mutex_);
        if (!device_lost_.load()) {
            device_lost_reason_ = fmt::format("device '{}' was lost ({}); no further imports are "
                                              "attempted",
                                              facts_.device_name, message);
            device_lost_.store(true);
        }
    }
    return make_error(ErrorKind::import_failed, std::move(message));
}

int VulkanImporter::choose_memory_type(std::uint32_t type_bits,
                                       VkMemoryPropertyFlags preferred) const {
    auto first = [&](auto accept) {
        for (std::uint32_t i = 0; i < memory_properties_.memoryTypeCount; ++i)
            if ((type_bits & (1u << i)) != 0 &&
                accept(memory_properties_.memoryTypes[i].propertyFlags))
                return static_cast<int>(i);
        return -1;
    };
    int type = first([&](VkMemoryPropertyFlags f) { return (f & preferred) == preferred; });
    if (type < 0)
        type = first(
            [](VkMemoryPropertyFlags f) { return (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0; });
    if (type < 0) type = first([](VkMemoryPropertyFlags) { return true; });
    return type;
}

Result<VkBuffer> VulkanImporter::create_buffer(std::uint64_t size, VkBufferUsageFlags usage,
                                               bool external, VkMemoryRequirements& requirements,
                                               std::string_view what) {
    // A buffer bound to imported memory must name the handle type at creation
    // (VUID-vkBindBufferMemory-memory-02727).
    VkExternalMemoryBufferCreateInfo external_info{
        VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, nullptr,
        static_cast<VkExternalMemoryHandleTypeFlags>(host_handle_type)};
    VkBufferCreateInfo info{};
    info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    info.pNext = external ? &external_info : nullptr;
    info.size = size;
    info.usage = usage;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VkBuffer buffer = VK_NULL_HANDLE;
    if (VkResult r = fns_.create_buffer(params_.device, &info, nullptr, &buffer); r != VK_SUCCESS)
        return vk_error(r, "vkCreateBuffer",
                        fmt::format("{}, {} bytes, usage {:#x}", what, size, usage));
    fns_.get_buffer_memory_requirements(params_.device, buffer, &requirements);
    return buffer;
}

Result<ImportedBuffer> VulkanImporter::import_checked(void* host_address, std::uint64_t size) {
    if (Status s = check_usable("import"); !s) return std::move(s).error();
    if (Status s = check_file_pages(host_address, size); !s) return std::move(s).error();
    const std::string where = fmt::format("{} +{:#x}", host_address, size);

    VkMemoryHostPointerPropertiesEXT pointer_properties{
        VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT, nullptr, 0};
    if (VkResult r = fns_.get_memory_host_pointer_properties(params_.device, host_handle_type,
                                                             host_address, &pointer_properties);
        r != VK_SUCCESS)
        return vk_error(r, "vkGetMemoryHostPointerPropertiesEXT", where);
    last_host_pointer_bits_.store(pointer_properties.memoryTypeBits);
    std::uint32_t type_bits = pointer_properties.memoryTypeBits;

    VkBuffer buffer = VK_NULL_HANDLE;
    Undo destroy_buffer([&] {
        if (buffer != VK_NULL_HANDLE) fns_.destroy_buffer(params_.device, buffer, nullptr);
    });
    if (params_.buffer_usage != 0) {
        Result<VkBuffer> created = create_import_buffer(size, where, type_bits);
        if (!created) return std::move(created).error();
        buffer = created.value();
    }
    const int type = choose_memory_type(type_bits, params_.preferred_memory_flags);
    if (type < 0)
        return make_error(ErrorKind::import_failed,
                          fmt::format("vulkan import {}: vkGetMemoryHostPointerPropertiesEXT "
                                      "offers no memory type (memoryTypeBits {:#x})",
                                      where, pointer_properties.memoryTypeBits));
    Result<VkDeviceMemory> memory =
        import_memory(host_address, size, static_cast<std::uint32_t>(type), where);
    if (!memory) return std::move(memory).error();
    Undo free_memory([&] { fns_.free_memory(params_.device, memory.value(), nullptr); });
    if (buffer != VK_NULL_HANDLE) {
        if (VkResult r = fns_.bind_buffer_memory(params_.device, buffer, memory.value(), 0);
            r != VK_SUCCESS)
            return vk_error(r, "vkBindBufferMemory", "import " + where);
    }

    const Record record{buffer, size, static_cast<std::uint32_t>(type), /*imported=*/true,
                        (params_.buffer_usage & VK_BUFFER_USAGE_TRANSFER_SRC_BIT) != 0};
    ImportedBuffer result = remember(memory.value(), record, host_address);
    free_memory.dismiss();
    destroy_buffer.dismiss();
    return result;
}

// The engine's VkBuffer over an import; narrows `type_bits` to the types it can be bound to.
Result<VkBuffer> VulkanImporter::create_import_buffer(std::uint64_t size, const std::string& where,
                                                      std::uint32_t& type_bits) {
    VkMemoryRequirements requirements{};
    Result<VkBuffer> created =
        create_buffer(size, params_.buffer_usage, true, requirements, "import " + where);
    if (!created) return created;
    VkBuffer buffer = created.value();
    Undo destroy([&] { fns_.destroy_buffer(params_.device, buffer, nullptr); });
    if (requirements.size > size)
        return make_error(ErrorKind::import_failed,
                          fmt::format("vulkan import {}: a buffer of {} bytes needs {} bytes of "
                                      "memory, more than the imported range",
                                      where, size, requirements.size));
    if ((type_bits & requirements.memoryTypeBits) == 0)
        return make_error(ErrorKind::import_failed,
                          fmt::format("vulkan import {}: no memory type is allowed both for the "
                                      "host pointer (memoryTypeBits {:#x}) and for a buffer of "
                                      "usage {:#x} (memoryTypeBits {:#x})",
                                      where, type_bits, params_.buffer_usage,
                                      requirements.memoryTypeBits));
    type_bits &= requirements.memoryTypeBits;
    destroy.dismiss();
    return buffer;
}

Result<VkDeviceMemory> VulkanImporter::import_memory(void* host_address, std::uint64_t size,
                                                     std::uint32_t type,
                                                     const std::string& where) {
    VkImportMemoryHostPointerInfoEXT import_info{
        VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, nullptr, host_handle_type,
        host_address};
    VkMemoryAllocateInfo allocate_info{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &import_info, size,
                                       type};
    VkDeviceMemory memory = VK_NULL_HANDLE;
    if (VkResult r = fns_.allocate_memory(params_.device, &allocate_info, nullptr, &memory);
        r != VK_SUCCESS)
        return vk_error(r, "vkAllocateMemory",
                        fmt::format("import {}, memory type {}", where, type));
    return memory;
}

ImportedBuffer VulkanImporter::remember(VkDeviceMemory memory, const Record& record,
                                        void* host_address) {
    {
        std::lock_guard lock(mutex_);
        records_.emplace(memory, record);
    }
    ImportedBuffer result;
    result.host_address = host_address; // null for a copy: it lives in device memory
    result.size = record.size;
    result.device_address = nullptr; // the device reaches it through the VkBuffer, not a pointer
    result.native_memory = handle_to_u64(memory);
    result.native_buffer = handle_to_u64(record.buffer);
    result.imported = record.imported;
    return result;
}

Result<VulkanImporter::Record> VulkanImporter::find(const ImportedBuffer& buffer, bool imported,
                                                    std::string_view what) const {
    VkDeviceMemory memory = vulkan_memory(buffer);
    std::lock_guard lock(mutex_);
    auto it = records_.find(memory);
    if (it == records_.end() || memory == VK_NULL_HANDLE)
        return make_error(
            ErrorKind::invalid_argument,
            fmt::format("vulkan {}: VkDeviceMemory {:#x} is not a live buffer of this "
                        "importer (never made here, or already released)",
                        what, buffer.native_memory));
    // The handle alone is not enough: a buffer that names a live VkDeviceMemory with another
    // size or VkBuffer is not the one this importer handed out, and releasing it would free the
    // real import under the tensors that still use it.
    if (it->second.size != buffer.size || it->second.buffer != vulkan_buffer(buffer))
        return make_error(
            ErrorKind::invalid_argument,
            fmt::format("vulkan {}: VkDeviceMemory {:#x} +{:#x} (VkBuffer {:#x}) does not match "
                        "the buffer this importer made (+{:#x}, VkBuffer {:#x})",
                        what, buffer.native_memory, buffer.size, buffer.native_buffer,
                        it->second.size, handle_to_u64(it->second.buffer)));
    if (it->second.imported != imported)
        return make_error(
            ErrorKind::invalid_argument,
            fmt::format("vulkan {}: VkDeviceMemory {:#x} came from {}", what, buffer.native_memory,
                        it->second.imported ? "import(); hand it to release()"
                                            : "allocate_copy(); hand it to free_copy()"));
    return it->second;
}

void VulkanImporter::destroy_record(VkDeviceMemory memory, const Record& record) noexcept {
    if (record.buffer != VK_NULL_HANDLE)
        fns_.destroy_buffer(params_.device, record.buffer, nullptr);
    fns_.free_memory(params_.device, memory, nullptr);
}

Status VulkanImporter::release_checked(const ImportedBuffer& buffer) noexcept {
    return destroy_buffer(buffer, true, "release");
}

Status VulkanImporter::destroy_buffer(const ImportedBuffer& buffer, bool imported,
                                      const char* operation) noexcept {
    return internal::status_nothrow([&]() -> Status {
        Result<Record> record = find(buffer, imported, operation);
        if (!record) return std::move(record).error();
        VkDeviceMemory memory = vulkan_memory(buffer);
        {
            std::lock_guard lock(mutex_);
            if (records_.erase(memory) == 0)
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("vulkan {}: VkDeviceMemory {:#x} was destroyed "
                                              "concurrently",
                                              operation, buffer.native_memory));
        }
        destroy_record(memory, record.value());
        return {};
    });
}

Result<VulkanImporterFacts> VulkanImporter::facts() const {
    if (!facts_read_)
        return make_error(
            ErrorKind::unsupported,
            fmt::format("vulkan importer never read its device: {}", unavailable_reason_));
    VulkanImporterFacts facts = facts_;
    facts.last_host_pointer_memory_type_bits = last_host_pointer_bits_.load();
    return facts;
}

} // namespace wm::vulkan

namespace wm {

Result<std::unique_ptr<Importer>> make_vulkan_importer(const VulkanImporterParams& params) {
    std::string missing;
    auto need = [&](bool present, const char* field) {
        if (!present) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", field);
    };
    need(params.instance != VK_NULL_HANDLE, "instance");
    need(params.physical_device != VK_NULL_HANDLE, "physical_device");
    need(params.device != VK_NULL_HANDLE, "device");
    need(params.get_instance_proc_addr != nullptr, "get_instance_proc_addr");
    if (!missing.empty())
        return make_error(
            ErrorKind::invalid_argument,
            fmt::format("make_vulkan_importer: VulkanImporterParams::{} must be set", missing));
    if (params.queue != VK_NULL_HANDLE && params.queue_family_index == VK_QUEUE_FAMILY_IGNORED)
        return make_error(ErrorKind::invalid_argument,
                          "make_vulkan_importer: VulkanImporterParams::queue is set but "
                          "queue_family_index is VK_QUEUE_FAMILY_IGNORED");
    return std::unique_ptr<Importer>(std::make_unique<vulkan::VulkanImporter>(params, nullptr));
}

Result<VulkanImporterFacts> vulkan_importer_facts(const Importer& importer) {
    const auto* vulkan_importer = dynamic_cast<const vulkan::VulkanImporter*>(&importer);
    if (vulkan_importer == nullptr)
        return make_error(ErrorKind::unsupported,
                          fmt::format("'{}' is not a Vulkan importer", importer.name()));
    return vulkan_importer->facts();
}

} // namespace wm
