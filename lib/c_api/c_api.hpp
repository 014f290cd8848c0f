// SPDX-License-Identifier: MIT
// What the C API's translation units share: the handles, error reporting and the struct_size
// rules. Internal.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "weightmap/executor.hpp"
#include "weightmap/importer.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/model.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/result.hpp"
#include "weightmap/split_sync.hpp"
#include "weightmap/weightmap.h"

struct wm_importer {
    std::unique_ptr<wm::Importer> importer;
    /// `reason` as a string that lives as long as the handle: wm_importer_available hands out
    /// pointers that another thread's call must not overwrite. One copy per distinct reason
    /// (an importer has few: unavailable, device lost).
    const char* keep_reason(std::string reason) {
        std::lock_guard<std::mutex> lock(reasons_mutex);
        return reasons.insert(std::move(reason)).first->c_str();
    }

private:
    std::mutex reasons_mutex; // guards reasons
    std::set<std::string> reasons; // nodes never move or go while the handle lives
};

struct wm_model {
    wm::ModelDesc desc;
};

// A plan the caller owns (plan points at storage) or the executed plan of a placement (plan
// points into the placement, storage stays empty).
struct wm_plan {
    wm::Plan storage;
    const wm::Plan* plan = &storage;
};

struct wm_placement {
    wm::Placement placement;
    wm_plan plan_view;
};

struct wm_mapping_decision {
    wm::MappingDecision decision;
};

struct wm_mapped_model {
    wm::MappedModel mapped;
    std::vector<wm_mapped_file> files; // C view of mapped.files(), made once at open
};

struct wm_split_sync {
    wm::SplitSync sync;
};

namespace wm::c_api {

/// Records `message` as this thread's last error and returns `status`.
wm_status fail(wm_status status, std::string message);
/// The C status of a C++ error, recorded as this thread's last error as "FUNCTION: MESSAGE".
wm_status fail(const char* function, const Error& error);
wm_status status_of(ErrorKind kind) noexcept;
/// A wm_device_memory as C stored it; any other int is unknown.
DeviceMemory device_memory_from_c(const wm_device_memory& memory) noexcept;
/// Wraps `importer` in a new handle in *out; WM_OK.
wm_status hand_out(std::unique_ptr<Importer> importer, wm_importer** out);
ErrorKind kind_of(wm_status status) noexcept;

/// Runs `body` (returning wm_status) so that no exception crosses into C: bad_alloc becomes
/// WM_ERROR_OUT_OF_MEMORY and anything else WM_ERROR_INTERNAL, naming `function`.
template <class Body>
wm_status guarded(const char* function, Body&& body) noexcept {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return fail(WM_ERROR_OUT_OF_MEMORY, std::string(function) + ": out of memory");
    } catch (const std::exception& e) {
        return fail(WM_ERROR_INTERNAL, std::string(function) + ": " + e.what());
    } catch (...) {
        return fail(WM_ERROR_INTERNAL, std::string(function) + ": unknown exception");
    }
}

/// WM_ERROR_INVALID_ARGUMENT "FUNCTION: NAME is NULL" when `pointer` is null.
inline bool null_arg(const void* pointer, const char* function, const char* name,
                     wm_status& status) {
    if (pointer != nullptr) return false;
    status = fail(WM_ERROR_INVALID_ARGUMENT, std::string(function) + ": " + name + " is NULL");
    return true;
}

inline std::string index_message(const std::string& where, const char* what, std::uint64_t index,
                                 std::uint64_t count) {
    return where + ": " + what + " " + std::to_string(index) + " is out of range (" +
           std::to_string(count) + ")";
}

/// WM_ERROR_INVALID_ARGUMENT "FUNCTION: WHAT INDEX is out of range (COUNT)" unless index < count.
inline bool bad_index(std::uint64_t index, std::uint64_t count, const char* function,
                      const char* what, wm_status& status) {
    if (index < count) return false;
    status = fail(WM_ERROR_INVALID_ARGUMENT, index_message(function, what, index, count));
    return true;
}

/// The integer a caller stored in a C enum, read without loading it as the enum type: C allows
/// any int there, and a C++ load of a value outside the enumerators is undefined behaviour
/// (UBSan: "not a valid value for type"), which an optimiser may use to drop the range check.
template <class Enum>
long long raw_enum(const Enum& value) noexcept {
    std::underlying_type_t<Enum> raw;
    std::memcpy(&raw, &value, sizeof raw);
    return static_cast<long long>(raw);
}

// The smallest struct_size each struct accepts: its size in the first version of weightmap.h.
// A struct still at its first version has sizeof; when a field is added, the value here stays
// (the offset of the first added field) and the new field gets its default for older callers.
template <class T>
inline constexpr std::size_t first_version_size = sizeof(T);
template <>
inline constexpr std::size_t first_version_size<wm_importer_caps> =
    offsetof(wm_importer_caps, device_memory);
template <>
inline constexpr std::size_t first_version_size<wm_plan_options> =
    offsetof(wm_plan_options, import_policy);

/// Checks the caller's struct_size of `in` (named `what` in messages).
template <class T>
bool bad_struct_size(const T* in, const char* function, const char* what, wm_status& status) {
    if (in->struct_size >= first_version_size<T>) return false;
    status = fail(WM_ERROR_INVALID_ARGUMENT,
                  std::string(function) + ": " + what + "->struct_size is " +
                      std::to_string(in->struct_size) + ", smaller than any version of it (" +
                      std::to_string(first_version_size<T>) + ")");
    return true;
}

/// An input struct over `defaults`: the caller's first struct_size bytes win.
template <class T>
T read_struct(const T& in, T defaults) {
    std::memcpy(&defaults, &in, std::min<std::size_t>(in.struct_size, sizeof(T)));
    defaults.struct_size = sizeof(T);
    return defaults;
}

/// Writes `value` into the caller's struct, no further than its struct_size.
template <class T>
void write_struct(T* out, T value) {
    const std::size_t size = std::min<std::size_t>(out->struct_size, sizeof(T));
    value.struct_size = out->struct_size;
    std::memcpy(out, &value, size);
}

/// Validates `out` (not null, big enough) and writes `value` into it.
template <class T>
wm_status write_out(T* out, T value, const char* function, const char* what) {
    wm_status status = WM_OK;
    if (null_arg(out, function, what, status) || bad_struct_size(out, function, what, status))
        return status;
    write_struct(out, std::move(value));
    return WM_OK;
}

ImporterCaps caps_from_c(const wm_importer_caps& caps) noexcept;
/// C caps whose notes point into `notes` (NUL-terminated, ImporterNotes says), or "" when empty.
wm_importer_caps caps_to_c(const ImporterCaps& caps, const ImporterNotes& notes = {}) noexcept;
ImportedBuffer buffer_from_c(const wm_imported_buffer& buffer);
wm_imported_buffer buffer_to_c(const ImportedBuffer& buffer);
/// A std::function sink over a C log callback (empty when `log` is NULL).
LogCallback log_from_c(wm_log_fn log, void* user);
/// The caller's `count` file mappings (wm_execute, wm_populate_imports, wm_cuda_pin_fallbacks).
std::vector<MappedFile> files_from_c(const wm_mapped_file* files, uint32_t count);

} // namespace wm::c_api
