// SPDX-License-Identifier: MIT
#include "vulkan/vk_test_device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>

#include <dlfcn.h>

#include <fmt/format.h>

#include "weightmap/memstat.hpp"

namespace wm::test {
namespace {

// --- the loader, dlopen()ed once per process ---------------------------------------------------
struct Loader {
    void* handle = nullptr;
    PFN_vkGetInstanceProcAddr gipa = nullptr;
    std::string error;
};

const Loader& loader() {
    static const Loader instance = [] {
        Loader l;
        l.handle = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
        if (l.handle == nullptr) {
            const char* e = dlerror();
            l.error = fmt::format("cannot load libvulkan.so.1: {}", e != nullptr ? e : "?");
            return l;
        }
        l.gipa =
            reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(l.handle, "vkGetInstanceProcAddr"));
        if (l.gipa == nullptr) l.error = "libvulkan.so.1 has no vkGetInstanceProcAddr";
        return l;
    }();
    return instance;
}

PFN_vkGetDeviceProcAddr real_gdpa = nullptr;

template <class Fn>
Fn instance_fn(VkInstance instance, const char* name) {
    auto fn = reinterpret_cast<Fn>(loader().gipa(instance, name));
    if (fn == nullptr) throw std::runtime_error(fmt::format("no instance function {}", name));
    return fn;
}

template <class Fn>
Fn device_fn(VkDevice device, const char* name) {
    auto fn = reinterpret_cast<Fn>(real_gdpa(device, name));
    if (fn == nullptr) throw std::runtime_error(fmt::format("no device function {}", name));
    return fn;
}

void check(VkResult r, const char* what) {
    if (r != VK_SUCCESS)
        throw std::runtime_error(fmt::format("{} failed: VkResult {}", what, static_cast<int>(r)));
}

template <class Handle>
std::uint64_t to_u64(Handle h) {
    if constexpr (std::is_pointer_v<Handle>)
        return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(h));
    else
        return static_cast<std::uint64_t>(h);
}

// --- the recorder ------------------------------------------------------------------------------
std::mutex recorder_mutex;
std::vector<DriverCall> recorded;
std::map<DriverCall::Kind, std::pair<VkResult, int>> injected;
std::int64_t live = 0;

// Returns the injected result for `kind`, or VK_SUCCESS to call the driver.
VkResult take_injection(DriverCall::Kind kind) {
    auto it = injected.find(kind);
    if (it == injected.end() || it->second.second <= 0) return VK_SUCCESS;
    --it->second.second;
    return it->second.first;
}

VKAPI_ATTR VkResult VKAPI_CALL
record_host_pointer_properties(VkDevice device, VkExternalMemoryHandleTypeFlagBits type,
                               const void* pointer, VkMemoryHostPointerPropertiesEXT* properties) {
    DriverCall call{DriverCall::Kind::host_pointer_properties};
    call.host_pointer = pointer;
    {
        std::lock_guard lock(recorder_mutex);
        call.result = take_injection(call.kind);
    }
    if (call.result == VK_SUCCESS)
        call.result = device_fn<PFN_vkGetMemoryHostPointerPropertiesEXT>(
            device, "vkGetMemoryHostPointerPropertiesEXT")(device, type, pointer, properties);
    std::lock_guard lock(recorder_mutex);
    recorded.push_back(call);
    return call.result;
}

