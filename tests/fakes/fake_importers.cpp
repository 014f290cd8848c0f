// SPDX-License-Identifier: MIT
#include "fakes/fake_importers.hpp"

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace wm::test {

FakeImporter::FakeImporter(std::string name, ImporterCaps caps)
    : name_(std::move(name)), caps_(caps) {}

Result<ImportedBuffer> FakeImporter::import_checked(void* host_address, std::uint64_t size) {
    std::lock_guard lock(mutex_);
    ++import_calls_;
    imports_.push_back({host_address, size});
    if (fail_import_at != 0 && import_calls_ == fail_import_at)
        return make_error(ErrorKind::import_failed,
                          fmt::format("injected failure at import #{}", import_calls_));
    std::uint64_t align = reject_unaligned ? std::max<std::uint64_t>(caps_.alignment, 1) : 1;
    if (reinterpret_cast<std::uintptr_t>(host_address) % align != 0 || size % align != 0)
        return make_error(ErrorKind::import_failed, "HSA_STATUS_ERROR (unaligned)");
    if (reject_read_only && !range_is_writable(host_address, size))
        return make_error(ErrorKind::import_failed, "HSA_STATUS_ERROR (pages not writable)");
    ImportedBuffer buffer;
    buffer.host_address = static_cast<std::byte*>(host_address) + misalign_result_by;
    buffer.size = size;
    buffer.device_address = buffer.host_address;
    outstanding_.insert({buffer.host_address, buffer.size}); // may throw: before it counts
    ++live_;
    return buffer;
}

// Records first what cannot throw, so that a release under an allocation fault
// (support/alloc_fault.hpp) still takes the buffer back, as a real importer's does.
Status FakeImporter::release_checked(const ImportedBuffer& buffer) noexcept try {
    {
        std::lock_guard lock(mutex_);
        ++release_calls_;
        // Like a real importer: a buffer it did not hand out (or already took back) is refused.
        auto it = outstanding_.find({buffer.host_address, buffer.size});
        const bool live = it != outstanding_.end();
        if (live) {
            outstanding_.erase(it);
            --live_;
        }
        releases_.push_back({buffer.host_address, buffer.size});
        if (!live)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("{}: release of {} +{} that is not a live import",
                                          name_, buffer.host_address, buffer.size));
        if (fail_release_at != 0 && release_calls_ == fail_release_at)
            return make_error(ErrorKind::import_failed,
                              fmt::format("injected failure at release #{}", release_calls_));
        return {};
    }
} catch (...) {
    return Error{ErrorKind::out_of_memory, "out of memory"};
}

std::vector<FakeImporter::Call> FakeImporter::imports() const {
    std::lock_guard lock(mutex_);
    return imports_;
}
std::vector<FakeImporter::Call> FakeImporter::releases() const {
    std::lock_guard lock(mutex_);
    return releases_;
}
std::int64_t FakeImporter::live_imports() const {
    std::lock_guard lock(mutex_);
    return live_;
}

bool range_is_writable(const void* address, std::uint64_t size) {
    auto begin = reinterpret_cast<std::uintptr_t>(address);
    std::uintptr_t end = begin + size;
    std::ifstream maps("/proc/self/maps");
    std::string line;
    std::uintptr_t covered = begin;
    // /proc/self/maps is sorted by address: walk it, requiring contiguous writable coverage.
    while (covered < end && std::getline(maps, line)) {
        std::uintptr_t lo = 0, hi = 0;
        char perms[5] = {};
        if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) != 3)
            continue;
        if (hi <= covered || lo > covered) continue;
        if (perms[1] != 'w') return false;
        covered = hi;
    }
    return covered >= end;
}

ImporterCaps device_caps(std::uint64_t alignment, bool needs_writable) {
    ImporterCaps caps;
    caps.alignment = alignment;
    caps.needs_writable_mapping = needs_writable;
    caps.device_memory = DeviceMemory::unified;
    return caps;
}

} // namespace wm::test
