// SPDX-License-Identifier: MIT
// The system calls the mapping layer and populate make, behind a table so fault-injection tests
// can fail the N-th mmap/mlock/mprotect and prove nothing is left mapped, locked or open, and can
// answer madvise(MADV_POPULATE_READ) as a kernel before 5.14 does (EINVAL). Internal only.
#pragma once

#include <cstddef>
#include <sys/types.h>

namespace wm::internal {

struct SysCalls {
    int (*open_file)(const char* path, int flags);
    int (*close_file)(int fd);
    void* (*map)(void* addr, std::size_t length, int prot, int flags, int fd, off_t offset);
    int (*unmap)(void* addr, std::size_t length);
    int (*lock)(const void* addr, std::size_t length);
    int (*unlock)(const void* addr, std::size_t length);
    int (*protect)(void* addr, std::size_t length, int prot);
    int (*advise)(void* addr, std::size_t length, int advice);
    ssize_t (*read_at)(int fd, void* buffer, std::size_t count, off_t offset); // pread
};

/// The table in force (libc's unless a test replaced it).
const SysCalls& syscalls() noexcept;
/// Replaces the table; nullptr restores libc's. Test-only; not thread-safe against loads.
void set_syscalls(const SysCalls* table) noexcept;
/// libc's own table, for tests that wrap it.
const SysCalls& libc_syscalls() noexcept;

} // namespace wm::internal
