// SPDX-License-Identifier: MIT
// C importers: the registry's, the CPU passthrough, and an engine's own through a vtable.
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "c_api.hpp"
#include "internal/nothrow.hpp"
#include "weightmap/log.hpp"
#include "weightmap/registry.hpp"

namespace wm::c_api {

DeviceMemory device_memory_from_c(const wm_device_memory& memory) noexcept {
    // Any value C passed that is not a wm_device_memory counts as unknown: the safe answer.
    const long long raw = raw_enum(memory);
    return raw == WM_DEVICE_MEMORY_UNIFIED    ? DeviceMemory::unified
           : raw == WM_DEVICE_MEMORY_DISCRETE ? DeviceMemory::discrete
           : raw == WM_DEVICE_MEMORY_COHERENT ? DeviceMemory::coherent
                                              : DeviceMemory::unknown;
}

ImporterCaps caps_from_c(const wm_importer_caps& caps) noexcept {
    ImporterCaps out;
    out.needs_writable_mapping = caps.needs_writable_mapping;
    out.alignment = caps.alignment;
    out.max_import_size = caps.max_import_size;
    out.is_cpu = caps.is_cpu;
    out.survives_read_only_reprotect = caps.survives_read_only_reprotect;
    out.refuses_file_pages = caps.refuses_file_pages;
    out.device_memory = device_memory_from_c(caps.device_memory);
    out.tensor_alignment = caps.tensor_alignment;
    return out;
}

namespace {
// A note as C sees it: never NULL, so caps of an importer without notes need no check.
const char* note_to_c(std::string_view note) noexcept {
    return note.empty() ? "" : note.data();
}
} // namespace

wm_importer_caps caps_to_c(const ImporterCaps& caps, const ImporterNotes& notes) noexcept {
    wm_importer_caps out{};
    out.struct_size = sizeof out;
    out.needs_writable_mapping = caps.needs_writable_mapping;
    out.alignment = caps.alignment;
    out.max_import_size = caps.max_import_size;
    out.is_cpu = caps.is_cpu;
    out.survives_read_only_reprotect = caps.survives_read_only_reprotect;
    out.refuses_file_pages = caps.refuses_file_pages;
    out.file_pages_note = note_to_c(notes.file_pages);
    out.device_memory = static_cast<wm_device_memory>(caps.device_memory);
    out.device_memory_note = note_to_c(notes.device_memory);
    out.tensor_alignment = caps.tensor_alignment;
    return out;
}

ImportedBuffer buffer_from_c(const wm_imported_buffer& buffer) {
    return {buffer.host_address, buffer.size, buffer.device_address, buffer.native_memory,
            buffer.native_buffer, buffer.imported};
}

wm_imported_buffer buffer_to_c(const ImportedBuffer& buffer) {
    return {buffer.host_address, buffer.size, buffer.device_address, buffer.native_memory,
            buffer.native_buffer, buffer.imported};
}

namespace {

constexpr std::size_t reason_capacity = 1024;

// What an engine callback returned, as a valid wm_status: C lets it return any int, which a
// C++ switch over wm_status must not see (undefined behaviour; raw_enum says why).
wm_status callback_status(long long raw) noexcept {
    if (raw < WM_OK || raw > WM_ERROR_OUT_OF_MEMORY) return WM_ERROR_INTERNAL;
    return static_cast<wm_status>(raw);
}

// The text a callback wrote into its reason buffer, or `otherwise` when it wrote none.
std::string reason_text(std::vector<char>& reason, const std::string& otherwise) {
    reason.back() = '\0'; // a callback that filled the buffer may have left no NUL
    return reason[0] != '\0' ? std::string(reason.data()) : otherwise;
}

// An engine's callback threw (a C++ engine behind the C table): what the callback's wrapper
// reports instead, naming the callback, as no exception may cross the API (issue 44 item 8:
// a throwing caps or release callback went through a noexcept wrapper into std::terminate).
Error callback_threw(std::string_view importer, const char* callback) noexcept {
    try {
        try {
            throw;
        } catch (const std::bad_alloc&) {
            return Error{ErrorKind::out_of_memory, "out of memory"};
        } catch (const std::exception& e) {
            return make_error(ErrorKind::internal,
                              fmt::format("custom importer '{}': its {} callback threw: {}",
                                          importer, callback, e.what()));
        } catch (...) {
            return make_error(ErrorKind::internal,
                              fmt::format("custom importer '{}': its {} callback threw an "
                                          "exception that is not a std::exception", importer,
                                          callback));
        }
    } catch (...) { // formatting the message ran out of memory
        return Error{ErrorKind::internal, "a custom importer's callback threw"};
    }
}

// An importer the engine supplies as a table of C function pointers. Every callback is called
// inside a try: C++ engines supply such tables too, and their functions may throw.
class VtableImporter final : public Importer {
public:
    // The caps are read once here, and kept: the notes because caps() must not allocate and the
    // C API hands out pointers to them; the caps as what a later caps() call that throws
    // returns. A caps callback that throws here fails the creation (CreationFailed, which
    // wm_importer_create_custom reports).
    VtableImporter(const wm_importer_vtable& vtable, void* user)
        : vtable_(vtable), user_(user), name_(vtable.name) {
        Result<wm_importer_caps> caps = read_caps();
        if (!caps) throw CreationFailed{std::move(caps).error()};
        created_caps_ = caps_from_c(caps.value());
        file_pages_note_ = note_or_empty(caps->file_pages_note);
        device_memory_note_ = note_or_empty(caps->device_memory_note);
    }
    ~VtableImporter() override {
        if (vtable_.destroy == nullptr) return;
        try {
            vtable_.destroy(user_);
        } catch (...) {
            log_message({}, LogLevel::error, callback_threw(name_, "destroy").message);
        }
    }

