// SPDX-License-Identifier: MIT
// The Vulkan conformance subjects, on the machine's device (lavapipe in CI):
//   vulkan-default: wm::create_importer("vulkan"), an instance and device of the library's own
//                   (no driver counters: its device functions cannot be interposed);
//   vulkan-engine:  wm::make_vulkan_importer over the tests' own device (tests/vulkan), every
//                   device function through the recording vkGetDeviceProcAddr wrapper.
// No Vulkan device at all: the test device's create_or_skip() exits 77 (meson: SKIP) before any
// case runs. With a device, both subjects must be available: an unavailable default importer
// fails, it does not skip.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conformance/subject.hpp"
#include "vulkan/vk_test_device.hpp"
#include "weightmap/backends/vulkan.hpp"
#include "weightmap/registry.hpp"

namespace wm::conformance {
namespace {

namespace recorder = wm::test::recorder;
using wm::test::DriverCall;
using wm::test::VkTestDevice;

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
    static const std::vector<Subject> all = [] {
        // Exits 77 (SKIP) when this machine has no Vulkan device at all.
        (void)VkTestDevice::create_or_skip();
        return std::vector<Subject>{vulkan_subject("vulkan-default", false),
                                    vulkan_subject("vulkan-engine", true)};
    }();
    return all;
}

} // namespace wm::conformance
