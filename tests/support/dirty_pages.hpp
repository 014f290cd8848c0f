// SPDX-License-Identifier: MIT
// How much of a file this process has dirtied through its mappings, from the kernel's own
// accounting (/proc/self/smaps), and the file's mtime: the "model file never dirtied" invariant,
// which holds on any driver.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace wm::test {

/// Dirty KiB (Shared_Dirty + Private_Dirty: a page cache page mapped by this process alone counts
/// as private) over every mapping of `path`'s inode in this process.
inline std::uint64_t dirty_kib_of(const std::string& path) {
    struct stat st = {};
    if (stat(path.c_str(), &st) != 0) return 0;
    FILE* smaps = std::fopen("/proc/self/smaps", "r");
    if (smaps == nullptr) return 0;
    char line[4096];
    bool in_file = false;
    std::uint64_t kib = 0;
    while (std::fgets(line, sizeof line, smaps) != nullptr) {
        unsigned long long lo = 0, hi = 0, offset = 0, inode = 0;
        char perms[8] = "", dev[32] = "";
        if (std::sscanf(line, "%llx-%llx %7s %llx %31s %llu", &lo, &hi, perms, &offset, dev,
                        &inode) == 6) {
            in_file = inode == static_cast<unsigned long long>(st.st_ino);
            continue;
        }
        unsigned long long value = 0;
        if (in_file && (std::sscanf(line, "Shared_Dirty: %llu kB", &value) == 1 ||
                        std::sscanf(line, "Private_Dirty: %llu kB", &value) == 1))
            kib += value;
    }
    std::fclose(smaps);
    return kib;
}

/// Writes `path`'s dirty pages back, so that dirty_kib_of counts only what is dirtied after
/// (a file just written is dirty in the page cache until writeback). False when it cannot.
inline bool write_back(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const bool ok = fd >= 0 && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

/// The file's mtime in nanoseconds; 0 when it cannot be read.
inline std::int64_t mtime_ns_of(const std::string& path) {
    struct stat st = {};
    if (stat(path.c_str(), &st) != 0) return 0;
    return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

} // namespace wm::test