VKAPI_ATTR VkResult VKAPI_CALL record_allocate_memory(VkDevice device,
                                                      const VkMemoryAllocateInfo* info,
                                                      const VkAllocationCallbacks* allocator,
                                                      VkDeviceMemory* memory) {
    DriverCall call{DriverCall::Kind::allocate_memory};
    call.size = info->allocationSize;
    call.memory_type = info->memoryTypeIndex;
    for (auto* next = static_cast<const VkBaseInStructure*>(info->pNext); next != nullptr;
         next = next->pNext) {
        if (next->sType == VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT) {
            call.import = true;
            call.host_pointer =
                reinterpret_cast<const VkImportMemoryHostPointerInfoEXT*>(next)->pHostPointer;
        }
    }
    {
        std::lock_guard lock(recorder_mutex);
        call.result = take_injection(call.kind);
    }
    if (call.result == VK_SUCCESS) {
        call.result = device_fn<PFN_vkAllocateMemory>(device, "vkAllocateMemory")(
            device, info, allocator, memory);
        if (call.result == VK_SUCCESS) call.handle = to_u64(*memory);
    }
    std::lock_guard lock(recorder_mutex);
    if (call.result == VK_SUCCESS) ++live;
    recorded.push_back(call);
    return call.result;
}

VKAPI_ATTR void VKAPI_CALL record_free_memory(VkDevice device, VkDeviceMemory memory,
                                              const VkAllocationCallbacks* allocator) {
    device_fn<PFN_vkFreeMemory>(device, "vkFreeMemory")(device, memory, allocator);
    DriverCall call{DriverCall::Kind::free_memory};
    call.handle = to_u64(memory);
    std::lock_guard lock(recorder_mutex);
    if (memory != VK_NULL_HANDLE) --live;
    recorded.push_back(call);
}

VKAPI_ATTR VkResult VKAPI_CALL record_create_buffer(VkDevice device, const VkBufferCreateInfo* info,
                                                    const VkAllocationCallbacks* allocator,
                                                    VkBuffer* buffer) {
    DriverCall call{DriverCall::Kind::create_buffer};
    call.size = info->size;
    {
        std::lock_guard lock(recorder_mutex);
        call.result = take_injection(call.kind);
    }
    if (call.result == VK_SUCCESS) {
        call.result = device_fn<PFN_vkCreateBuffer>(device, "vkCreateBuffer")(device, info,
                                                                              allocator, buffer);
        if (call.result == VK_SUCCESS) call.handle = to_u64(*buffer);
    }
    std::lock_guard lock(recorder_mutex);
    if (call.result == VK_SUCCESS) ++live;
    recorded.push_back(call);
    return call.result;
}

VKAPI_ATTR void VKAPI_CALL record_destroy_buffer(VkDevice device, VkBuffer buffer,
                                                 const VkAllocationCallbacks* allocator) {
    device_fn<PFN_vkDestroyBuffer>(device, "vkDestroyBuffer")(device, buffer, allocator);
    DriverCall call{DriverCall::Kind::destroy_buffer};
    call.handle = to_u64(buffer);
    std::lock_guard lock(recorder_mutex);
    if (buffer != VK_NULL_HANDLE) --live;
    recorded.push_back(call);
}

VKAPI_ATTR VkResult VKAPI_CALL record_bind_buffer_memory(VkDevice device, VkBuffer buffer,
                                                         VkDeviceMemory memory,
                                                         VkDeviceSize offset) {
    DriverCall call{DriverCall::Kind::bind_buffer_memory};
    call.handle = to_u64(memory);
    call.size = offset;
    {
        std::lock_guard lock(recorder_mutex);
        call.result = take_injection(call.kind);
    }
    if (call.result == VK_SUCCESS)
        call.result = device_fn<PFN_vkBindBufferMemory>(device, "vkBindBufferMemory")(
            device, buffer, memory, offset);
    std::lock_guard lock(recorder_mutex);
    recorded.push_back(call);
    return call.result;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL recording_gdpa(VkDevice device, const char* name) {
    PFN_vkVoidFunction real = real_gdpa(device, name);
    // Keep the driver's answer for what it does not expose (a disabled extension stays null).
    if (real == nullptr) return nullptr;
    const std::string_view n(name);
    if (n == "vkGetMemoryHostPointerPropertiesEXT")
        return reinterpret_cast<PFN_vkVoidFunction>(&record_host_pointer_properties);
    if (n == "vkAllocateMemory")
        return reinterpret_cast<PFN_vkVoidFunction>(&record_allocate_memory);
    if (n == "vkFreeMemory") return reinterpret_cast<PFN_vkVoidFunction>(&record_free_memory);
    if (n == "vkCreateBuffer") return reinterpret_cast<PFN_vkVoidFunction>(&record_create_buffer);
    if (n == "vkDestroyBuffer") return reinterpret_cast<PFN_vkVoidFunction>(&record_destroy_buffer);
    if (n == "vkBindBufferMemory")
        return reinterpret_cast<PFN_vkVoidFunction>(&record_bind_buffer_memory);
    return real;
}

} // namespace

