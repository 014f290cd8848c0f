// SPDX-License-Identifier: MIT
// The OS mapping layer: the system call table, and mapping weight files (MappedModel). It knows
// no importer, registry or planner; which access to ask for is decided a layer above
// (mapping_decision.cpp).
#include "weightmap/mapping.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "internal/align.hpp"
#include "internal/held_ranges.hpp"
#include "internal/model_file.hpp"
#include "internal/page_size.hpp"
#include "internal/sys_hooks.hpp"
#include "internal/writable_reopen.hpp"
#include "weightmap/log.hpp"

namespace wm {

namespace internal {
namespace {
int libc_open(const char* path, int flags) { return ::open(path, flags | O_CLOEXEC); }
const SysCalls libc_table{&libc_open, &::close, &::mmap, &::munmap, &::mlock, &::munlock,
                          &::mprotect, &::madvise, &::pread};
std::atomic<const SysCalls*> current{&libc_table};
} // namespace
const SysCalls& syscalls() noexcept { return *current.load(std::memory_order_acquire); }
void set_syscalls(const SysCalls* table) noexcept {
    current.store(table != nullptr ? table : &libc_table, std::memory_order_release);
}
const SysCalls& libc_syscalls() noexcept { return libc_table; }
} // namespace internal

using internal::syscalls;

const char* to_string(MappingAccess access) noexcept {
    return access == MappingAccess::writable ? "writable" : "read_only";
}

namespace {

struct FileMapping {
    std::byte* base = nullptr;
    std::uint64_t length = 0;   // mapped length, whole pages
    std::uint64_t size = 0;     // file size
    bool locked = false;
};

void unmap(FileMapping& m) noexcept {
    if (m.base == nullptr) return;
    // A device may still read a locked range: unmapping it would fire the MMU notifier on a
    // registered range (a fatal fault with XNACK on), so it stays mapped - a leak of address
    // space, not of correctness - and the engine hears about its wrong teardown order.
    if (std::string held = internal::held_overlap(m.base, m.length); !held.empty()) {
        try {
            log_message({}, LogLevel::error,
                        "mapping left in place at teardown: " + held +
                            "; release the placement before the mapping");
        } catch (...) { // bad_alloc: the mapping still stays, unannounced
        }
        m = {};
        return;
    }
    if (m.locked) syscalls().unlock(m.base, m.length);
    syscalls().unmap(m.base, m.length);
    m = {};
}

// Maps [0, length) of fd at an address aligned to `alignment` (> page): reserve a larger
// PROT_NONE range, map the file over an aligned spot in it with MAP_FIXED, trim the rest.
Result<std::byte*> map_aligned(int fd, std::uint64_t length, int prot, int flags,
                               std::uint64_t alignment, const std::string& path) {
    const std::uint64_t page = host_page_size();
    if (alignment <= page) {
        void* p = syscalls().map(nullptr, length, prot, flags, fd, 0);
        if (p == MAP_FAILED)
            return make_error(ErrorKind::io, fmt::format("mmap of '{}' ({} bytes) failed: {}",
                                                         path, length, std::strerror(errno)));
        return static_cast<std::byte*>(p);
    }
    std::uint64_t reserve = length + alignment;
    void* r = syscalls().map(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED)
        return make_error(ErrorKind::io, fmt::format("mmap reserve for '{}' ({} bytes) failed: {}",
                                                     path, reserve, std::strerror(errno)));
    auto start = reinterpret_cast<std::uintptr_t>(r);
    std::uintptr_t aligned = align_up_saturating(start, alignment);
    void* p = syscalls().map(reinterpret_cast<void*>(aligned), length, prot, flags | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        syscalls().unmap(r, reserve);
        return make_error(ErrorKind::io, fmt::format("mmap of '{}' ({} bytes, aligned to {}) "
                                                     "failed: {}", path, length, alignment,
                                                     std::strerror(err)));
    }
    if (aligned > start) syscalls().unmap(r, aligned - start);
    std::uintptr_t tail = aligned + length, reserve_end = start + reserve;
    if (reserve_end > tail) syscalls().unmap(reinterpret_cast<void*>(tail), reserve_end - tail);
    return static_cast<std::byte*>(p);
}

Result<FileMapping> map_one(const std::string& path, MappingAccess access,
                            const MappingOptions& options) {
    const std::uint64_t page = host_page_size();
    const bool writable = access == MappingAccess::writable;
    // Always O_RDONLY first: a writable descriptor is only ever the rules' reopen of this one.
    auto opened = internal::open_model_file(path);
    if (!opened) return std::move(opened).error();
    int fd = opened->fd;
    const struct stat st = opened->st;
    if (st.st_size <= 0) {
        syscalls().close_file(fd);
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("'{}' is an empty file: nothing to map", path));
    }
    if (writable) {
        auto rw = internal::reopen_writable(fd, fmt::format("'{}'", path));
        syscalls().close_file(fd);
        if (!rw) return std::move(rw).error();
        fd = rw->fd;
    }
    FileMapping m;
    m.size = static_cast<std::uint64_t>(st.st_size);
    m.length = align_up_saturating(m.size, page);
    // Always MAP_SHARED, never MAP_PRIVATE: see mapping.hpp (a private writable mapping is
    // copied page by page by MAP_POPULATE/mlock, +1024 MiB RssAnon for a 1 GiB file).
    const int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    const int flags = MAP_SHARED | (options.populate ? MAP_POPULATE : 0);
    auto base = map_aligned(fd, m.length, prot, flags, std::max(options.base_alignment, page), path);
    syscalls().close_file(fd); // the mapping keeps the file referenced
    if (!base) return std::move(base).error();
    m.base = base.value();
    if (options.hint != AccessHint::normal)
        syscalls().advise(m.base, m.length,
                          options.hint == AccessHint::random ? MADV_RANDOM : MADV_SEQUENTIAL);
    if (options.will_need) syscalls().advise(m.base, m.length, MADV_WILLNEED);
    if (options.lock) {
        if (syscalls().lock(m.base, m.length) != 0) {
            int err = errno;
            unmap(m);
            return make_error(ErrorKind::io,
                              fmt::format("mlock of '{}' ({} bytes) failed: {}{}", path,
                                          m.length, std::strerror(err),
                                          err == ENOMEM || err == EPERM
                                              ? " (RLIMIT_MEMLOCK too low or no CAP_IPC_LOCK)"
                                              : ""));
        }
        m.locked = true;
    }
    return m;
}

} // namespace

