// SPDX-License-Identifier: MIT
// Populating a range before it is locked, and reading its protection (hsa_pages.hpp).
#include "hsa_pages.hpp"

#include <cerrno>
#include <cinttypes>
#include <cstdio>

#include <sys/mman.h>

#include "internal/page_size.hpp"
#include "internal/sys_hooks.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 // Linux 5.14; older kernels answer EINVAL
#endif

namespace wm::hsa {

bool populate_for_lock(void* address, std::uint64_t size) noexcept {
    const auto& sys = internal::syscalls();
    // Starts readahead of the whole range in large requests, without waiting.
    const bool advised = sys.advise(address, size, MADV_WILLNEED) == 0;
    if (sys.advise(address, size, MADV_POPULATE_READ) == 0) return advised;
    if (errno != EINVAL) return false; // EFAULT/EIO: the lock will report what is wrong
    // A kernel before 5.14: one read per page maps it (the page cache already has it, mostly).
    const std::uint64_t page = host_page_size();
    const auto* bytes = static_cast<const volatile unsigned char*>(address);
    for (std::uint64_t offset = 0; offset < size; offset += page) (void)bytes[offset];
    return advised;
}

bool range_writable(const void* address, std::uint64_t size) noexcept {
    FILE* maps = std::fopen("/proc/self/maps", "re");
    if (maps == nullptr) return false;
    const auto begin = reinterpret_cast<std::uintptr_t>(address);
    const std::uintptr_t end = begin + size;
    std::uintptr_t covered = begin;
    char line[4096 + 256]; // a whole line: a path is at most PATH_MAX
    while (covered < end && std::fgets(line, sizeof line, maps) != nullptr) {
        std::uintptr_t lo = 0, hi = 0;
        char perms[8] = {};
        if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s", &lo, &hi, perms) != 3) continue;
        if (hi <= covered || lo > covered) continue; // lines are sorted by address
        if (perms[1] != 'w') break;
        covered = hi;
    }
    std::fclose(maps);
    return covered >= end;
}

} // namespace wm::hsa
