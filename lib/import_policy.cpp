// SPDX-License-Identifier: MIT
#include "weightmap/import_policy.hpp"

namespace wm {

const char* to_string(DeviceMemory memory) noexcept {
    switch (memory) {
    case DeviceMemory::unknown: return "unknown";
    case DeviceMemory::unified: return "unified";
    case DeviceMemory::discrete: return "discrete";
    }
    return "?";
}

const char* to_string(ImportPolicy policy) noexcept {
    switch (policy) {
    case ImportPolicy::unified_only: return "unified_only";
    case ImportPolicy::always: return "always";
    case ImportPolicy::never: return "never";
    }
    return "?";
}

bool import_allowed(ImportPolicy policy, DeviceMemory memory) noexcept {
    switch (policy) {
    case ImportPolicy::always: return true;
    case ImportPolicy::never: return false;
    case ImportPolicy::unified_only: return memory == DeviceMemory::unified;
    }
    return false;
}

} // namespace wm
