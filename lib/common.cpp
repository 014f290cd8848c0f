// SPDX-License-Identifier: MIT
// Small shared pieces of the public API: error names, the log sink, target descriptions.
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "weightmap/log.hpp"
#include "weightmap/model.hpp"
#include "weightmap/result.hpp"

namespace wm {

const char* to_string(ErrorKind kind) noexcept {
    switch (kind) {
    case ErrorKind::invalid_argument: return "invalid_argument";
    case ErrorKind::io: return "io";
    case ErrorKind::format: return "format";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::import_failed: return "import_failed";
    case ErrorKind::limit: return "limit";
    case ErrorKind::aborted: return "aborted";
    case ErrorKind::internal: return "internal";
    case ErrorKind::out_of_memory: return "out_of_memory";
    }
    return "unknown";
}

namespace detail {
void value_of_error(const Error& error) noexcept {
    std::fprintf(stderr, "weightmap: Result::value() called on an error: %s: %s\n",
                 to_string(error.kind), error.message.c_str());
    std::abort();
}

const Error& no_error() noexcept {
    static const Error none{ErrorKind::internal, "not an error: the Result holds a value"};
    return none;
}
} // namespace detail

namespace {
std::mutex log_mutex;
LogCallback& default_callback() {
    static LogCallback callback;
    return callback;
}
const char* level_name(LogLevel level) {
    switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
    }
    return "?";
}
} // namespace

void set_log_callback(LogCallback callback) {
    std::lock_guard lock(log_mutex);
    default_callback() = std::move(callback);
}

void log_message(const LogCallback& callback, LogLevel level, std::string_view message) {
    if (callback) {
        callback(level, message);
        return;
    }
    LogCallback sink;
    {
        std::lock_guard lock(log_mutex);
        sink = default_callback();
    }
    if (sink) {
        sink(level, message);
    } else if (level >= LogLevel::warning) {
        fmt::print(stderr, "weightmap: {}: {}\n", level_name(level), message);
    }
}

TargetDesc target_for(std::string name, const Importer& importer) {
    TargetDesc target;
    target.name = std::move(name);
    target.importer_key = std::string(importer.name());
    target.caps = importer.caps();
    const ImporterNotes notes = importer.notes();
    target.file_pages_note = notes.file_pages;
    target.device_memory_note = notes.device_memory;
    return target;
}

} // namespace wm
