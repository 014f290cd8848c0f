// SPDX-License-Identifier: MIT
// The A/B switch and make_plan, the planner's public edge. make_plan is defined here, not in
// planner.cpp, so that nothing reachable from planner.cpp reads the environment: planner.cpp is
// the pure core (tensors, options and a resolved switch in, plan out), and this file is where
// WEIGHTMAP_IMPORT enters.
#include "internal/import_switch.hpp"

#include <cstdlib>
#include <string_view>

#include "internal/plan_core.hpp"

namespace wm {
namespace internal {

ImportSwitch resolve_import_switch(const std::optional<bool>& option) {
    if (option.has_value())
        return {*option, *option ? "" : "disabled by PlanOptions::import_enabled = false"};
    const char* env = std::getenv("WEIGHTMAP_IMPORT");
    if (env != nullptr && std::string_view(env) == "0")
        return {false, "disabled by WEIGHTMAP_IMPORT=0"};
    return {};
}

} // namespace internal

Result<Plan> make_plan(const ModelDesc& model, const PlanOptions& options) {
    return internal::make_plan_with_switch(model, options,
                                           internal::resolve_import_switch(options.import_enabled));
}

} // namespace wm
