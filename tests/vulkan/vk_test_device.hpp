// SPDX-License-Identifier: MIT
// A Vulkan instance and device of the tests' own (the "engine" side), independent of the
// library's code, plus a recording layer over vkGetDeviceProcAddr that shows exactly what the
// importer handed the driver. The loader is dlopen()ed, so a machine without it SKIPs instead
// of failing to start.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <vulkan/vulkan_core.h>

#include "weightmap/backends/vulkan.hpp"
#include "weightmap/mapping.hpp"

namespace wm::test {

/// Exit code meson reports as SKIP.
inline constexpr int skip_exit_code = 77;

/// Prints "SKIP: <reason>" and exits 77. Only for "no Vulkan device at all".
[[noreturn]] void skip_test(const std::string& reason);

struct VkTestDeviceOptions {
    /// Enable VK_EXT_external_memory_host at vkCreateDevice (it is required to be supported
    /// either way: a device without it fails the test, it does not skip).
    bool enable_external_memory_host = true;
};

/// One instance + device. Prefers lavapipe (the device the tests' numbers are about), else the
/// first device with VK_EXT_external_memory_host. Throws std::runtime_error on a failure that
/// is not "no device at all".
class VkTestDevice {
public:
    static std::unique_ptr<VkTestDevice> create_or_skip(const VkTestDeviceOptions& options = {});
    ~VkTestDevice();
    VkTestDevice(const VkTestDevice&) = delete;
    VkTestDevice& operator=(const VkTestDevice&) = delete;

    /// Params for make_vulkan_importer over this device; `recording` routes every device
    /// function through the recorder below.
    VulkanImporterParams
    importer_params(VkBufferUsageFlags usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                    bool recording = true) const;

    /// The engine's own transfer: vkCmdCopyBuffer of [offset, +size) of `source` into a freshly
    /// device-allocated, host-visible buffer, then that buffer's bytes. Throws on a VkResult.
    std::vector<std::uint8_t> copy_out(VkBuffer source, std::uint64_t offset, std::uint64_t size);
    /// vkCmdFillBuffer(value) over [offset, +size) of `target`: a device write.
    void fill(VkBuffer target, std::uint64_t offset, std::uint64_t size, std::uint32_t value);

    bool is_lavapipe() const { return driver_id == VK_DRIVER_ID_MESA_LLVMPIPE; }

    VkInstance instance = VK_NULL_HANDLE;
    VkPhysicalDevice physical_device = VK_NULL_HANDLE;
    VkDevice device = VK_NULL_HANDLE;
    VkQueue queue = VK_NULL_HANDLE;
    std::uint32_t queue_family = 0;
    bool external_memory_host_enabled = false;
    VkDriverId driver_id = static_cast<VkDriverId>(0);
    std::string device_name;
    std::uint64_t min_imported_host_pointer_alignment = 0;
    std::uint64_t max_memory_allocation_size = 0;
    std::uint64_t max_storage_buffer_range = 0;
    VkPhysicalDeviceMemoryProperties memory_properties{};

private:
    VkTestDevice() = default;
    int host_visible_type(std::uint32_t bits) const;
    void submit_and_wait(VkCommandBuffer cmd);
};

/// What the importer passed to the driver, recorded by the wrapper get_device_proc_addr of
/// importer_params(..., recording = true). Process-wide; thread-safe.
struct DriverCall {
    enum class Kind {
        host_pointer_properties,
        allocate_memory,
        free_memory,
        create_buffer,
        destroy_buffer,
        bind_buffer_memory
    };
    Kind kind;
    const void* host_pointer = nullptr; ///< import pointer (host_pointer_properties, allocate)
    std::uint64_t size = 0;             ///< allocationSize / buffer size
    std::uint32_t memory_type = 0;      ///< allocate_memory
    bool import = false;          ///< allocate_memory carried VkImportMemoryHostPointerInfoEXT
    std::uint64_t handle = 0;     ///< memory / buffer made or destroyed (0 when refused)
    VkResult result = VK_SUCCESS; ///< what the call returned (injected or real)
};

namespace recorder {
void reset();
std::vector<DriverCall> calls();
std::vector<DriverCall> calls_of(DriverCall::Kind kind);
/// The next `count` calls of `kind` return `result` without reaching the driver.
void inject(DriverCall::Kind kind, VkResult result, int count = 1);
/// Objects made through the recorder and not yet destroyed (memory + buffers).
std::int64_t live_objects();
} // namespace recorder

/// RssAnon of this process in bytes (wm::read_memstat, i.e. /proc/self/status).
std::uint64_t rss_anon_bytes();

/// Maps one file with the library's mapping policy (MAP_SHARED, `access`). Throws on failure.
MappedModel map_file(const std::string& path, MappingAccess access = MappingAccess::read_only);

} // namespace wm::test
