// SPDX-License-Identifier: MIT
// The process-wide record of device-held ranges (internal/held_ranges.hpp).
#include "internal/held_ranges.hpp"

#include <map>
#include <new>
#include <mutex>

#include <fmt/format.h>

namespace wm::internal {
namespace {

struct Held {
    std::uint64_t size;
    const char* holder;
};

struct Table {
    std::mutex mutex;
    std::multimap<std::uintptr_t, Held> ranges;
};

// Never destroyed (an importer destroyed by a static destructor still drops its ranges), and
// built in static storage: the noexcept callers must not meet a bad_alloc on first use.
Table& table() noexcept {
    alignas(Table) static unsigned char storage[sizeof(Table)];
    static Table* t = new (storage) Table;
    return *t;
}

} // namespace

void hold_range(const void* address, std::uint64_t size, const char* holder) {
    std::lock_guard<std::mutex> guard(table().mutex);
    table().ranges.emplace(reinterpret_cast<std::uintptr_t>(address), Held{size, holder});
}

void drop_range(const void* address, std::uint64_t size) noexcept {
    std::lock_guard<std::mutex> guard(table().mutex);
    auto [it, end] = table().ranges.equal_range(reinterpret_cast<std::uintptr_t>(address));
    for (; it != end; ++it)
        if (it->second.size == size) {
            table().ranges.erase(it);
            return;
        }
}

std::string held_overlap(const void* address, std::uint64_t size) noexcept {
    const auto begin = reinterpret_cast<std::uintptr_t>(address);
    std::lock_guard<std::mutex> guard(table().mutex);
    // Few ranges (one per import), so a scan is cheaper than keeping an interval tree right.
    for (const auto& [start, held] : table().ranges) {
        if (start >= begin + size || start + held.size <= begin) continue;
        try {
            return fmt::format("[{:#x}, +{:#x}) is locked by the {} importer", start, held.size,
                               held.holder);
        } catch (...) {
            return "held range";
        }
    }
    return {};
}

} // namespace wm::internal
