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

/// Run `run` of region `region` imports nothing: it is dropped from the region's runs, its
/// tensors fall back with `reason`, and the tensors of the later runs keep pointing at their
/// own runs (TensorPlacement::run is decremented past the dropped one; offsets are unchanged).
/// The region's other runs stay; when none is left the region is a fallback whose reason is
/// `reason`. Totals are not recomputed.
void fall_back_run(Plan& plan, std::uint32_t region, std::uint32_t run, const std::string& reason);

} // namespace wm::internal
