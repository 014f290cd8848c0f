// SPDX-License-Identifier: MIT
// Bounds-checked reading of untrusted model headers, from a file (pread) or from memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include "weightmap/span.hpp"
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weightmap/result.hpp"

namespace wm::formats {

/// "PATH: byte N: FIELD: message" - the one shape of every reader error.
Error format_error(std::string_view path, std::uint64_t pos, std::string_view field,
                   std::string_view message, ErrorKind kind = ErrorKind::format);

/// A name from a file, safe to put in a one-line message: quoted, non-printable bytes as \xNN,
/// cut at 120 bytes.
std::string quote_name(std::string_view name);

/// Where header bytes come from. read() fills dst with n bytes at offset or says why not.
class Source {
public:
    virtual ~Source() = default;
    virtual Status read(std::uint64_t offset, std::byte* dst, std::size_t n) const = 0;
    /// Bytes from offset 0 that read() can serve.
    virtual std::uint64_t available() const noexcept = 0;
};

/// The first bytes of a file, in memory (fuzzers, tests). Bytes past the span fail.
class MemorySource final : public Source {
public:
    MemorySource(Span<const std::byte> head, std::string_view path)
        : head_(head), path_(path) {}
    Status read(std::uint64_t offset, std::byte* dst, std::size_t n) const override;
    std::uint64_t available() const noexcept override { return head_.size(); }

private:
    Span<const std::byte> head_;
    std::string_view path_;
};

/// An open regular file, read with pread. Owns the descriptor.
class FileSource final : public Source {
public:
    /// Opens `path` read-only (O_NONBLOCK, so a FIFO cannot block) and requires a regular file.
    static Result<FileSource> open(const std::string& path);
    FileSource(FileSource&& other) noexcept;
    FileSource& operator=(FileSource&&) = delete;
    FileSource(const FileSource&) = delete;
    ~FileSource() override;
    std::uint64_t size() const noexcept { return size_; }
    Status read(std::uint64_t offset, std::byte* dst, std::size_t n) const override;
    std::uint64_t available() const noexcept override { return size_; }

private:
    FileSource(int fd, std::uint64_t size, std::string path)
        : fd_(fd), size_(size), path_(std::move(path)) {}
    int fd_ = -1;
    std::uint64_t size_ = 0;
    std::string path_;
};

/// Reads a header front to back through a 1 MiB window. Every read is checked against the file
/// size first, so a length field can never make it read, skip or allocate past the end.
class Cursor {
public:
    Cursor(const Source& source, std::string_view path, std::uint64_t file_size);

    std::uint64_t pos() const noexcept { return pos_; }
    std::uint64_t file_size() const noexcept { return size_; }
    std::uint64_t remaining() const noexcept { return size_ - pos_; }

    /// Copies n bytes at pos() into dst and advances; fails naming `field` when fewer remain.
    Status read(std::byte* dst, std::size_t n, std::string_view field);
    /// Advances n bytes without reading them; fails when fewer remain.
    Status skip(std::uint64_t n, std::string_view field);

    /// Little-endian unsigned integer of sizeof(T) bytes.
    template <class T>
    Status get(T& out, std::string_view field) {
        std::byte b[sizeof(T)];
        if (Status s = read(b, sizeof(T), field); !s) return s;
        T v = 0;
        for (std::size_t i = 0; i < sizeof(T); ++i)
            v = static_cast<T>(v | static_cast<T>(static_cast<T>(b[i]) << (8 * i)));
        out = v;
        return {};
    }

    /// An error at byte `pos` of this file.
    Error error_at(std::uint64_t pos, std::string_view field, std::string_view message,
                   ErrorKind kind = ErrorKind::format) const {
        return format_error(path_, pos, field, message, kind);
    }

private:
    const Source& source_;
    std::string_view path_;
    std::uint64_t size_;
    std::uint64_t pos_ = 0;
    std::vector<std::byte> window_;
    std::uint64_t window_start_ = 0;
    std::size_t window_len_ = 0;
};

/// Stores a * b (a + b) in out; true when it overflowed 64 bits.
inline bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
    return __builtin_mul_overflow(a, b, &out);
}
inline bool add_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
    return __builtin_add_overflow(a, b, &out);
}

/// One tensor's absolute extent, and the header byte and field to blame when it is wrong.
struct TensorExtent {
    std::uint64_t offset = 0, size = 0, blame_pos = 0;
    std::string_view name;
    std::string field;
};

/// Checks that every extent ends inside the file (offset + size without overflow) and that no
/// two overlap (zero-size extents overlap nothing).
Status check_extents(std::string_view path, std::uint64_t file_size,
                     std::vector<TensorExtent> extents);

} // namespace wm::formats
