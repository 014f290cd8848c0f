// SPDX-License-Identifier: MIT
// What every model-reader fuzz target checks on each input: an error with a message, or a model
// that keeps every promise of formats.hpp and plans without error. Traps otherwise.
#pragma once

#include <string>
#include <string_view>

#include "formats/model_invariants.hpp"
#include "weightmap/formats.hpp"
#include "weightmap/placement_rules.hpp"
#include "weightmap/planner.hpp"

namespace wm::fuzz {

inline void check(const wm::Result<wm::ModelInfo>& model) {
    if (!model) {
        if (model.error().message.empty()) __builtin_trap();
        return;
    }
    if (!wm::test::model_invariant_violation(*model).empty()) __builtin_trap();
    static const wm::PlacementRules rules = [] {
        wm::PlacementRules r;
        r.add_cpu_moe();
        return r;
    }();
    auto desc = wm::to_model_desc(*model, rules,
                                  [](std::string_view name) -> wm::Result<wm::TargetDesc> {
        wm::TargetDesc t;
        t.name = std::string(name);
        t.caps.is_cpu = name == wm::cpu_target_name;
        return t;
    });
    if (!desc) __builtin_trap();
    wm::PlanOptions options;
    options.import_enabled = true;
    options.page_size = 4096;
    if (!wm::make_plan(*desc, options)) __builtin_trap();
}

} // namespace wm::fuzz
