// SPDX-License-Identifier: MIT
#include "formats/byte_reader.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace wm::formats {

Error format_error(std::string_view path, std::uint64_t pos, std::string_view field,
                   std::string_view message, ErrorKind kind) {
    return make_error(kind, fmt::format("{}: byte {}: {}: {}", path, pos, field, message));
}

std::string quote_name(std::string_view name) {
    constexpr std::size_t max_shown = 120;
    std::string out = "'";
    for (std::size_t i = 0; i < name.size() && i < max_shown; ++i) {
        auto c = static_cast<unsigned char>(name[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
            out += static_cast<char>(c);
        else
            out += fmt::format("\\x{:02x}", c);
    }
    if (name.size() > max_shown) out += fmt::format("...' ({} bytes)", name.size());
    else out += '\'';
    return out;
}

Status MemorySource::read(std::uint64_t offset, std::byte* dst, std::size_t n) const {
    if (offset > head_.size() || n > head_.size() - offset)
        return format_error(path_, offset, "header",
                            fmt::format("needs {} bytes here, past the {} bytes of the file "
                                        "that were provided", n, head_.size()));
    std::memcpy(dst, head_.data() + offset, n);
    return {};
}

Result<FileSource> FileSource::open(const std::string& path) {
    // Copied before the open: a copy that threw bad_alloc after it would leak the descriptor.
    std::string owned = path;
    // O_NONBLOCK: opening a FIFO named like a model must not hang the reader.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return make_error(ErrorKind::io, fmt::format("{}: open: {}", path, std::strerror(errno)));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        return make_error(ErrorKind::io, fmt::format("{}: fstat: {}", path, std::strerror(err)));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: not a regular file", path));
    }
    return FileSource(fd, static_cast<std::uint64_t>(st.st_size), std::move(owned));
}

FileSource::FileSource(FileSource&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_), path_(std::move(other.path_)) {}

FileSource::~FileSource() {
    if (fd_ >= 0) ::close(fd_);
}

Status FileSource::read(std::uint64_t offset, std::byte* dst, std::size_t n) const {
    std::size_t done = 0;
    while (done < n) {
        ssize_t got = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            return format_error(path_, offset + done, "header",
                                fmt::format("pread: {}", std::strerror(errno)), ErrorKind::io);
        if (got == 0)
            return format_error(path_, offset + done, "header",
                                "the file ended early (was it truncated while being read?)",
                                ErrorKind::io);
        done += static_cast<std::size_t>(got);
    }
    return {};
}

Cursor::Cursor(const Source& source, std::string_view path, std::uint64_t file_size)
    : source_(source), path_(path), size_(file_size) {}

Status Cursor::read(std::byte* dst, std::size_t n, std::string_view field) {
    if (n > remaining())
        return error_at(pos_, field,
                        fmt::format("truncated: needs {} bytes, only {} remain in the file of {} "
                                    "bytes", n, remaining(), size_));
    constexpr std::size_t window_size = std::size_t{1} << 20;
    while (n > 0) {
        if (pos_ < window_start_ || pos_ >= window_start_ + window_len_) {
            // Refill at pos_ with as much as the source holds, up to the window; at least n, so
            // a source that holds less than asked fails with its own reason.
            std::uint64_t held = source_.available() > pos_ ? source_.available() - pos_ : 0;
            std::size_t len = static_cast<std::size_t>(
                std::max<std::uint64_t>(std::min({std::uint64_t{window_size}, remaining(), held}),
                                        std::min<std::uint64_t>(n, window_size)));
            // Grown on demand: a 100-byte input (a fuzz case) costs 100 bytes, not 1 MiB.
            if (window_.size() < len) window_.resize(len);
            window_start_ = pos_;
            window_len_ = 0;
            if (Status s = source_.read(pos_, window_.data(), len); !s) return s;
            window_len_ = len;
        }
        std::size_t off = static_cast<std::size_t>(pos_ - window_start_);
        std::size_t take = std::min(n, window_len_ - off);
        std::memcpy(dst, window_.data() + off, take);
        dst += take;
        n -= take;
        pos_ += take;
    }
    return {};
}

Status Cursor::skip(std::uint64_t n, std::string_view field) {
    if (n > remaining())
        return error_at(pos_, field,
                        fmt::format("truncated: skips {} bytes, only {} remain in the file of {} "
                                    "bytes", n, remaining(), size_));
    pos_ += n;
    return {};
}

Status check_extents(std::string_view path, std::uint64_t file_size,
                     std::vector<TensorExtent> extents) {
    for (const TensorExtent& e : extents) {
        std::uint64_t end = 0;
        if (add_overflows(e.offset, e.size, end))
            return format_error(path, e.blame_pos, e.field,
                                fmt::format("tensor {}: offset {} + size {} overflows 64 bits",
                                            quote_name(e.name), e.offset, e.size));
        if (end > file_size)
            return format_error(path, e.blame_pos, e.field,
                                fmt::format("tensor {}: data [{}, {}) ends past the end of the "
                                            "file ({} bytes)", quote_name(e.name), e.offset, end,
                                            file_size));
    }
    std::erase_if(extents, [](const TensorExtent& e) { return e.size == 0; });
    std::sort(extents.begin(), extents.end(), [](const TensorExtent& a, const TensorExtent& b) {
        return a.offset != b.offset ? a.offset < b.offset : a.size < b.size;
    });
    for (std::size_t i = 1; i < extents.size(); ++i) {
        const TensorExtent& a = extents[i - 1];
        const TensorExtent& b = extents[i];
        // Sorted by offset and no earlier extent reaches past a's end unless it overlapped a.
        if (a.offset + a.size > b.offset)
            return format_error(path, b.blame_pos, b.field,
                                fmt::format("tensor {} [{}, {}) overlaps tensor {} [{}, {})",
                                            quote_name(b.name), b.offset, b.offset + b.size,
                                            quote_name(a.name), a.offset, a.offset + a.size));
    }
    return {};
}

} // namespace wm::formats