struct MappedModel::Impl {
    std::vector<std::string> paths;
    std::vector<FileMapping> mappings;
    std::vector<MappedFile> views;
    std::vector<std::uint64_t> sizes;
    MappingAccess access = MappingAccess::read_only;
    bool read_only = true;

    ~Impl() {
        for (auto it = mappings.rbegin(); it != mappings.rend(); ++it) unmap(*it);
    }
};

MappedModel::MappedModel() : impl_(std::make_unique<Impl>()) {}
MappedModel::MappedModel(MappedModel&&) noexcept = default;
MappedModel& MappedModel::operator=(MappedModel&&) noexcept = default;
MappedModel::~MappedModel() = default;

Result<MappedModel> MappedModel::open(Span<const std::string> paths, MappingAccess access,
                                      const MappingOptions& options) {
    if (paths.empty())
        return make_error(ErrorKind::invalid_argument, "MappedModel::open: no files given");
    if (options.base_alignment != 0 && !is_power_of_two(options.base_alignment))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("MappingOptions::base_alignment {} is not a power of two",
                                      options.base_alignment));
    MappedModel model;
    Impl& impl = *model.impl_;
    impl.access = access;
    impl.read_only = access == MappingAccess::read_only;
    impl.paths.assign(paths.begin(), paths.end());
    // Reserved before the first mmap: a push_back that threw after one would leak that mapping.
    impl.mappings.reserve(paths.size());
    impl.views.reserve(paths.size());
    impl.sizes.reserve(paths.size());
    for (const std::string& path : paths) {
        auto mapped = map_one(path, access, options);
        if (!mapped) return std::move(mapped).error(); // ~MappedModel unmaps files 0..k-1
        impl.mappings.push_back(mapped.value());
        impl.views.push_back({mapped->base, mapped->length});
        impl.sizes.push_back(mapped->size);
    }
    return model;
}

Span<const MappedFile> MappedModel::files() const noexcept { return impl_->views; }
Span<const std::uint64_t> MappedModel::file_sizes() const noexcept { return impl_->sizes; }
const std::vector<std::string>& MappedModel::paths() const noexcept { return impl_->paths; }
MappingAccess MappedModel::access() const noexcept { return impl_->access; }
bool MappedModel::is_read_only() const noexcept { return impl_->read_only; }

Status MappedModel::make_read_only() {
    if (impl_->read_only) return {};
    // An mprotect of a locked range is an MMU-notifier event the device pays for (docs/hsa.md).
    for (std::size_t i = 0; i < impl_->mappings.size(); ++i)
        if (std::string held = internal::held_overlap(impl_->mappings[i].base,
                                                      impl_->mappings[i].length);
            !held.empty())
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("mprotect(PROT_READ) of '{}' refused: {}, which must "
                                          "not see an mprotect while the device may read it",
                                          impl_->paths[i], held));
    for (std::size_t i = 0; i < impl_->mappings.size(); ++i) {
        FileMapping& m = impl_->mappings[i];
        if (syscalls().protect(m.base, m.length, PROT_READ) != 0) {
            int err = errno;
            // Restore what was already dropped so the mapping is uniformly writable again.
            for (std::size_t j = 0; j < i; ++j)
                syscalls().protect(impl_->mappings[j].base, impl_->mappings[j].length,
                                   PROT_READ | PROT_WRITE);
            return make_error(ErrorKind::io, fmt::format("mprotect(PROT_READ) of '{}' failed: {}",
                                                         impl_->paths[i], std::strerror(err)));
        }
    }
    impl_->read_only = true;
    return {};
}

} // namespace wm
