// SPDX-License-Identifier: MIT
#include "internal/plan_edit.hpp"

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

} // namespace wm::internal
