// SPDX-License-Identifier: MIT
// The planner's pure core: make_plan with the A/B switch already resolved.
#pragma once

#include "planner/import_switch.hpp"
#include "weightmap/planner.hpp"

namespace wm::internal {

/// make_plan without the environment: `import_switch` decides in place of
/// options.import_enabled (ignored here) and WEIGHTMAP_IMPORT, which the caller resolved
/// (resolve_import_switch). Same contract and thread-safety as make_plan otherwise.
Result<Plan> make_plan_with_switch(const ModelDesc& model, const PlanOptions& options,
                                   const ImportSwitch& import_switch);

} // namespace wm::internal
