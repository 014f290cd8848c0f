// SPDX-License-Identifier: MIT
// The bytes a file guard compares after an event that says nothing of them (an attribute
// change, a close after an open for writing): the size, and XXH3 hashes of pages sampled evenly
// over the regions the engine reads (issue 45: `touch` of a served model stopped it).
#pragma once

#include <cstdint>
#include <vector>

#include "weightmap/file_guard.hpp"

namespace wm::internal {

/// pread until `size` bytes are read, the file ends, or an error: the bytes read; `error` is the
/// errno of the failure, 0 when the file ended (or nothing failed).
std::size_t pread_full(int fd, void* destination, std::size_t size, std::uint64_t offset, int& error);

class FileFingerprint {
public:
    struct Range {
        std::uint64_t offset;
        std::uint64_t size;
    };
    /// Samples at most about `max_pages` pages of `ranges` (empty: the whole file) of the file
    /// open at `fd`, each range's first and last page among them, and hashes them.
    static FileFingerprint take(int fd, const std::vector<Range>& ranges,
                                std::size_t max_pages = 1024);

    /// Whether the file at `fd` still has the size and the sampled bytes of take(). A page that
    /// cannot be read whole (truncated, EIO) differs.
    bool matches(int fd) const;

    std::size_t pages() const { return samples_.size(); }

private:
    struct Sample {
        std::uint64_t offset;
        std::uint32_t length;
        std::uint64_t hash;
    };
    std::uint64_t size_ = 0;
    std::vector<Sample> samples_;
};

} // namespace wm::internal
