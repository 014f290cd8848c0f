// SPDX-License-Identifier: MIT
// The rules for turning a read-only weight file into a writable shared mapping (docs/hsa.md,
// "Read-only first"). One place, so decide_mapping, MappedModel and map_file_writable_shared
// cannot disagree. Internal only.
#pragma once

#include <cstdint>
#include <string>

#include "weightmap/result.hpp"

namespace wm::internal {

/// A descriptor of the same file, opened O_RDWR|O_CLOEXEC; the caller closes it.
struct WritableReopen {
    int fd = -1;
    std::uint64_t size = 0; ///< the file's size, from the same fstat that checked the rules
};

/// Reopens `fd` (open for reading) through /proc/self/fd/N with O_RDWR, only when
///  (a) the process's effective uid owns the file and its mode has the owner-write bit - root's
///      override of mode bits is deliberately not taken, so a 0444 file stays read-only for
///      root too; and
///  (b) the reopened descriptor is the same inode (st_dev, st_ino) as `fd`.
/// `name` names the file in messages. Refusals by a rule are invalid_argument and name the file
/// and the rule; a failing system call is io (EROFS on a read-only mount). Nothing stays open on
/// failure.
Result<WritableReopen> reopen_writable(int fd, const std::string& name);

/// Whether `path` could be mapped writable: opens it O_RDONLY and applies reopen_writable.
/// Nothing stays open.
Status check_writable(const std::string& path);

} // namespace wm::internal
