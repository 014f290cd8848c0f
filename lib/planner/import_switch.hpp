// SPDX-License-Identifier: MIT
// The A/B switch, resolved at the edges: PlanOptions::import_enabled, else WEIGHTMAP_IMPORT.
//
// This is the only place the planning path reads the environment. The edges (make_plan,
// load_model; the C API and the tools through them) resolve the switch once and hand the result
// to the planner's core (plan_core.hpp), which reads no environment: the same model, options and
// switch always give the same plan.
#pragma once

#include <optional>
#include <string>

namespace wm::internal {

/// The switch once resolved. `why_not` is the reason the disabled regions carry ("disabled by
/// WEIGHTMAP_IMPORT=0", ...); empty when enabled.
struct ImportSwitch {
    bool enabled = true;
    std::string why_not;
};

/// `option` when it is set; unset: off when WEIGHTMAP_IMPORT is "0" (read with getenv, so call
/// it once per plan or load, at the edge), else on.
ImportSwitch resolve_import_switch(const std::optional<bool>& option);

} // namespace wm::internal
