// SPDX-License-Identifier: MIT
// Opening a weight file by path for reading: one place, so the mapping, the mapping decision and
// populate's pread path agree on what a weight file is. Internal only.
#pragma once

#include <string>

#include <sys/stat.h>

#include "weightmap/result.hpp"

namespace wm::internal {

/// A weight file open for reading; the caller closes fd (syscalls().close_file).
struct OpenModelFile {
    int fd = -1;
    struct stat st {};
};

/// Opens `path` O_RDONLY|O_CLOEXEC|O_NOCTTY|O_NONBLOCK through syscalls().open_file and refuses,
/// with ErrorKind::invalid_argument naming the path and what it is, anything but a regular file.
/// O_NONBLOCK: a FIFO named like a model hung open(O_RDONLY) until a writer came (issue 44 item
/// 3); a regular file ignores it. An open or fstat that fails is ErrorKind::io with the errno.
/// Nothing stays open on failure.
Result<OpenModelFile> open_model_file(const std::string& path);

} // namespace wm::internal
