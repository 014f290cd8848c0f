// SPDX-License-Identifier: MIT
// The file-page probe: can this driver import host pointers into a file mapping at all?
//
// RADV imports a host pointer through libdrm's amdgpu_create_bo_from_user_mem, which always
// passes AMDGPU_GEM_USERPTR_ANONONLY; the kernel's amdgpu_ttm_tt_get_user_pages then returns
// -EPERM for any VMA with a backing file (memfd and shmem included), so every import of a weight
// file's mapping fails there, while lavapipe takes them (docs/vulkan.md, "Drivers"). The importer
// finds out once, when it is created, by importing one page of a small memfd mapping, instead of
// letting the planner count on imports that cannot work.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include "internal/align.hpp"
#include "vulkan_result.hpp"
#include "vulkan_importer.hpp"

namespace wm::vulkan {
namespace {

constexpr VkExternalMemoryHandleTypeFlagBits host_handle_type =
    VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;

// /proc/self/maps shows it as "/memfd:weightmap-vulkan-probe (deleted)" while it exists.
constexpr const char* probe_name = "weightmap-vulkan-probe";

// One page-cache page of a memfd, mapped MAP_SHARED PROT_READ at an address aligned to the
// import alignment. Everything it made is undone on destruction, on every path.
class ProbeMapping {
public:
    ProbeMapping() = default;
    ProbeMapping(const ProbeMapping&) = delete;
    ProbeMapping& operator=(const ProbeMapping&) = delete;
    ~ProbeMapping() {
        if (reservation_ != MAP_FAILED) munmap(reservation_, reserved_); // the file page too
        if (fd_ >= 0) close(fd_);
    }

    // Empty on success, else the failed call and errno.
    std::string map(std::uint64_t size) {
        fd_ = memfd_create(probe_name, MFD_CLOEXEC);
        if (fd_ < 0) return fmt::format("memfd_create: {}", std::strerror(errno));
        if (ftruncate(fd_, static_cast<off_t>(size)) != 0)
            return fmt::format("ftruncate to {} bytes: {}", size, std::strerror(errno));
        // Reserve twice the size, then map the file over an aligned part of the reservation
        // (mmap only promises page alignment; the import alignment may be larger).
        reserved_ = static_cast<std::size_t>(2 * size);
        reservation_ = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (reservation_ == MAP_FAILED)
            return fmt::format("mmap of {} bytes: {}", reserved_, std::strerror(errno));
        auto* aligned = reinterpret_cast<void*>(static_cast<std::uintptr_t>(align_up_saturating(
            reinterpret_cast<std::uintptr_t>(reservation_), size)));
        page_ = mmap(aligned, static_cast<std::size_t>(size), PROT_READ, MAP_SHARED | MAP_FIXED,
                     fd_, 0);
        if (page_ == MAP_FAILED) {
            page_ = nullptr;
            return fmt::format("mmap MAP_SHARED of the memfd: {}", std::strerror(errno));
        }
        return {};
    }
    void* page() const { return page_; }

private:
    int fd_ = -1;
    void* reservation_ = MAP_FAILED;
    std::size_t reserved_ = 0;
    void* page_ = nullptr;
};

// Whether any page of [address, +size) belongs to a VMA with a backing file (an inode in
// /proc/self/maps: a file, memfd or shmem mapping, which is what the kernel's vm_file test
// sees); nullopt when the maps cannot be read.
std::optional<bool> has_file_pages(const void* address, std::uint64_t size) {
    std::ifstream maps("/proc/self/maps");
    if (!maps) return std::nullopt;
    const auto begin = reinterpret_cast<std::uintptr_t>(address);
    const std::uint64_t end = sat_add(begin, size);
    std::string line;
    while (std::getline(maps, line)) {
        unsigned long long lo = 0, hi = 0, offset = 0, inode = 0;
        char perms[8] = {}, device[16] = {};
        if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %15s %llu", &lo, &hi, perms, &offset,
                        device, &inode) != 6)
            continue;
        if (lo >= end) break; // sorted by address
        if (hi > begin && inode != 0) return true;
    }
    return false;
}

} // namespace

