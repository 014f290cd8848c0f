// SPDX-License-Identifier: MIT
#include "support/temp_file.hpp"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

namespace wm::test {
namespace {
std::string tmp_root() {
    const char* dir = std::getenv("TMPDIR");
    return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}
} // namespace

TempFile::TempFile(std::uint64_t size, const std::string& suffix) : size_(size) {
    std::string templ = tmp_root() + "/weightmap-test-XXXXXX" + suffix;
    int fd = mkstemps(templ.data(), static_cast<int>(suffix.size()));
    if (fd < 0) throw std::runtime_error("mkstemps failed for " + templ);
    path_ = templ;
    std::vector<std::byte> chunk(1 << 20);
    for (std::uint64_t done = 0; done < size;) {
        std::uint64_t n = std::min<std::uint64_t>(chunk.size(), size - done);
        testkit::fill_model_pattern(done, Span<std::byte>(chunk.data(), n));
        if (write(fd, chunk.data(), n) != static_cast<ssize_t>(n)) {
            close(fd);
            throw std::runtime_error("write failed for " + path_);
        }
        done += n;
    }
    close(fd);
}

TempFile::~TempFile() { unlink(path_.c_str()); }

TempDir::TempDir() {
    std::string templ = tmp_root() + "/weightmap-dir-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
}

TempDir::~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
}

std::uint64_t hash_file(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("open failed for " + path);
    std::uint64_t h = 1469598103934665603ull;
    std::vector<unsigned char> buf(1 << 20);
    for (;;) {
        ssize_t n = read(fd, buf.data(), buf.size());
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; ++i) h = (h ^ buf[static_cast<std::size_t>(i)]) * 1099511628211ull;
    }
    close(fd);
    return h;
}

std::size_t open_fds() {
    std::size_t n = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
        while (readdir(d) != nullptr) ++n;
        closedir(d);
    }
    return n;
}

} // namespace wm::test