    struct CreationFailed {
        Error error;
    };

    std::string_view name() const noexcept override { return name_; }

    // A caps callback that throws after creation: logged, and the caps read at creation stand.
    ImporterCaps caps() const noexcept override {
        Result<wm_importer_caps> caps = read_caps();
        if (caps) return caps_from_c(caps.value());
        log_message({}, LogLevel::error,
                    caps.error().message + "; using the caps it gave at creation");
        return created_caps_;
    }
    ImporterNotes notes() const noexcept override {
        return {file_pages_note_, device_memory_note_, {}, {}};
    }

    /// The caps callback's answer now, or why there is none.
    Result<wm_importer_caps> read_caps() const noexcept {
        wm_importer_caps caps = caps_to_c(ImporterCaps{});
        try {
            vtable_.caps(user_, &caps);
        } catch (...) {
            return callback_threw(name_, "caps");
        }
        return caps;
    }

    Availability available() const override {
        if (vtable_.available == nullptr) return {true, {}};
        std::vector<char> reason(reason_capacity, '\0');
        try {
            if (vtable_.available(user_, reason.data(), reason.size())) return {true, {}};
        } catch (...) {
            return {false, callback_threw(name_, "available").message};
        }
        return {false, reason_text(reason, name_ + " says it is unavailable (no reason given)")};
    }

protected:
    Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) override {
        wm_imported_buffer out{};
        out.imported = true;
        std::vector<char> reason(reason_capacity, '\0');
        wm_status status = WM_OK;
        try {
            status = callback_status(raw_enum(
                vtable_.import(user_, host_address, size, &out, reason.data(), reason.size())));
        } catch (...) {
            return callback_threw(name_, "import");
        }
        if (status != WM_OK)
            return make_error(kind_of(status),
                              reason_text(reason, std::string(wm_status_name(status)) +
                                                      " (no reason given)"));
        return buffer_from_c(out);
    }

    Status release_checked(const ImportedBuffer& buffer) noexcept override {
        const wm_imported_buffer c_buffer = buffer_to_c(buffer);
        wm_status status = WM_OK;
        try {
            status = callback_status(raw_enum(vtable_.release(user_, &c_buffer)));
        } catch (...) {
            return callback_threw(name_, "release");
        }
        if (status == WM_OK) return {};
        return internal::status_nothrow(
            [&] { return make_error(kind_of(status), wm_status_name(status)); });
    }

