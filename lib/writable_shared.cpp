// SPDX-License-Identifier: MIT
// A writable MAP_SHARED mapping of a file the caller opened read-only, under the owner + mode +
// same-inode rules (internal/writable_reopen.hpp, mapping.hpp map_file_writable_shared).
#include "internal/writable_reopen.hpp"

#include <cerrno>
#include <climits>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "internal/align.hpp"
#include "internal/model_file.hpp"
#include "internal/nothrow.hpp"
#include "internal/page_size.hpp"
#include "internal/sys_hooks.hpp"
#include "weightmap/mapping.hpp"

namespace wm {
namespace internal {
namespace {

std::string fd_path(int fd) { return fmt::format("/proc/self/fd/{}", fd); }

// What the descriptor points at, for messages: its path, or "descriptor N" when /proc says
// nothing.
std::string fd_name(int fd) {
    char target[PATH_MAX] = {};
    const ssize_t n = readlink(fd_path(fd).c_str(), target, sizeof target - 1);
    if (n <= 0) return fmt::format("descriptor {}", fd);
    return fmt::format("'{}'", std::string(target, static_cast<std::size_t>(n)));
}

Error system_error(const std::string& what, const std::string& name) {
    const int err = errno;
    return make_error(ErrorKind::io, fmt::format("{} of {} failed: {}", what, name,
                                                 std::strerror(err)));
}

// Rule (a). Not access(W_OK) and not open(O_RDWR): both say yes to root on a 0444 file, and a
// file its owner made read-only must not be written through a mapping by anyone.
Status owner_may_write(const struct stat& st, const std::string& name) {
    const uid_t euid = geteuid();
    if (st.st_uid != euid)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} not mapped writable: owned by uid {}, not by this "
                                      "process's effective uid {} (rule: the caller must own the "
                                      "file)", name, st.st_uid, euid));
    if ((st.st_mode & S_IWUSR) == 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} not mapped writable: mode {:04o} has no owner-write bit "
                                      "(rule: the owner must have made it writable; root's "
                                      "override of mode bits is not taken)", name,
                          static_cast<unsigned>(st.st_mode & 07777)));
    return {};
}

} // namespace

Result<WritableReopen> reopen_writable(int fd, const std::string& name) {
    struct stat before {};
    if (fstat(fd, &before) != 0) return system_error("fstat", name);
    if (!S_ISREG(before.st_mode))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} not mapped writable: not a regular file", name));
    if (Status s = owner_may_write(before, name); !s) return std::move(s).error();
    // Through /proc rather than the path: the path may name another file by now.
    const int rw = syscalls().open_file(fd_path(fd).c_str(), O_RDWR | O_CLOEXEC);
    if (rw < 0) return system_error(fmt::format("open({}, O_RDWR)", fd_path(fd)), name);
    struct stat after {};
    if (fstat(rw, &after) != 0) {
        Error e = system_error("fstat of the reopened descriptor", name);
        syscalls().close_file(rw);
        return e;
    }
    // /proc/self/fd/N is a magic link to the open file itself; a different inode means /proc is
    // not procfs here (a chroot, a bind mount), and the reopened file is not the one checked.
    if (after.st_dev != before.st_dev || after.st_ino != before.st_ino) {
        syscalls().close_file(rw);
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} not mapped writable: {} reopened another file (inode "
                                      "{}:{} instead of {}:{}) (rule: the same inode)", name,
                                      fd_path(fd), after.st_dev, after.st_ino, before.st_dev,
                                      before.st_ino));
    }
    return WritableReopen{rw, static_cast<std::uint64_t>(before.st_size)};
}

Status check_writable(const std::string& path) {
    auto opened = open_model_file(path);
    if (!opened) return std::move(opened).error();
    auto rw = reopen_writable(opened->fd, fmt::format("'{}'", path));
    syscalls().close_file(opened->fd);
    if (!rw) return std::move(rw).error();
    syscalls().close_file(rw->fd);
    return {};
}

} // namespace internal

Result<MappedFile> map_file_writable_shared(int fd, std::uint64_t length) noexcept {
    return internal::result_nothrow([&]() -> Result<MappedFile> {
        if (fd < 0)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("map_file_writable_shared: descriptor {} is not open",
                                          fd));
        const std::string name = internal::fd_name(fd);
        auto rw = internal::reopen_writable(fd, name);
        if (!rw) return std::move(rw).error();
        const int rw_fd = rw->fd;
        if (length == 0) length = rw->size;
        // Past the end, a shared file mapping raises SIGBUS on access instead of reading zeros.
        if (length == 0 || length > rw->size) {
            internal::syscalls().close_file(rw_fd);
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("map_file_writable_shared: {} is {} bytes; cannot map {}",
                                          name, rw->size, length));
        }
        const std::uint64_t mapped = align_up_saturating(length, host_page_size());
        void* p = internal::syscalls().map(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED,
                                           rw_fd, 0);
        Error failure = p == MAP_FAILED ? internal::system_error("mmap (writable shared)", name)
                                        : Error{};
        internal::syscalls().close_file(rw_fd); // the mapping keeps the file referenced
        if (p == MAP_FAILED) return failure;
        return MappedFile{static_cast<std::byte*>(p), mapped};
    });
}

} // namespace wm
