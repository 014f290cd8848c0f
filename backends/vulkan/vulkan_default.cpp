// SPDX-License-Identifier: MIT
// The registry's default Vulkan importer: its own loader (dlopen), instance and device.
//
// Engines hand make_vulkan_importer() their own device; this variant is for wm-load, the tests
// and the conformance run, which have no engine. It never links the loader, so a machine
// without libvulkan.so.1 still runs the library (the importer just says why it is unavailable).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <dlfcn.h>

#include <fmt/format.h>

#include "backend_factories.hpp"
#include "vulkan_result.hpp"
#include "vulkan_importer.hpp"

namespace wm {
namespace {

constexpr const char* loader_name = "libvulkan.so.1";

// What the default importer owns, destroyed after the importer freed everything it made.
class OwnedDevice final : public vulkan::OwnedVulkan {
public:
    ~OwnedDevice() override {
        if (device != VK_NULL_HANDLE && destroy_device != nullptr) destroy_device(device, nullptr);
        if (instance != VK_NULL_HANDLE && destroy_instance != nullptr)
            destroy_instance(instance, nullptr);
        if (loader != nullptr) dlclose(loader);
    }
    void* loader = nullptr;
    VkInstance instance = VK_NULL_HANDLE;
    VkDevice device = VK_NULL_HANDLE;
    PFN_vkDestroyInstance destroy_instance = nullptr;
    PFN_vkDestroyDevice destroy_device = nullptr;
};

std::unique_ptr<Importer> unavailable(std::string reason) {
    return std::make_unique<vulkan::VulkanImporter>(std::move(reason));
}

template <class Fn>
Fn instance_fn(PFN_vkGetInstanceProcAddr gipa, VkInstance instance, const char* name) {
    return reinterpret_cast<Fn>(gipa(instance, name));
}

// Why the importer cannot be made: becomes the unavailable importer's reason.
Error refused(std::string reason) { return make_error(ErrorKind::unsupported, std::move(reason)); }

// The instance functions the default importer calls itself (the importer resolves its own).
struct InstanceFns {
    PFN_vkEnumeratePhysicalDevices enumerate_devices = nullptr;
    PFN_vkGetPhysicalDeviceProperties get_properties = nullptr;
    PFN_vkEnumerateDeviceExtensionProperties enumerate_extensions = nullptr;
    PFN_vkGetPhysicalDeviceQueueFamilyProperties get_queue_families = nullptr;
    PFN_vkCreateDevice create_device = nullptr;
    PFN_vkGetDeviceProcAddr get_device_proc_addr = nullptr;
};

// The physical device and queue family the default importer uses.
struct Choice {
    VkPhysicalDevice device = VK_NULL_HANDLE;
    std::uint32_t queue_family = VK_QUEUE_FAMILY_IGNORED;
};

Result<PFN_vkGetInstanceProcAddr> load_loader(OwnedDevice& owned) {
    // RTLD_LOCAL: the engine may load its own Vulkan loader too; ours must not interpose on it.
    owned.loader = dlopen(loader_name, RTLD_NOW | RTLD_LOCAL);
    if (owned.loader == nullptr) {
        const char* why = dlerror();
        return refused(fmt::format("cannot load the Vulkan loader {}: {} (Debian: libvulkan1)",
                                   loader_name, why != nullptr ? why : "unknown error"));
    }
    auto gipa =
        reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(owned.loader, "vkGetInstanceProcAddr"));
    if (gipa == nullptr) return refused(fmt::format("{} has no vkGetInstanceProcAddr", loader_name));
    auto enumerate_version = instance_fn<PFN_vkEnumerateInstanceVersion>(
        gipa, VK_NULL_HANDLE, "vkEnumerateInstanceVersion");
    std::uint32_t loader_version = VK_API_VERSION_1_0;
    if (enumerate_version != nullptr && enumerate_version(&loader_version) != VK_SUCCESS)
        loader_version = VK_API_VERSION_1_0;
    if (loader_version < VK_API_VERSION_1_1)
        return refused(fmt::format(
            "the Vulkan loader supports {}.{} only; the importer needs 1.1",
            VK_API_VERSION_MAJOR(loader_version), VK_API_VERSION_MINOR(loader_version)));
    return gipa;
}

Status create_instance(PFN_vkGetInstanceProcAddr gipa, OwnedDevice& owned) {
    auto create = instance_fn<PFN_vkCreateInstance>(gipa, VK_NULL_HANDLE, "vkCreateInstance");
    if (create == nullptr) return refused("vkGetInstanceProcAddr returned null for vkCreateInstance");
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = "libweightmap";
    app.pEngineName = "libweightmap";
    // A 1.1+ loader accepts a newer apiVersion than a device has; 1.3 lets us chain the
    // maintenance4 and driver-properties structures where the device has them.
    app.apiVersion = VK_API_VERSION_1_3;
    VkInstanceCreateInfo instance_info{};
    instance_info.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    instance_info.pApplicationInfo = &app;
    if (VkResult r = create(&instance_info, nullptr, &owned.instance); r != VK_SUCCESS) {
        owned.instance = VK_NULL_HANDLE;
        return refused(fmt::format("vkCreateInstance failed: {}", vulkan::result_name(r)));
    }
    owned.destroy_instance =
        instance_fn<PFN_vkDestroyInstance>(gipa, owned.instance, "vkDestroyInstance");
    return {};
}

Result<InstanceFns> resolve_instance_fns(PFN_vkGetInstanceProcAddr gipa, const OwnedDevice& owned) {
    VkInstance instance = owned.instance;
    InstanceFns fns;
    fns.enumerate_devices =
        instance_fn<PFN_vkEnumeratePhysicalDevices>(gipa, instance, "vkEnumeratePhysicalDevices");
    fns.get_properties = instance_fn<PFN_vkGetPhysicalDeviceProperties>(
        gipa, instance, "vkGetPhysicalDeviceProperties");
    fns.enumerate_extensions = instance_fn<PFN_vkEnumerateDeviceExtensionProperties>(
        gipa, instance, "vkEnumerateDeviceExtensionProperties");
    fns.get_queue_families = instance_fn<PFN_vkGetPhysicalDeviceQueueFamilyProperties>(
        gipa, instance, "vkGetPhysicalDeviceQueueFamilyProperties");
    fns.create_device = instance_fn<PFN_vkCreateDevice>(gipa, instance, "vkCreateDevice");
    fns.get_device_proc_addr =
        instance_fn<PFN_vkGetDeviceProcAddr>(gipa, instance, "vkGetDeviceProcAddr");
    if (owned.destroy_instance == nullptr || fns.enumerate_devices == nullptr ||
        fns.get_properties == nullptr || fns.enumerate_extensions == nullptr ||
        fns.get_queue_families == nullptr || fns.create_device == nullptr ||
        fns.get_device_proc_addr == nullptr)
        return refused("vkGetInstanceProcAddr returned null for a Vulkan 1.0 instance function");
    return fns;
}

Result<std::vector<VkPhysicalDevice>> physical_devices(const InstanceFns& fns,
                                                       VkInstance instance) {
    std::uint32_t count = 0;
    VkResult r = fns.enumerate_devices(instance, &count, nullptr);
    std::vector<VkPhysicalDevice> devices(count);
    if (r == VK_SUCCESS && count != 0) r = fns.enumerate_devices(instance, &count, devices.data());
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        return refused(
            fmt::format("vkEnumeratePhysicalDevices failed: {}", vulkan::result_name(r)));
    devices.resize(count);
    if (devices.empty())
        return refused("no Vulkan physical device (the loader found no driver; Debian's "
                       "mesa-vulkan-drivers provides lavapipe)");
    return devices;
}

bool has_host_extension(const InstanceFns& fns, VkPhysicalDevice candidate) {
    std::uint32_t n = 0;
    std::vector<VkExtensionProperties> extensions;
    if (fns.enumerate_extensions(candidate, nullptr, &n, nullptr) == VK_SUCCESS) {
        extensions.resize(n);
        if (fns.enumerate_extensions(candidate, nullptr, &n, extensions.data()) != VK_SUCCESS)
            n = 0;
        extensions.resize(n);
    }
    bool has_extension = false;
    for (const VkExtensionProperties& e : extensions)
        has_extension |=
            std::strcmp(e.extensionName, VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME) == 0;
    return has_extension;
}

// The first queue family with a queue that can transfer, or VK_QUEUE_FAMILY_IGNORED.
std::uint32_t transfer_family(const InstanceFns& fns, VkPhysicalDevice candidate) {
    std::uint32_t families = 0;
    fns.get_queue_families(candidate, &families, nullptr);
    std::vector<VkQueueFamilyProperties> family_properties(families);
    fns.get_queue_families(candidate, &families, family_properties.data());
    for (std::uint32_t i = 0; i < families; ++i)
        if (family_properties[i].queueCount > 0 &&
            (family_properties[i].queueFlags &
             (VK_QUEUE_TRANSFER_BIT | VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT)) != 0)
            return i;
    return VK_QUEUE_FAMILY_IGNORED;
}

// The first device, in the loader's order, with the extension, Vulkan 1.1 and a queue.
Result<Choice> choose_device(const InstanceFns& fns, const std::vector<VkPhysicalDevice>& devices) {
    std::string refusals;
    for (VkPhysicalDevice candidate : devices) {
        VkPhysicalDeviceProperties properties{};
        fns.get_properties(candidate, &properties);
        const bool has_extension = has_host_extension(fns, candidate);
        const std::uint32_t family = transfer_family(fns, candidate);
        std::string why;
        if (properties.apiVersion < VK_API_VERSION_1_1)
            why = "Vulkan 1.0 only";
        else if (!has_extension)
            why = fmt::format("no {}", VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
        else if (family == VK_QUEUE_FAMILY_IGNORED)
            why = "no queue family";
        if (why.empty()) return Choice{candidate, family};
        refusals +=
            fmt::format("{}'{}': {}", refusals.empty() ? "" : "; ", properties.deviceName, why);
    }
    return refused(fmt::format("no Vulkan device can import host memory ({})", refusals));
}

// A device with the extension and one queue of the chosen family; returns that queue.
Result<VkQueue> create_device(const InstanceFns& fns, const Choice& choice, OwnedDevice& owned) {
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info{};
    queue_info.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    queue_info.queueFamilyIndex = choice.queue_family;
    queue_info.queueCount = 1;
    queue_info.pQueuePriorities = &priority;
    const char* extension = VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME;
    VkDeviceCreateInfo device_info{};
    device_info.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    device_info.queueCreateInfoCount = 1;
    device_info.pQueueCreateInfos = &queue_info;
    device_info.enabledExtensionCount = 1;
    device_info.ppEnabledExtensionNames = &extension;
    if (VkResult r = fns.create_device(choice.device, &device_info, nullptr, &owned.device);
        r != VK_SUCCESS) {
        owned.device = VK_NULL_HANDLE;
        return refused(fmt::format("vkCreateDevice with {} failed: {}",
                                   VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME,
                                   vulkan::result_name(r)));
    }
    owned.destroy_device = reinterpret_cast<PFN_vkDestroyDevice>(
        fns.get_device_proc_addr(owned.device, "vkDestroyDevice"));
    auto get_queue = reinterpret_cast<PFN_vkGetDeviceQueue>(
        fns.get_device_proc_addr(owned.device, "vkGetDeviceQueue"));
    if (owned.destroy_device == nullptr || get_queue == nullptr)
        return refused("vkGetDeviceProcAddr returned null for vkDestroyDevice or vkGetDeviceQueue");
    VkQueue queue = VK_NULL_HANDLE;
    get_queue(owned.device, choice.queue_family, 0, &queue);
    return queue;
}

} // namespace

std::unique_ptr<Importer> create_default_vulkan_importer() {
    auto owned = std::make_unique<OwnedDevice>();
    Result<PFN_vkGetInstanceProcAddr> gipa = load_loader(*owned);
    if (!gipa) return unavailable(std::move(gipa).error().message);
    if (Status s = create_instance(gipa.value(), *owned); !s)
        return unavailable(std::move(s).error().message);
    Result<InstanceFns> fns = resolve_instance_fns(gipa.value(), *owned);
    if (!fns) return unavailable(std::move(fns).error().message);
    Result<std::vector<VkPhysicalDevice>> devices = physical_devices(fns.value(), owned->instance);
    if (!devices) return unavailable(std::move(devices).error().message);
    Result<Choice> choice = choose_device(fns.value(), devices.value());
    if (!choice) return unavailable(std::move(choice).error().message);
    Result<VkQueue> queue = create_device(fns.value(), choice.value(), *owned);
    if (!queue) return unavailable(std::move(queue).error().message);

    VulkanImporterParams params;
    params.instance = owned->instance;
    params.physical_device = choice->device;
    params.device = owned->device;
    params.get_instance_proc_addr = gipa.value();
    params.get_device_proc_addr = fns->get_device_proc_addr;
    params.external_memory_host_enabled = true;
    params.queue_family_index = choice->queue_family;
    params.queue = queue.value();
    // Transfer source, so read_back() copies straight from the import; no storage usage, so the
    // largest import is maxMemoryAllocationSize rather than maxStorageBufferRange.
    params.buffer_usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
    // Its creation probes file-page imports on this device, as for an engine's device.
    return std::make_unique<vulkan::VulkanImporter>(params, std::move(owned));
}

} // namespace wm
