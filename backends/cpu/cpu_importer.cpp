// SPDX-License-Identifier: MIT
// CPU passthrough: the CPU reads the mapping where it is, so "importing" is naming the pointer.
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <utility>

#include <sys/mman.h>

#include <fmt/format.h>

#include "internal/nothrow.hpp"
#include "internal/sys_hooks.hpp"
#include "weightmap/registry.hpp"

namespace wm {
namespace {

class CpuImporter final : public Importer {
public:
    std::string_view name() const noexcept override { return "cpu"; }
    ImporterCaps caps() const noexcept override {
        ImporterCaps caps;
        caps.is_cpu = true;
        caps.alignment = 1;
        caps.survives_read_only_reprotect = true; // nothing is locked or registered
        caps.device_memory = DeviceMemory::unified;
        return caps;
    }
    ImporterNotes notes() const noexcept override { return {{}, "the CPU reads its own memory"}; }
    Availability available() const override { return {true, {}}; }

protected:
    // Passthrough acquires nothing: a record that throws leaves nothing imported.
    Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) override {
        ImportedBuffer buffer;
        buffer.host_address = host_address;
        buffer.size = size;
        buffer.device_address = host_address;
        std::lock_guard lock(mutex_);
        imports_.insert({host_address, size});
        return buffer;
    }

public:
    // Passthrough pins nothing, but a release of a buffer it never handed out (or handed back
    // already) is still the caller's bug: say so, as every other importer does.
    Status release(const ImportedBuffer& buffer) noexcept override {
        return internal::status_nothrow([&]() -> Status {
            std::lock_guard lock(mutex_);
            auto it = imports_.find({buffer.host_address, buffer.size});
            if (it == imports_.end())
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("cpu release: {} +{} is not a live import of this "
                                              "importer", buffer.host_address, buffer.size));
            imports_.erase(it);
            return {};
        });
    }

    // The control arm on the CPU: a private anonymous copy, as a CPU "device buffer" would be.
    Result<ImportedBuffer> allocate_copy(const void* src, std::uint64_t size) override {
        if (size == 0) return make_error(ErrorKind::invalid_argument, "cpu copy: zero size");
        // Through the syscall table, like the mapping layer, so fault tests can count it.
        void* p = internal::syscalls().map(nullptr, size, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return make_error(ErrorKind::io, fmt::format("cpu copy: mmap of {} anonymous bytes "
                                                         "failed: {}", size, std::strerror(errno)));
        std::memcpy(p, src, size);
        try {
            std::lock_guard lock(mutex_);
            copies_.emplace(p, size);
        } catch (const std::bad_alloc&) {
            internal::syscalls().unmap(p, size); // unrecorded, free_copy could never unmap it
            return Error{ErrorKind::out_of_memory, "out of memory"};
        }
        ImportedBuffer buffer;
        buffer.host_address = p;
        buffer.device_address = p;
        buffer.size = size;
        buffer.imported = false;
        return buffer;
    }

    // Only what allocate_copy made is unmapped: an import's host_address is the model's own
    // mapping, and munmap-ing it would pull the weights out from under every other tensor.
    Status free_copy(const ImportedBuffer& buffer) noexcept override {
        return internal::status_nothrow([&]() -> Status {
            {
                std::lock_guard lock(mutex_);
                auto it = copies_.find(buffer.host_address);
                if (it == copies_.end() || it->second != buffer.size)
                    return make_error(ErrorKind::invalid_argument,
                                      fmt::format("cpu free_copy: {} +{} is not a copy this "
                                                  "importer allocated (an import, or freed "
                                                  "already); nothing unmapped",
                                                  buffer.host_address, buffer.size));
                copies_.erase(it);
            }
            if (internal::syscalls().unmap(buffer.host_address, buffer.size) != 0)
                return make_error(ErrorKind::io, fmt::format("cpu copy: munmap failed: {}",
                                                             std::strerror(errno)));
            return {};
        });
    }

private:
    std::mutex mutex_;
    std::map<void*, std::uint64_t> copies_; // allocate_copy's live buffers and their sizes
    std::multiset<std::pair<void*, std::uint64_t>> imports_; // live imports (they may repeat)
};

} // namespace

std::unique_ptr<Importer> make_cpu_importer() { return std::make_unique<CpuImporter>(); }

} // namespace wm