    Status read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                             std::uint64_t size, void* dst) override {
        if (vtable_.read_back == nullptr)
            return Importer::read_back_checked(buffer, offset, size, dst);
        const wm_imported_buffer c_buffer = buffer_to_c(buffer);
        std::vector<char> reason(reason_capacity, '\0');
        wm_status status = WM_OK;
        try {
            status = callback_status(raw_enum(vtable_.read_back(
                user_, &c_buffer, offset, size, dst, reason.data(), reason.size())));
        } catch (...) {
            return callback_threw(name_, "read_back");
        }
        if (status == WM_OK) return {};
        return make_error(kind_of(status), reason_text(reason, wm_status_name(status)));
    }

private:
    static std::string note_or_empty(const char* note) { return note != nullptr ? note : ""; }

    wm_importer_vtable vtable_;
    void* user_;
    std::string name_;
    ImporterCaps created_caps_;
    std::string file_pages_note_, device_memory_note_; // the caps callback's, at creation
};


// Registry entries as NUL-terminated strings (the table holds string_views).
struct RegistryStrings {
    std::vector<std::string> names, notes;
};
const RegistryStrings& registry_strings() {
    static const RegistryStrings strings = [] {
        RegistryStrings s;
        for (const ImporterEntry& entry : importer_registry()) {
            s.names.emplace_back(entry.name);
            s.notes.emplace_back(entry.build_note);
        }
        return s;
    }();
    return strings;
}

} // namespace

wm_status hand_out(std::unique_ptr<Importer> importer, wm_importer** out) {
    auto handle = std::make_unique<wm_importer>();
    handle->importer = std::move(importer);
    *out = handle.release();
    return WM_OK;
}

} // namespace wm::c_api

using namespace wm::c_api;

extern "C" {

wm_status wm_importer_create_custom(const wm_importer_vtable* vtable, void* user,
                                    wm_importer** out) {
    static constexpr const char* fn = "wm_importer_create_custom";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(vtable, fn, "vtable", status) || null_arg(out, fn, "out", status) ||
            bad_struct_size(vtable, fn, "vtable", status))
            return status;
        const wm_importer_vtable table = read_struct(*vtable, wm_importer_vtable{});
        const char* missing = table.name == nullptr || table.name[0] == '\0' ? "name"
                              : table.caps == nullptr                        ? "caps"
                              : table.import == nullptr                      ? "import"
                              : table.release == nullptr                     ? "release"
                                                                             : nullptr;
        if (missing != nullptr)
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(fn) + ": vtable->" + missing + " is required");
        // The handle first: once the VtableImporter exists, its destructor runs the engine's
        // destroy, which a creation that reports failure (out of memory) must not do.
        auto handle = std::make_unique<wm_importer>();
        try {
            handle->importer = std::make_unique<VtableImporter>(table, user);
        } catch (const VtableImporter::CreationFailed& failed) {
            return fail(fn, failed.error);
        }
        *out = handle.release();
        return WM_OK;
    });
}

uint32_t wm_registry_count(void) {
    return static_cast<uint32_t>(wm::importer_registry().size());
}

wm_status wm_registry_get(uint32_t index, wm_registry_entry* out) {
    static constexpr const char* fn = "wm_registry_get";
    return guarded(fn, [&] {
        const auto table = wm::importer_registry();
        if (index >= table.size())
            return fail(WM_ERROR_INVALID_ARGUMENT, std::string(fn) + ": index " +
                                                       std::to_string(index) + " of " +
                                                       std::to_string(table.size()) + " entries");
        const RegistryStrings& strings = registry_strings();
        return write_out(out,
                         wm_registry_entry{sizeof(wm_registry_entry), strings.names[index].c_str(),
                                           table[index].built, strings.notes[index].c_str()},
                         fn, "out");
    });
}

wm_status wm_importer_create(const char* name, wm_importer** out) {
    static constexpr const char* fn = "wm_importer_create";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(name, fn, "name", status) || null_arg(out, fn, "out", status)) return status;
        auto created = wm::create_importer(name);
        if (!created) return fail(fn, created.error());
        return hand_out(std::move(created).value(), out);
    });
}

