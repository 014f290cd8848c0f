// SPDX-License-Identifier: MIT
// Temporary files for tests: created with a verifiable byte pattern, removed on destruction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "testkit/pattern.hpp"

namespace wm::test {

/// Byte k of a pattern file: the generated models' pattern, which every bit of the offset moves,
/// so a read displaced by any amount shows up (an `offset * 131 + (offset >> 12) * 7` byte, used
/// before, repeated every 256 bytes and every MiB: a read_back that ignored its offset passed).
inline std::uint8_t pattern_byte(std::uint64_t offset) {
    return testkit::model_pattern_byte(offset);
}

/// True when `bytes` are what a pattern file holds from `file_offset` on.
inline bool equals_file_bytes(const std::vector<std::uint8_t>& bytes, std::uint64_t file_offset) {
    for (std::uint64_t i = 0; i < bytes.size(); ++i)
        if (bytes[i] != pattern_byte(file_offset + i)) return false;
    return true;
}

class TempFile {
public:
    /// Creates a file of `size` bytes in $TMPDIR (default /tmp) filled with pattern_byte().
    explicit TempFile(std::uint64_t size, const std::string& suffix = ".bin");
    ~TempFile();
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    const std::string& path() const { return path_; }
    std::uint64_t size() const { return size_; }

private:
    std::string path_;
    std::uint64_t size_;
};

/// A private directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

/// FNV-1a 64 of a whole file, read with read(2) (not through a mapping).
std::uint64_t hash_file(const std::string& path);

/// The process's open file descriptors (entries of /proc/self/fd), to prove none leaked.
std::size_t open_fds();

} // namespace wm::test