void skip_test(const std::string& reason) {
    std::printf("SKIP: %s\n", reason.c_str());
    std::fflush(stdout);
    std::exit(skip_exit_code);
}

std::unique_ptr<VkTestDevice> VkTestDevice::create_or_skip(const VkTestDeviceOptions& options) {
    const Loader& l = loader();
    if (l.gipa == nullptr) skip_test("no Vulkan device: " + l.error);
    real_gdpa =
        reinterpret_cast<PFN_vkGetDeviceProcAddr>(l.gipa(VK_NULL_HANDLE, "vkGetDeviceProcAddr"));

    std::unique_ptr<VkTestDevice> d(new VkTestDevice());
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "weightmap-tests";
    app.apiVersion = VK_API_VERSION_1_3;
    VkInstanceCreateInfo instance_info{};
    instance_info.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    instance_info.pApplicationInfo = &app;
    auto create_instance = instance_fn<PFN_vkCreateInstance>(VK_NULL_HANDLE, "vkCreateInstance");
    if (VkResult r = create_instance(&instance_info, nullptr, &d->instance); r != VK_SUCCESS) {
        d->instance = VK_NULL_HANDLE;
        if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
            skip_test("no Vulkan device: vkCreateInstance found no driver "
                      "(VK_ERROR_INCOMPATIBLE_DRIVER)");
        check(r, "vkCreateInstance");
    }
    real_gdpa = instance_fn<PFN_vkGetDeviceProcAddr>(d->instance, "vkGetDeviceProcAddr");

    auto enumerate =
        instance_fn<PFN_vkEnumeratePhysicalDevices>(d->instance, "vkEnumeratePhysicalDevices");
    std::uint32_t count = 0;
    VkResult enumerated = enumerate(d->instance, &count, nullptr);
    // The loader answers VK_ERROR_INITIALIZATION_FAILED when every driver it found has no device
    // (measured: only Mesa's radv ICD, no AMD GPU).
    if (enumerated == VK_ERROR_INITIALIZATION_FAILED)
        skip_test("no Vulkan device: vkEnumeratePhysicalDevices: no driver found a device "
                  "(VK_ERROR_INITIALIZATION_FAILED)");
    check(enumerated, "vkEnumeratePhysicalDevices");
    if (count == 0) skip_test("no Vulkan device: vkEnumeratePhysicalDevices found none");
    std::vector<VkPhysicalDevice> devices(count);
    check(enumerate(d->instance, &count, devices.data()), "vkEnumeratePhysicalDevices");

    auto get_properties2 = instance_fn<PFN_vkGetPhysicalDeviceProperties2>(
        d->instance, "vkGetPhysicalDeviceProperties2");
    auto enumerate_extensions = instance_fn<PFN_vkEnumerateDeviceExtensionProperties>(
        d->instance, "vkEnumerateDeviceExtensionProperties");
    std::string seen;
    int best = -1;
    for (std::uint32_t i = 0; i < count; ++i) {
        std::uint32_t n = 0;
        check(enumerate_extensions(devices[i], nullptr, &n, nullptr),
              "vkEnumerateDeviceExtensionProperties");
        std::vector<VkExtensionProperties> extensions(n);
        check(enumerate_extensions(devices[i], nullptr, &n, extensions.data()),
              "vkEnumerateDeviceExtensionProperties");
        bool has =
            std::any_of(extensions.begin(), extensions.end(), [](const VkExtensionProperties& e) {
                return std::strcmp(e.extensionName, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) ==
                       0;
            });
        VkPhysicalDeviceDriverProperties driver{};
        driver.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES;
        VkPhysicalDeviceProperties2 properties{};
        properties.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
        properties.pNext = &driver;
        get_properties2(devices[i], &properties);
        seen +=
            fmt::format(" '{}'{}", properties.properties.deviceName, has ? "" : " (no extension)");
        if (!has) continue;
        if (best < 0 || driver.driverID == VK_DRIVER_ID_MESA_LLVMPIPE) best = static_cast<int>(i);
    }
    if (best < 0)
        throw std::runtime_error(fmt::format("no Vulkan device supports {}:{}",
                                             VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME, seen));
    d->physical_device = devices[static_cast<std::size_t>(best)];

    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host{};
    host.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT;
    VkPhysicalDeviceMaintenance3Properties maintenance3{};
    maintenance3.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES;
    maintenance3.pNext = &host;
    VkPhysicalDeviceDriverProperties driver{};
    driver.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES;
    driver.pNext = &maintenance3;
    VkPhysicalDeviceProperties2 properties{};
    properties.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2;
    properties.pNext = &driver;
    get_properties2(d->physical_device, &properties);
    d->driver_id = driver.driverID;
    d->device_name = properties.properties.deviceName;
    d->min_imported_host_pointer_alignment = host.minImportedHostPointerAlignment;
    d->max_memory_allocation_size = maintenance3.maxMemoryAllocationSize;
    d->max_storage_buffer_range = properties.properties.limits.maxStorageBufferRange;
    instance_fn<PFN_vkGetPhysicalDeviceMemoryProperties>(
        d->instance, "vkGetPhysicalDeviceMemoryProperties")(d->physical_device,
                                                            &d->memory_properties);

    auto get_families = instance_fn<PFN_vkGetPhysicalDeviceQueueFamilyProperties>(
        d->instance, "vkGetPhysicalDeviceQueueFamilyProperties");
    std::uint32_t families = 0;
    get_families(d->physical_device, &families, nullptr);
    std::vector<VkQueueFamilyProperties> family_properties(families);
    get_families(d->physical_device, &families, family_properties.data());
    d->queue_family = families;
    for (std::uint32_t i = 0; i < families && d->queue_family == families; ++i)
        if (family_properties[i].queueCount > 0 &&
            (family_properties[i].queueFlags &
             (VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT | VK_QUEUE_TRANSFER_BIT)) != 0)
            d->queue_family = i;
    if (d->queue_family == families) throw std::runtime_error("no queue family with transfers");

    const float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info{};
    queue_info.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    queue_info.queueFamilyIndex = d->queue_family;
    queue_info.queueCount = 1;
    queue_info.pQueuePriorities = &priority;
    const char* extension = VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME;
    VkDeviceCreateInfo device_info{};
    device_info.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    device_info.queueCreateInfoCount = 1;
    device_info.pQueueCreateInfos = &queue_info;
    if (options.enable_external_memory_host) {
        device_info.enabledExtensionCount = 1;
        device_info.ppEnabledExtensionNames = &extension;
    }
    check(instance_fn<PFN_vkCreateDevice>(d->instance, "vkCreateDevice")(
              d->physical_device, &device_info, nullptr, &d->device),
          "vkCreateDevice");
    d->external_memory_host_enabled = options.enable_external_memory_host;
    device_fn<PFN_vkGetDeviceQueue>(d->device, "vkGetDeviceQueue")(d->device, d->queue_family, 0,
                                                                   &d->queue);
    return d;
}

