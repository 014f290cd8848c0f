// SPDX-License-Identifier: MIT
// Turning a planned import into a fallback after planning (a refused import, a mapping that
// could not be made writable). Internal: engines see the result in Placement::plan().
#pragma once

#include <cstdint>
#include <string>

#include "weightmap/planner.hpp"

namespace wm::internal {

/// Region `region` imports nothing: its runs are dropped and every tensor carries `reason`.
/// Totals are not recomputed (callers call compute_totals once at the end).
void fall_back_region(Plan& plan, std::uint32_t region, const std::string& reason);

} // namespace wm::internal
