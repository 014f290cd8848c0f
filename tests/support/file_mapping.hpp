// SPDX-License-Identifier: MIT
// A test's own MAP_SHARED mapping of a file: what the importer tests (HSA, CUDA) import from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "weightmap/mapped_file.hpp"

namespace wm::test {

/// A test's own MAP_SHARED mapping of a file, writable or PROT_READ.
class FileMapping {
public:
    FileMapping(const std::string& path, std::uint64_t size, bool writable) {
        int fd = open(path.c_str(), writable ? O_RDWR : O_RDONLY);
        if (fd < 0) throw std::runtime_error("open " + path);
        const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
        length_ = (size + page - 1) / page * page;
        void* p = mmap(nullptr, length_, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) throw std::runtime_error("mmap " + path);
        base_ = static_cast<std::byte*>(p);
    }
    ~FileMapping() { munmap(base_, length_); }
    FileMapping(const FileMapping&) = delete;
    FileMapping& operator=(const FileMapping&) = delete;
    std::byte* base() const { return base_; }
    std::uint64_t length() const { return length_; }
    MappedFile view() const { return {base_, length_}; }

private:
    std::byte* base_ = nullptr;
    std::uint64_t length_ = 0;
};

} // namespace wm::test
