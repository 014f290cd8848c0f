// SPDX-License-Identifier: MIT
#include "internal/import_switch.hpp"

#include <cstdlib>
#include <string_view>

namespace wm::internal {

bool import_switch_enabled(const std::optional<bool>& option, std::string* why_not) {
    if (option.has_value()) {
        if (!*option && why_not != nullptr)
            *why_not = "disabled by PlanOptions::import_enabled = false";
        return *option;
    }
    const char* env = std::getenv("WEIGHTMAP_IMPORT");
    if (env != nullptr && std::string_view(env) == "0") {
        if (why_not != nullptr) *why_not = "disabled by WEIGHTMAP_IMPORT=0";
        return false;
    }
    return true;
}

} // namespace wm::internal
