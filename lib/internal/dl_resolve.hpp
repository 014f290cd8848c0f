// SPDX-License-Identifier: MIT
// Finding and resolving a dlopened runtime (the HSA runtime, the CUDA driver): one helper so
// that every backend picks its library and reports a missing symbol the same way.
#pragma once

#include <cstdlib>
#include <string>

#include <dlfcn.h>

#include <fmt/format.h>

namespace wm::internal {

/// dlsym(handle, symbol) into `out`. On failure leaves `out` alone, sets `missing` to
/// "symbol (dlerror)" and returns false.
template <class Fn>
bool resolve_symbol(void* handle, const char* symbol, Fn& out, std::string& missing) {
    dlerror();
    void* p = dlsym(handle, symbol);
    if (p == nullptr) {
        const char* why = dlerror();
        missing = fmt::format("{} ({})", symbol, why != nullptr ? why : "null symbol");
        return false;
    }
    out = reinterpret_cast<Fn>(p);
    return true;
}

/// The library a backend dlopens: `requested` when set, else $`env` when set and non-empty,
/// else `fallback` (found on the dynamic linker's search path).
inline std::string library_path(const std::string& requested, const char* env,
                                const char* fallback) {
    if (!requested.empty()) return requested;
    const char* value = std::getenv(env);
    if (value != nullptr && *value != '\0') return value;
    return fallback;
}

} // namespace wm::internal
