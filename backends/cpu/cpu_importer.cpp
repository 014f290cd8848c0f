// SPDX-License-Identifier: MIT
// CPU passthrough: the CPU reads the mapping where it is, so "importing" is naming the pointer.
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
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
    // Passthrough acquires nothing: the base records the import as live.
    Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) override {
        ImportedBuffer buffer;
        buffer.host_address = host_address;
        buffer.size = size;
        buffer.device_address = host_address;
        return buffer;
    }

    // Passthrough pins nothing; Importer::release has checked the buffer was a live import.
    Status release_checked(const ImportedBuffer&) noexcept override { return {}; }

    // An import through the base (its live record checked there); a copy only when this
    // importer made it and has not freed it: a forged one's address may be unmapped.
    Status read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                             std::uint64_t size, void* dst) override {
        if (buffer.imported) return Importer::read_back_checked(buffer, offset, size, dst);
        {
            std::lock_guard lock(mutex_);
            auto it = copies_.find(buffer.host_address);
            if (it == copies_.end() || it->second != buffer.size ||
                buffer.device_address != buffer.host_address)
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("cpu read_back: {} +{} is not a copy this importer "
                                              "allocated (or it was freed)", buffer.host_address,
                                              buffer.size));
        }
        std::memcpy(dst, static_cast<const std::byte*>(buffer.host_address) + offset, size);
        return {};
    }

public:
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
};

} // namespace

std::unique_ptr<Importer> make_cpu_importer() { return std::make_unique<CpuImporter>(); }

} // namespace wm
