// SPDX-License-Identifier: MIT
// log.hpp - where libweightmap's warnings go.
//
// A failed import is not an error for the engine (its tensors fall back to a device copy), but
// the engine's user wants to know why: such events are reported through a log callback.
#pragma once

#include <functional>
#include <string_view>

#include "weightmap/export.h"

namespace wm {

enum class LogLevel { debug, info, warning, error };

/// Receives one line (no trailing newline). Called from whichever thread triggered the event;
/// it must be thread-safe if the engine loads models from several threads.
using LogCallback = std::function<void(LogLevel level, std::string_view message)>;

/// Sets the process-wide default callback used where a call's params carry none.
/// An empty callback restores the default: warnings and errors to stderr, prefixed "weightmap: ".
/// Thread-safe; affects calls that start after it returns.
WM_API void set_log_callback(LogCallback callback);

/// Sends one message to `callback` if it is set, otherwise to the process-wide default.
WM_API void log_message(const LogCallback& callback, LogLevel level, std::string_view message);

} // namespace wm
