// SPDX-License-Identifier: MIT
// The A/B switch, read in one place: PlanOptions::import_enabled, else WEIGHTMAP_IMPORT.
#pragma once

#include <optional>
#include <string>

namespace wm::internal {

/// True unless `option` is false or (when unset) WEIGHTMAP_IMPORT is "0". When false, `why_not`
/// gets the reason regions carry ("disabled by WEIGHTMAP_IMPORT=0", ...).
bool import_switch_enabled(const std::optional<bool>& option, std::string* why_not);

} // namespace wm::internal
