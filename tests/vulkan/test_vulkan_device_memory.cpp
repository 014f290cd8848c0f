// SPDX-License-Identifier: MIT
// How the Vulkan importer reads device memory from VkPhysicalDeviceType and the heaps (the pure
// classification, over the heap layouts real drivers advertise), and what it reports on the
// device here (lavapipe: a CPU device, unified).
#include <catch2/catch.hpp>

#include "vulkan/vk_test_device.hpp"
#include "vulkan_device_memory.hpp" // backends/vulkan: the internal classification
#include "weightmap/backends/vulkan.hpp"

using namespace wm;
using wm::vulkan::classify_device_memory;

namespace {

constexpr VkMemoryPropertyFlags device_local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
constexpr VkMemoryPropertyFlags host_coherent =
    VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;

// Heaps: `heap_flags`, one memory type per heap with `type_flags`.
VkPhysicalDeviceMemoryProperties layout(std::initializer_list<VkMemoryHeapFlags> heap_flags,
                                        std::initializer_list<VkMemoryPropertyFlags> type_flags) {
    VkPhysicalDeviceMemoryProperties m{};
    for (VkMemoryHeapFlags f : heap_flags) m.memoryHeaps[m.memoryHeapCount++] = {1ull << 30, f};
    std::uint32_t heap = 0;
    for (VkMemoryPropertyFlags f : type_flags)
        m.memoryTypes[m.memoryTypeCount++] = {f, std::min(heap++, m.memoryHeapCount - 1)};
    return m;
}

} // namespace

TEST_CASE("the device type decides; heaps only for types that do not say") {
    // A discrete card: VRAM heap plus a host heap; with resizable BAR the VRAM type is
    // host-visible too, and the card is still discrete.
    const auto dgpu = layout({VK_MEMORY_HEAP_DEVICE_LOCAL_BIT, 0},
                             {device_local | host_coherent, host_coherent});
    // RADV on an APU: a device-local carve-out and a GTT heap, the same shape.
    const auto apu = dgpu;
    // UMA (lavapipe, Intel ANV on an iGPU): one device-local heap the host sees coherently.
    const auto uma = layout({VK_MEMORY_HEAP_DEVICE_LOCAL_BIT}, {device_local | host_coherent});

    auto v = classify_device_memory(VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, dgpu, "card");
    CHECK(v.memory == DeviceMemory::discrete);
    CHECK(v.note == "VkPhysicalDeviceType DISCRETE_GPU on 'card'");
    v = classify_device_memory(VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, uma, "card");
    CHECK(v.memory == DeviceMemory::discrete); // heaps never overrule the type
    v = classify_device_memory(VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU, apu, "apu");
    CHECK(v.memory == DeviceMemory::unified);
    CHECK(v.note == "VkPhysicalDeviceType INTEGRATED_GPU on 'apu'");
    v = classify_device_memory(VK_PHYSICAL_DEVICE_TYPE_CPU, uma, "llvmpipe");
    CHECK(v.memory == DeviceMemory::unified);

    // Types that do not say: UMA heaps are unified, anything else stays unknown (heaps alone
    // cannot tell an APU's carve-out from a card's VRAM).
    v = classify_device_memory(VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU, uma, "virtio");
    CHECK(v.memory == DeviceMemory::unified);
    CHECK(v.note == "VkPhysicalDeviceType VIRTUAL_GPU on 'virtio', every heap device-local and "
                    "host-coherent");
    v = classify_device_memory(VK_PHYSICAL_DEVICE_TYPE_OTHER, dgpu, "other");
    CHECK(v.memory == DeviceMemory::unknown);
    CHECK(v.note == "VkPhysicalDeviceType OTHER on 'other', heaps do not say");
    const auto device_local_not_host = layout({VK_MEMORY_HEAP_DEVICE_LOCAL_BIT}, {device_local});
    CHECK(classify_device_memory(VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU, device_local_not_host, "v")
              .memory == DeviceMemory::unknown);
    const VkPhysicalDeviceMemoryProperties none{};
    CHECK(classify_device_memory(VK_PHYSICAL_DEVICE_TYPE_OTHER, none, "empty").memory ==
          DeviceMemory::unknown);
    CHECK(classify_device_memory(static_cast<VkPhysicalDeviceType>(42), uma, "new").note ==
          "VkPhysicalDeviceType unrecognised on 'new', every heap device-local and host-coherent");
}

TEST_CASE("the importer on this machine's device reports what its type says") {
    auto dev = wm::test::VkTestDevice::create_or_skip();
    auto made = make_vulkan_importer(dev->importer_params(0));
    REQUIRE(made.ok());
    auto facts = vulkan_importer_facts(*made.value());
    REQUIRE(facts.ok());
    const ImporterCaps caps = made.value()->caps();
    const std::string note(made.value()->notes().device_memory);
    INFO(note);
    if (facts->device_type == VK_PHYSICAL_DEVICE_TYPE_CPU ||
        facts->device_type == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU)
        CHECK(caps.device_memory == DeviceMemory::unified);
    if (facts->device_type == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU)
        CHECK(caps.device_memory == DeviceMemory::discrete);
    CHECK_THAT(note, Catch::Contains(facts->device_name));
    if (dev->is_lavapipe()) CHECK(facts->device_type == VK_PHYSICAL_DEVICE_TYPE_CPU);
}