wm_status wm_importer_create_cpu(wm_importer** out) {
    static constexpr const char* fn = "wm_importer_create_cpu";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(out, fn, "out", status)) return status;
        return hand_out(wm::make_cpu_importer(), out);
    });
}

void wm_importer_destroy(wm_importer* importer) { delete importer; }

const char* wm_importer_name(const wm_importer* importer) {
    // Every importer's name is NUL-terminated: registry names are literals, a custom one a
    // std::string.
    return importer == nullptr ? nullptr : importer->importer->name().data();
}

wm_status wm_importer_get_caps(wm_importer* importer, wm_importer_caps* out) {
    static constexpr const char* fn = "wm_importer_get_caps";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(importer, fn, "importer", status)) return status;
        const wm::Importer& cpp = *importer->importer;
        // A custom importer's caps callback that throws is this call's error, not the caps it
        // gave at creation that caps() falls back on.
        wm::ImporterCaps caps;
        if (const auto* custom = dynamic_cast<const VtableImporter*>(&cpp)) {
            wm::Result<wm_importer_caps> read = custom->read_caps();
            if (!read) return fail(fn, read.error());
            caps = caps_from_c(read.value());
        } else {
            caps = cpp.caps();
        }
        return write_out(out, caps_to_c(caps, cpp.notes()), fn, "out");
    });
}

bool wm_importer_available(wm_importer* importer, const char** reason) {
    if (importer == nullptr) {
        fail(WM_ERROR_INVALID_ARGUMENT, "wm_importer_available: importer is NULL");
        if (reason != nullptr) *reason = "importer is NULL";
        return false;
    }
    try {
        wm::Availability availability = importer->importer->available();
        if (reason != nullptr) *reason = importer->keep_reason(std::move(availability.reason));
        return availability.available;
    } catch (const std::bad_alloc&) { // an available() that threw anything else said why
        fail(WM_ERROR_OUT_OF_MEMORY, "wm_importer_available: out of memory");
        if (reason != nullptr) *reason = "out of memory";
        return false;
    } catch (...) { // a registry importer's available() that threw: a bug of ours
        fail(WM_ERROR_INTERNAL, "wm_importer_available: the importer's available() threw");
        if (reason != nullptr) *reason = "the importer's available() threw";
        return false;
    }
}

wm_status wm_importer_read_back(wm_importer* importer, const wm_imported_buffer* buffer,
                                uint64_t offset, uint64_t size, void* dst) {
    static constexpr const char* fn = "wm_importer_read_back";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(importer, fn, "importer", status) || null_arg(buffer, fn, "buffer", status) ||
            (size != 0 && null_arg(dst, fn, "dst", status)))
            return status;
        if (offset > buffer->size || size > buffer->size - offset)
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(fn) + ": [" + std::to_string(offset) + ", +" +
                            std::to_string(size) + ") is outside the buffer of " +
                            std::to_string(buffer->size) + " bytes");
        wm::Status read = importer->importer->read_back(buffer_from_c(*buffer), offset, size, dst);
        return read ? WM_OK : fail(fn, read.error());
    });
}

wm_status wm_importer_import(wm_importer* importer, void* host_address, uint64_t size,
                             wm_imported_buffer* out) {
    static constexpr const char* fn = "wm_importer_import";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(importer, fn, "importer", status) || null_arg(out, fn, "out", status))
            return status;
        auto imported = importer->importer->import(host_address, size);
        if (!imported) return fail(fn, imported.error());
        *out = buffer_to_c(imported.value());
        return WM_OK;
    });
}

wm_status wm_importer_release(wm_importer* importer, const wm_imported_buffer* buffer) {
    static constexpr const char* fn = "wm_importer_release";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(importer, fn, "importer", status) || null_arg(buffer, fn, "buffer", status))
            return status;
        wm::Status released = importer->importer->release(buffer_from_c(*buffer));
        return released ? WM_OK : fail(fn, released.error());
    });
}

} // extern "C"