VkTestDevice::~VkTestDevice() {
    if (device != VK_NULL_HANDLE) {
        device_fn<PFN_vkDeviceWaitIdle>(device, "vkDeviceWaitIdle")(device);
        device_fn<PFN_vkDestroyDevice>(device, "vkDestroyDevice")(device, nullptr);
    }
    if (instance != VK_NULL_HANDLE)
        instance_fn<PFN_vkDestroyInstance>(instance, "vkDestroyInstance")(instance, nullptr);
}

VulkanImporterParams VkTestDevice::importer_params(VkBufferUsageFlags usage, bool recording) const {
    VulkanImporterParams params;
    params.instance = instance;
    params.physical_device = physical_device;
    params.device = device;
    params.get_instance_proc_addr = loader().gipa;
    params.get_device_proc_addr = recording ? &recording_gdpa : real_gdpa;
    params.external_memory_host_enabled = external_memory_host_enabled;
    params.queue_family_index = queue_family;
    params.queue = queue;
    params.buffer_usage = usage;
    return params;
}

int VkTestDevice::host_visible_type(std::uint32_t bits) const {
    for (std::uint32_t i = 0; i < memory_properties.memoryTypeCount; ++i)
        if ((bits & (1u << i)) != 0 &&
            (memory_properties.memoryTypes[i].propertyFlags &
             (VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) ==
                (VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT))
            return static_cast<int>(i);
    throw std::runtime_error("no host-visible coherent memory type for the read-back buffer");
}

void VkTestDevice::submit_and_wait(VkCommandBuffer cmd) {
    VkSubmitInfo submit{};
    submit.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cmd;
    check(device_fn<PFN_vkQueueSubmit>(device, "vkQueueSubmit")(queue, 1, &submit, VK_NULL_HANDLE),
          "vkQueueSubmit");
    check(device_fn<PFN_vkQueueWaitIdle>(device, "vkQueueWaitIdle")(queue), "vkQueueWaitIdle");
}

namespace {
// A one-shot command buffer on a pool of its own.
struct OneShot {
    VkDevice device;
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    OneShot(VkDevice d, std::uint32_t family) : device(d) {
        VkCommandPoolCreateInfo pool_info{};
        pool_info.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
        pool_info.queueFamilyIndex = family;
        check(device_fn<PFN_vkCreateCommandPool>(d, "vkCreateCommandPool")(d, &pool_info, nullptr,
                                                                           &pool),
              "vkCreateCommandPool");
        VkCommandBufferAllocateInfo info{};
        info.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
        info.commandPool = pool;
        info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        info.commandBufferCount = 1;
        check(
            device_fn<PFN_vkAllocateCommandBuffers>(d, "vkAllocateCommandBuffers")(d, &info, &cmd),
            "vkAllocateCommandBuffers");
        VkCommandBufferBeginInfo begin{};
        begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
        check(device_fn<PFN_vkBeginCommandBuffer>(d, "vkBeginCommandBuffer")(cmd, &begin),
              "vkBeginCommandBuffer");
    }
    void end() {
        check(device_fn<PFN_vkEndCommandBuffer>(device, "vkEndCommandBuffer")(cmd),
              "vkEndCommandBuffer");
    }
    ~OneShot() {
        device_fn<PFN_vkDestroyCommandPool>(device, "vkDestroyCommandPool")(device, pool, nullptr);
    }
};
} // namespace

std::vector<std::uint8_t> VkTestDevice::copy_out(VkBuffer source, std::uint64_t offset,
                                                 std::uint64_t size) {
    VkBufferCreateInfo buffer_info{};
    buffer_info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    buffer_info.size = size;
    buffer_info.usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    VkBuffer target = VK_NULL_HANDLE;
    check(device_fn<PFN_vkCreateBuffer>(device, "vkCreateBuffer")(device, &buffer_info, nullptr,
                                                                  &target),
          "vkCreateBuffer");
    VkMemoryRequirements requirements{};
    device_fn<PFN_vkGetBufferMemoryRequirements>(device, "vkGetBufferMemoryRequirements")(
        device, target, &requirements);
    VkMemoryAllocateInfo allocate{};
    allocate.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    allocate.allocationSize = requirements.size;
    allocate.memoryTypeIndex =
        static_cast<std::uint32_t>(host_visible_type(requirements.memoryTypeBits));
    VkDeviceMemory memory = VK_NULL_HANDLE;
    check(device_fn<PFN_vkAllocateMemory>(device, "vkAllocateMemory")(device, &allocate, nullptr,
                                                                      &memory),
          "vkAllocateMemory");
    std::vector<std::uint8_t> bytes;
    try {
        check(device_fn<PFN_vkBindBufferMemory>(device, "vkBindBufferMemory")(device, target,
                                                                              memory, 0),
              "vkBindBufferMemory");
        {
            OneShot shot(device, queue_family);
            VkBufferCopy region{offset, 0, size};
            device_fn<PFN_vkCmdCopyBuffer>(device, "vkCmdCopyBuffer")(shot.cmd, source, target, 1,
                                                                      &region);
            shot.end();
            submit_and_wait(shot.cmd);
        }
        void* mapped = nullptr;
        check(device_fn<PFN_vkMapMemory>(device, "vkMapMemory")(device, memory, 0, VK_WHOLE_SIZE, 0,
                                                                &mapped),
              "vkMapMemory");
        bytes.assign(static_cast<const std::uint8_t*>(mapped),
                     static_cast<const std::uint8_t*>(mapped) + size);
        device_fn<PFN_vkUnmapMemory>(device, "vkUnmapMemory")(device, memory);
    } catch (...) {
        device_fn<PFN_vkDestroyBuffer>(device, "vkDestroyBuffer")(device, target, nullptr);
        device_fn<PFN_vkFreeMemory>(device, "vkFreeMemory")(device, memory, nullptr);
        throw;
    }
    device_fn<PFN_vkDestroyBuffer>(device, "vkDestroyBuffer")(device, target, nullptr);
    device_fn<PFN_vkFreeMemory>(device, "vkFreeMemory")(device, memory, nullptr);
    return bytes;
}

void VkTestDevice::fill(VkBuffer target, std::uint64_t offset, std::uint64_t size,
                        std::uint32_t value) {
    OneShot shot(device, queue_family);
    device_fn<PFN_vkCmdFillBuffer>(device, "vkCmdFillBuffer")(shot.cmd, target, offset, size,
                                                              value);
    shot.end();
    submit_and_wait(shot.cmd);
}

namespace recorder {
void reset() {
    std::lock_guard lock(recorder_mutex);
    recorded.clear();
    injected.clear();
}
std::vector<DriverCall> calls() {
    std::lock_guard lock(recorder_mutex);
    return recorded;
}
std::vector<DriverCall> calls_of(DriverCall::Kind kind) {
    std::vector<DriverCall> out;
    for (const DriverCall& c : calls())
        if (c.kind == kind) out.push_back(c);
    return out;
}
void inject(DriverCall::Kind kind, VkResult result, int count) {
    std::lock_guard lock(recorder_mutex);
    injected[kind] = {result, count};
}
std::int64_t live_objects() {
    std::lock_guard lock(recorder_mutex);
    return live;
}
} // namespace recorder

std::uint64_t rss_anon_bytes() {
    MemStat stat = read_memstat();
    if (!stat.rss_anon) throw std::runtime_error("RssAnon not reported by /proc/self/status");
    return *stat.rss_anon;
}

MappedModel map_file(const std::string& path, MappingAccess access) {
    std::vector<std::string> paths{path};
    Result<MappedModel> mapped = MappedModel::open(paths, access);
    if (!mapped) throw std::runtime_error(mapped.error().message);
    return std::move(mapped).value();
}

} // namespace wm::test
