// SPDX-License-Identifier: MIT
#include "planner/plan_edit.hpp"

#include <cassert>

namespace wm::internal {

void fall_back_region(Plan& plan, std::uint32_t region_index, const std::string& reason) {
    PlanRegion& region = plan.regions[region_index];
    region.decision = Decision::fallback;
    region.reason = reason;
    region.runs.clear();
    for (auto t : region.tensors) {
        plan.tensors[t].run = no_index;
        plan.tensors[t].reason = reason;
    }
}

void fall_back_run(Plan& plan, std::uint32_t region_index, std::uint32_t run,
                   const std::string& reason) {
    PlanRegion& region = plan.regions[region_index];
    assert(run < region.runs.size());
    for (std::uint32_t t : region.runs[run].tensors) {
        plan.tensors[t].run = no_index;
        plan.tensors[t].offset_in_run = 0;
        plan.tensors[t].reason = reason;
    }
    region.runs.erase(region.runs.begin() + run);
    // Later runs move down by one; their tensors follow (a run's tensors are the region's).
    for (std::uint32_t k = run; k < region.runs.size(); ++k)
        for (std::uint32_t t : region.runs[k].tensors) plan.tensors[t].run = k;
    if (region.runs.empty()) {
        region.decision = Decision::fallback;
        region.reason = reason;
    }
}

} // namespace wm::internal
