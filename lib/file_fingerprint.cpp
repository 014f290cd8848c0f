// SPDX-License-Identifier: MIT
#include "internal/file_fingerprint.hpp"

#include "internal/page_size.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <xxhash.h>

namespace wm::internal {

namespace {

std::uint64_t file_size(int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

// The whole of [offset, offset + length) through pread, or false.
bool read_all(int fd, std::uint64_t offset, std::uint32_t length, std::vector<char>& buffer) {
    buffer.resize(length);
    int error = 0;
    return pread_full(fd, buffer.data(), length, offset, error) == length;
}

// Page-aligned starts of the pages of `regions` inside [0, size): every `stride`-th page of each
// region and its last one.
std::vector<std::uint64_t> sampled_pages(const std::vector<FileFingerprint::Range>& regions, std::uint64_t size,
                                         std::size_t max_pages) {
    const std::uint64_t page = host_page_size();
    std::vector<FileFingerprint::Range> clamped;
    std::uint64_t total = 0;
    for (const FileFingerprint::Range& r : regions.empty() ? std::vector<FileFingerprint::Range>{{0, size}} : regions) {
        if (r.offset >= size || r.size == 0) continue;
        const std::uint64_t first = r.offset / page * page;
        const std::uint64_t end = std::min(size, r.offset + std::min(r.size, size - r.offset));
        clamped.push_back({first, end - first});
        total += (end - first + page - 1) / page;
    }
    const std::uint64_t stride = std::max<std::uint64_t>(1, (total + max_pages - 1) / std::max<std::size_t>(1, max_pages));
    std::vector<std::uint64_t> starts;
    for (const FileFingerprint::Range& r : clamped) {
        const std::uint64_t last = (r.offset + r.size - 1) / page * page;
        for (std::uint64_t at = r.offset; at <= last; at += stride * page) starts.push_back(at);
        if (starts.back() != last) starts.push_back(last);
    }
    std::sort(starts.begin(), starts.end());
    starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
    return starts;
}

} // namespace

std::size_t pread_full(int fd, void* destination, std::size_t size, std::uint64_t offset, int& error) {
    auto* to = static_cast<char*>(destination);
    error = 0;
    std::size_t done = 0;
    while (done < size) {
        const ssize_t n = ::pread(fd, to + done, size - done, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) error = errno;
        if (n <= 0) break;
        done += static_cast<std::size_t>(n);
    }
    return done;
}

FileFingerprint FileFingerprint::take(int fd, const std::vector<FileFingerprint::Range>& regions,
                                      std::size_t max_pages) {
    FileFingerprint f;
    f.size_ = file_size(fd);
    std::vector<char> buffer;
    for (std::uint64_t at : sampled_pages(regions, f.size_, max_pages)) {
        const auto length = static_cast<std::uint32_t>(std::min(host_page_size(), f.size_ - at));
        const std::uint64_t hash = read_all(fd, at, length, buffer) ? XXH3_64bits(buffer.data(), length) : 0;
        f.samples_.push_back({at, length, hash});
    }
    return f;
}

bool FileFingerprint::matches(int fd) const {
    if (file_size(fd) != size_) return false;
    std::vector<char> buffer;
    for (const Sample& s : samples_)
        if (!read_all(fd, s.offset, s.length, buffer) || XXH3_64bits(buffer.data(), s.length) != s.hash)
            return false;
    return true;
}

} // namespace wm::internal
