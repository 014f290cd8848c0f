// SPDX-License-Identifier: MIT
// The importer interface's one precondition check, and the defaults of its optional entries.
#include "weightmap/importer.hpp"

#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

#include <fmt/format.h>

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

} // namespace

// A backend that runs out of memory recording an import has undone it (internal/undo.hpp);
// the bad_alloc stops here, as no exception crosses the API.
Result<ImportedBuffer> Importer::import(void* host_address, std::uint64_t size) {
    try {
        if (Status s = check_import(*this, host_address, size); !s) return std::move(s).error();
        return import_checked(host_address, size);
    } catch (const std::bad_alloc&) {
        return Error{ErrorKind::out_of_memory, "out of memory"};
    }
}

Status Importer::read_back(const ImportedBuffer& buffer, std::uint64_t offset, std::uint64_t size,
                           void* dst) {
    if (buffer.device_address == nullptr)
        return make_error(ErrorKind::unsupported,
                          fmt::format("{} importer cannot read its buffers back", name()));
    if (offset > buffer.size || size > buffer.size - offset)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("read_back [{}, +{}) outside a buffer of {} bytes", offset,
                                      size, buffer.size));
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
