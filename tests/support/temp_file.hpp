// SPDX-License-Identifier: MIT
// Temporary files for tests: created with a verifiable byte pattern, removed on destruction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace wm::test {

/// Byte k of a pattern file: depends on the offset so misplaced reads show up.
inline std::uint8_t pattern_byte(std::uint64_t offset) {
    return static_cast<std::uint8_t>((offset * 131u + (offset >> 12) * 7u + 17u) & 0xffu);
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

} // namespace wm::test
