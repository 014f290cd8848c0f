// SPDX-License-Identifier: MIT
// The C API's status codes, thread-local last error, version and log sink.
#include <string>

#include "c_api.hpp"
#include "weightmap/log.hpp"

namespace wm::c_api {
namespace {
thread_local std::string last_error;
} // namespace

wm_status fail(wm_status status, std::string message) {
    last_error = std::move(message);
    return status;
}

wm_status fail(const char* function, const Error& error) {
    return fail(status_of(error.kind), std::string(function) + ": " + error.message);
}

wm_status status_of(ErrorKind kind) noexcept {
    switch (kind) {
    case ErrorKind::invalid_argument: return WM_ERROR_INVALID_ARGUMENT;
    case ErrorKind::io: return WM_ERROR_IO;
    case ErrorKind::format: return WM_ERROR_FORMAT;
    case ErrorKind::unsupported: return WM_ERROR_UNSUPPORTED;
    case ErrorKind::import_failed: return WM_ERROR_IMPORT_FAILED;
    case ErrorKind::limit: return WM_ERROR_LIMIT;
    case ErrorKind::aborted: return WM_ERROR_ABORTED;
    case ErrorKind::internal: return WM_ERROR_INTERNAL;
    case ErrorKind::out_of_memory: return WM_ERROR_OUT_OF_MEMORY;
    }
    return WM_ERROR_INTERNAL;
}

ErrorKind kind_of(wm_status status) noexcept {
    switch (status) {
    case WM_ERROR_INVALID_ARGUMENT: return ErrorKind::invalid_argument;
    case WM_ERROR_IO: return ErrorKind::io;
    case WM_ERROR_FORMAT: return ErrorKind::format;
    case WM_ERROR_UNSUPPORTED: return ErrorKind::unsupported;
    case WM_ERROR_LIMIT: return ErrorKind::limit;
    case WM_ERROR_ABORTED: return ErrorKind::aborted;
    case WM_ERROR_INTERNAL: return ErrorKind::internal;
    case WM_ERROR_OUT_OF_MEMORY: return ErrorKind::out_of_memory;
    case WM_OK:
    case WM_ERROR_IMPORT_FAILED: break;
    }
    return ErrorKind::import_failed;
}

std::vector<MappedFile> files_from_c(const wm_mapped_file* files, uint32_t count) {
    std::vector<MappedFile> mapped;
    mapped.reserve(count);
    for (uint32_t f = 0; f < count; ++f)
        mapped.push_back({static_cast<std::byte*>(files[f].base), files[f].length});
    return mapped;
}

LogCallback log_from_c(wm_log_fn log, void* user) {
    if (log == nullptr) return {};
    return [log, user](LogLevel level, std::string_view message) {
        const std::string line(message); // the C side wants a NUL-terminated string
        log(user, static_cast<wm_log_level>(level), line.c_str());
    };
}

} // namespace wm::c_api

using namespace wm::c_api;

extern "C" {

const char* wm_status_name(wm_status status) {
    switch (status) {
    case WM_OK: return "ok";
    case WM_ERROR_INVALID_ARGUMENT: return "invalid_argument";
    case WM_ERROR_IO: return "io";
    case WM_ERROR_FORMAT: return "format";
    case WM_ERROR_UNSUPPORTED: return "unsupported";
    case WM_ERROR_IMPORT_FAILED: return "import_failed";
    case WM_ERROR_LIMIT: return "limit";
    case WM_ERROR_ABORTED: return "aborted";
    case WM_ERROR_INTERNAL: return "internal";
    case WM_ERROR_OUT_OF_MEMORY: return "out_of_memory";
    }
    return "unknown";
}

// Through raw_enum: C may pass any int, which a switch over the enum type must not see.
const char* wm_device_memory_name(wm_device_memory memory) {
    const long long raw = raw_enum(memory);
    if (raw < WM_DEVICE_MEMORY_UNKNOWN || raw > WM_DEVICE_MEMORY_COHERENT) return "?";
    return wm::to_string(static_cast<wm::DeviceMemory>(raw));
}

const char* wm_import_policy_name(wm_import_policy policy) {
    const long long raw = raw_enum(policy);
    if (raw == WM_IMPORT_POLICY_FROM_OPTIONS) return "from_options";
    if (raw < WM_IMPORT_POLICY_UNIFIED_ONLY || raw > WM_IMPORT_POLICY_NEVER) return "?";
    return wm::to_string(static_cast<wm::ImportPolicy>(raw));
}

const char* wm_last_error(void) { return last_error.c_str(); }

uint32_t wm_version(void) { return WM_VERSION_NUMBER; }

const char* wm_version_string(void) { return WM_VERSION_STRING; }

void wm_set_log_callback(wm_log_fn log, void* user) {
    try {
        wm::set_log_callback(log_from_c(log, user));
    } catch (...) {
        // Only a failed std::function allocation can throw; the old sink stays.
    }
}

} // extern "C"
