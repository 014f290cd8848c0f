// SPDX-License-Identifier: MIT
// The A/B switch: the one function of the planning path that reads the environment
// (WEIGHTMAP_IMPORT). The edges call it once, make_plan (planner.cpp) and load_model; the
// planner's core (make_plan_with_switch) only ever sees its result.
#include "planner/import_switch.hpp"

#include <cstdlib>
#include <string_view>

namespace wm::internal {

ImportSwitch resolve_import_switch(const std::optional<bool>& option) {
    if (option.has_value())
        return {*option, *option ? "" : "disabled by PlanOptions::import_enabled = false"};
    const char* env = std::getenv("WEIGHTMAP_IMPORT");
    if (env != nullptr && std::string_view(env) == "0")
        return {false, "disabled by WEIGHTMAP_IMPORT=0"};
    return {};
}

} // namespace wm::internal
