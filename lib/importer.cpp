// SPDX-License-Identifier: MIT
// The importer interface's one precondition check, and the defaults of its optional entries.
#include "weightmap/importer.hpp"

#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>

#include <fmt/format.h>

#include "internal/nothrow.hpp"

namespace wm {

// Plain data is the point: caps() may be called from any thread, on every import.
static_assert(std::is_trivially_copyable_v<ImporterCaps>);

ImporterNotes Importer::notes() const noexcept { return {}; }

namespace {

// " (note)", or nothing for an empty note.
std::string because(std::string_view note) {
    return note.empty() ? std::string() : fmt::format(" ({})", note);
}

// Why here and not in each backend: every backend refused the same bad ranges with its own
// wording, and one that forgot a check handed a driver a range it answers with a bare error.
Status check_import(const Importer& importer, void* host_address, std::uint64_t size) {
    const ImporterCaps caps = importer.caps();
    const ImporterNotes notes = importer.notes();
    const std::string_view name = importer.name();
    const std::uint64_t align = caps.alignment != 0 ? caps.alignment : 1;
    const auto address = reinterpret_cast<std::uintptr_t>(host_address);
    if (host_address == nullptr || size == 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} import: null address ({}) or zero size ({})", name,
                                      host_address, size));
    if (address % align != 0 || size % align != 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} import: {} +{:#x} is not aligned to {} bytes{}", name,
                                      host_address, size, align, because(notes.alignment)));
    if (size > UINTPTR_MAX - address)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} import: {} +{:#x} wraps the address space", name,
                                      host_address, size));
    if (caps.max_import_size != 0 && size > caps.max_import_size)
        return make_error(ErrorKind::limit,
                          fmt::format("{} import: {} bytes is over the maximum import size of "
                                      "{} bytes{}", name, size, caps.max_import_size,
                                      because(notes.max_import_size)));
    return {};
}

// Every live import of every importer, process-wide: release() and read_back() of anything else
// reached the backend, and the default read_back() copied from a forged or unmapped address
// (issue 44 item 1: wm_importer_read_back of a released CPU import segfaulted). A set rather
// than a member of Importer, so the class layout engines subclass stays as it was.
class LiveImports {
public:
    // Addresses as integers: they are ordered, where pointers to unrelated objects are not.
    using Key = std::tuple<std::uintptr_t, std::uintptr_t, std::uint64_t, std::uintptr_t,
                           std::uint64_t, std::uint64_t>;
    static Key key(const Importer& importer, const ImportedBuffer& b) noexcept {
        return {address_of(&importer), address_of(b.host_address), b.size,
                address_of(b.device_address), b.native_memory, b.native_buffer};
    }
    void add(const Key& k) { // may throw bad_alloc, with nothing added
        std::lock_guard lock(mutex_);
        live_.insert(k);
    }
    bool remove(const Key& k) noexcept {
        std::lock_guard lock(mutex_);
        const auto it = live_.find(k);
        if (it == live_.end()) return false;
        live_.erase(it);
        return true;
    }
    bool contains(const Key& k) const noexcept {
        std::lock_guard lock(mutex_);
        return live_.count(k) != 0;
    }
    void forget(const Importer* importer) noexcept {
        const std::uintptr_t at = address_of(importer);
        std::lock_guard lock(mutex_);
        live_.erase(live_.lower_bound(Key{at, 0, 0, 0, 0, 0}),
                    live_.lower_bound(Key{at + 1, 0, 0, 0, 0, 0}));
    }

private:
    static std::uintptr_t address_of(const void* p) noexcept {
        return reinterpret_cast<std::uintptr_t>(p);
    }
    mutable std::mutex mutex_;
    std::multiset<Key> live_; // the same range may be imported twice
};

LiveImports& live_imports() {
    static LiveImports* live = new LiveImports; // never destroyed: importers may outlive statics
    return *live;
}

// Records `buffer`, the backend's result for [address, +size), as a live import; or the error
// that refuses it. It must be that range: base + offset == mapping + file offset for every
// tensor depends on it (issue 44 item 11: wm_importer_import handed a NULL host, size 0, half
// the size or a moved range back as WM_OK, which wm_execute refused).
std::optional<Error> record_live(const Importer& importer, const ImportedBuffer& buffer,
                                 void* address, std::uint64_t size) {
    if (buffer.host_address != address || buffer.size < size)
        return make_error(ErrorKind::import_failed,
                          fmt::format("{} importer returned {} +{:#x} for {} +{:#x}",
                                      importer.name(), buffer.host_address, buffer.size, address,
                                      size));
    try {
        live_imports().add(LiveImports::key(importer, buffer));
    } catch (const std::bad_alloc&) {
        return Error{ErrorKind::out_of_memory, "out of memory"};
    }
    return std::nullopt;
}

} // namespace

Importer::~Importer() { live_imports().forget(this); }

// A backend that runs out of memory recording an import has undone it (internal/undo.hpp);
// the bad_alloc stops here, as no exception crosses the API.
Result<ImportedBuffer> Importer::import(void* host_address, std::uint64_t size) {
    try {
        if (Status s = check_import(*this, host_address, size); !s) return std::move(s).error();
        Result<ImportedBuffer> imported = import_checked(host_address, size);
        if (!imported) return imported;
        std::optional<Error> refused = record_live(*this, imported.value(), host_address, size);
        if (!refused) return imported;
        if (Status s = release_checked(imported.value()); !s)
            refused->message += fmt::format(" (and releasing it failed: {})", s.error().message);
        return *std::move(refused);
    } catch (const std::bad_alloc&) {
        return Error{ErrorKind::out_of_memory, "out of memory"};
    }
}

Status Importer::release(const ImportedBuffer& buffer) noexcept {
    if (!live_imports().remove(LiveImports::key(*this, buffer)))
        return internal::status_nothrow([&] {
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("{} release: {} +{:#x} is not a live import of this "
                                          "importer (released already, or never imported)",
                                          name(), buffer.host_address, buffer.size));
        });
    return release_checked(buffer);
}

Status Importer::read_back(const ImportedBuffer& buffer, std::uint64_t offset, std::uint64_t size,
                           void* dst) {
    if (buffer.imported && !live_imports().contains(LiveImports::key(*this, buffer)))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} read_back: {} +{:#x} is not a live import of this "
                                      "importer (released already, or never imported)", name(),
                                      buffer.host_address, buffer.size));
    if (offset > buffer.size || size > buffer.size - offset)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("read_back [{}, +{}) outside a buffer of {} bytes", offset,
                                      size, buffer.size));
    return read_back_checked(buffer, offset, size, dst);
}

Status Importer::read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                                   std::uint64_t size, void* dst) {
    if (!buffer.imported || buffer.device_address == nullptr)
        return make_error(ErrorKind::unsupported,
                          fmt::format("{} importer cannot read {} back", name(),
                                      buffer.imported ? "its buffers" : "a copy it did not make"));
    std::memcpy(dst, static_cast<const std::byte*>(buffer.device_address) + offset, size);
    return {};
}

Result<ImportedBuffer> Importer::allocate_copy(const void*, std::uint64_t) {
    return make_error(ErrorKind::unsupported,
                      fmt::format("{} importer cannot allocate device copies", name()));
}

Status Importer::free_copy(const ImportedBuffer&) noexcept {
    return make_error(ErrorKind::unsupported,
                      fmt::format("{} importer has no device copies to free", name()));
}

} // namespace wm
