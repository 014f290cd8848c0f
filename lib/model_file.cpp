// SPDX-License-Identifier: MIT
// open_model_file (internal/model_file.hpp).
#include "internal/model_file.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>

#include <fmt/format.h>

#include "internal/sys_hooks.hpp"

namespace wm::internal {

namespace {

const char* file_type(mode_t mode) noexcept {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

} // namespace

Result<OpenModelFile> open_model_file(const std::string& path) {
    OpenModelFile file;
    file.fd = syscalls().open_file(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (file.fd < 0)
        return make_error(ErrorKind::io, fmt::format("open('{}', O_RDONLY) failed: {}", path,
                                                     std::strerror(errno)));
    if (fstat(file.fd, &file.st) != 0) {
        const int err = errno;
        syscalls().close_file(file.fd);
        return make_error(ErrorKind::io, fmt::format("fstat('{}') failed: {}", path,
                                                     std::strerror(err)));
    }
    if (!S_ISREG(file.st.st_mode)) {
        syscalls().close_file(file.fd);
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("'{}' is {}, not a regular file: not a weight file", path,
                                      file_type(file.st.st_mode)));
    }
    return file;
}

} // namespace wm::internal