std::string VulkanImporter::driver_label() const {
    if (facts_.driver_id == static_cast<VkDriverId>(0))
        return fmt::format("'{}'", facts_.device_name);
    return fmt::format("{} ({}) on '{}'",
                       driver_name_.empty() ? std::string("driver") : driver_name_,
                       driver_id_name(facts_.driver_id), facts_.device_name);
}

void VulkanImporter::probe_file_pages() {
    const auto start = std::chrono::steady_clock::now();
    std::string failed;
    {
        ProbeMapping mapping;
        if (std::string why = mapping.map(alignment_); !why.empty()) {
            // Not the driver's answer: keep counting on file pages (an import that fails then
            // falls back with the driver's own VkResult), and say why nothing was learnt.
            log_message(params_.log, LogLevel::warning,
                        fmt::format("vulkan: cannot probe file-page imports on {} ({}); "
                                    "assuming the driver takes them",
                                    driver_label(), why));
            return;
        }
        failed = import_probe_page(mapping.page());
    } // unmapped and closed here, before anything is reported
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count();
    if (!failed.empty() && !device_lost_.load()) {
        refuses_file_pages_ = true;
        file_pages_note_ = fmt::format("{} refuses host-pointer imports of file-backed pages: {} "
                                       "(probe of a {}-byte memfd mapping)",
                                       driver_label(), failed, alignment_);
    }
    log_message(params_.log, LogLevel::debug,
                fmt::format("vulkan: file-page probe on {}: {} in {:.3f} ms", driver_label(),
                            failed.empty() ? std::string("imported") : failed, ms));
}

std::string VulkanImporter::import_probe_page(void* page) {
    VkMemoryHostPointerPropertiesEXT properties{
        VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT, nullptr, 0};
    if (VkResult r = fns_.get_memory_host_pointer_properties(params_.device, host_handle_type,
                                                             page, &properties);
        r != VK_SUCCESS) {
        if (r == VK_ERROR_DEVICE_LOST) vk_error(r, "vkGetMemoryHostPointerPropertiesEXT", "probe");
        return fmt::format("vkGetMemoryHostPointerPropertiesEXT returned {}", result_name(r));
    }
    const int type = choose_memory_type(properties.memoryTypeBits, params_.preferred_memory_flags);
    if (type < 0)
        return fmt::format("vkGetMemoryHostPointerPropertiesEXT offers no memory type "
                           "(memoryTypeBits {:#x})",
                           properties.memoryTypeBits);
    VkImportMemoryHostPointerInfoEXT import_info{
        VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, nullptr, host_handle_type, page};
    VkMemoryAllocateInfo allocate_info{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &import_info,
                                       alignment_, static_cast<std::uint32_t>(type)};
    VkDeviceMemory memory = VK_NULL_HANDLE;
    if (VkResult r = fns_.allocate_memory(params_.device, &allocate_info, nullptr, &memory);
        r != VK_SUCCESS) {
        if (r == VK_ERROR_DEVICE_LOST) vk_error(r, "vkAllocateMemory", "probe");
        return fmt::format("vkAllocateMemory returned {}", result_name(r));
    }
    fns_.free_memory(params_.device, memory, nullptr);
    return {};
}

Status VulkanImporter::check_file_pages(const void* host_address, std::uint64_t size) const {
    if (!refuses_file_pages_) return {};
    // Reading the maps costs a little, so only here, where the probe already said no: a range
    // the maps show as anonymous still goes to the driver, and one they cannot place does too
    // (the driver's own VkResult then says what happened).
    if (has_file_pages(host_address, size).value_or(false))
        return make_error(ErrorKind::unsupported,
                          fmt::format("vulkan import {} +{:#x}: {}", host_address, size,
                                      file_pages_note_));
    return {};
}

} // namespace wm::vulkan
