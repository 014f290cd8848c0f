// SPDX-License-Identifier: MIT
// The Vulkan conformance subjects, on the machine's device (lavapipe in CI):
//   vulkan-default: wm::create_importer("vulkan"), an instance and device of the library's own
//                   (no driver counters: its device functions cannot be interposed);
//   vulkan-engine:  wm::make_vulkan_importer over the tests' own device (tests/vulkan), every
//                   device function through the recording vkGetDeviceProcAddr wrapper.
// No Vulkan device at all (no loader, no driver, no physical device: probed here, before the
// test device's create_or_skip() would exit): every case of both subjects WARNs "SKIP ..." and
// the report says so (the executable then exits 77, meson's SKIP). With a device, both subjects
// must run: a device without VK_EXT_external_memory_host, or an unavailable default importer,
// fails, it does not skip (as in tests/vulkan).
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <dlfcn.h>

#include "conformance/subject.hpp"
#include "vulkan/vk_test_device.hpp"
#include "weightmap/backends/vulkan.hpp"
#include "weightmap/registry.hpp"

namespace wm::conformance {
namespace {

namespace recorder = wm::test::recorder;
using wm::test::DriverCall;
using wm::test::VkTestDevice;

/// Why no Vulkan subject can run here, or empty when there is a physical device: the same
/// three questions as VkTestDevice::create_or_skip(), asked without exiting. Probed once.
std::string no_vulkan_device() {
    static const std::string reason = []() -> std::string {
        void* loader = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
        if (loader == nullptr) {
            const char* e = dlerror();
            return std::string("no Vulkan device: cannot load libvulkan.so.1: ") +
                   (e != nullptr ? e : "?");
        }
        auto gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(
            dlsym(loader, "vkGetInstanceProcAddr"));
        if (gipa == nullptr) return "no Vulkan device: libvulkan.so.1 has no vkGetInstanceProcAddr";
        auto create = reinterpret_cast<PFN_vkCreateInstance>(
            gipa(VK_NULL_HANDLE, "vkCreateInstance"));
        if (create == nullptr) return "no Vulkan device: the loader has no vkCreateInstance";
        VkApplicationInfo app{};
        app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
        app.pApplicationName = "weightmap-conformance-probe";
        app.apiVersion = VK_API_VERSION_1_1;
        VkInstanceCreateInfo info{};
        info.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
        info.pApplicationInfo = &app;
        VkInstance instance = VK_NULL_HANDLE;
        const VkResult created = create(&info, nullptr, &instance);
        if (created != VK_SUCCESS)
            return "no Vulkan device: vkCreateInstance returned VkResult " +
                   std::to_string(static_cast<int>(created)) +
                   (created == VK_ERROR_INCOMPATIBLE_DRIVER ? " (VK_ERROR_INCOMPATIBLE_DRIVER: no "
                                                              "driver)"
                                                            : "");
        auto enumerate = reinterpret_cast<PFN_vkEnumeratePhysicalDevices>(
            gipa(instance, "vkEnumeratePhysicalDevices"));
        auto destroy =
            reinterpret_cast<PFN_vkDestroyInstance>(gipa(instance, "vkDestroyInstance"));
        std::uint32_t count = 0;
        const VkResult enumerated =
            enumerate != nullptr ? enumerate(instance, &count, nullptr) : VK_ERROR_UNKNOWN;
        if (destroy != nullptr) destroy(instance, nullptr);
        // The loader stays loaded: the test device's own dlopen shares it.
        if (enumerated == VK_ERROR_INITIALIZATION_FAILED)
            return "no Vulkan device: vkEnumeratePhysicalDevices: no driver found a device "
                   "(VK_ERROR_INITIALIZATION_FAILED)";
        if (enumerated != VK_SUCCESS && enumerated != VK_INCOMPLETE)
            return "no Vulkan device: vkEnumeratePhysicalDevices returned VkResult " +
                   std::to_string(static_cast<int>(enumerated));
        if (count == 0) return "no Vulkan device: vkEnumeratePhysicalDevices found none";
        return {};
    }();
    return reason;
}

// One test device while any vulkan-engine instance lives (case 4's two importers share it, as
// two importers of one engine would), a fresh one afterwards.
std::shared_ptr<VkTestDevice> test_device() {
    static std::weak_ptr<VkTestDevice> current;
    if (auto device = current.lock()) return device;
    std::shared_ptr<VkTestDevice> device = VkTestDevice::create_or_skip();
    current = device;
    return device;
}

Observation recorded() {
    Observation o;
    std::int64_t calls = 0, made = 0, destroyed = 0;
    for (const DriverCall& c : recorder::calls()) {
        ++calls;
        if (c.kind == DriverCall::Kind::allocate_memory && c.result == VK_SUCCESS) ++made;
        if (c.kind == DriverCall::Kind::free_memory) ++destroyed;
    }
    o.driver_calls = calls;
    o.live = recorder::live_objects();
    o.made = made;
    o.destroyed = destroyed;
    return o;
}

Subject vulkan_subject(const std::string& name, bool engine) {
    Subject s;
    s.name = name;
    s.importer_name = "vulkan";
    s.has_read_back = true; // both have a transfer queue
    s.has_copies = true;
    s.device_address_is_host = false; // the device reaches an import through its VkBuffer
    s.skip_reason = no_vulkan_device;
    s.make = [engine] {
        Instance instance;
        if (engine) {
            std::shared_ptr<VkTestDevice> device = test_device();
            Result<std::unique_ptr<Importer>> made = make_vulkan_importer(
                device->importer_params(VK_BUFFER_USAGE_TRANSFER_SRC_BIT, true));
            if (!made) throw std::runtime_error("make_vulkan_importer: " + made.error().message);
            instance.keep_alive = device;
            instance.importer = std::move(made).value();
            instance.observe = recorded;
        } else {
            Result<std::unique_ptr<Importer>> made = create_importer("vulkan");
            if (!made) throw std::runtime_error("create_importer(\"vulkan\"): " +
                                                made.error().message);
            instance.importer = std::move(made).value();
            instance.observe = [] { return Observation{}; };
        }
        return instance;
    };
    return s;
}

} // namespace

const std::vector<Subject>& subjects() {
    static const std::vector<Subject> all = {vulkan_subject("vulkan-default", false),
                                             vulkan_subject("vulkan-engine", true)};
    return all;
}

} // namespace wm::conformance
