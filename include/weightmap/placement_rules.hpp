// SPDX-License-Identifier: MIT
// placement_rules.hpp - which target each tensor goes to, as llama.cpp's `-ot` decides it, and
// the ModelDesc that a read model plus those rules make for the planner.
//
// A rule is an ECMAScript regular expression searched (not matched whole) in the tensor name and
// a target name; the first rule that matches wins, a tensor no rule matches goes to "device",
// and the target "CPU" is the CPU. wm-plan and wm-load use the same rules, so what wm-plan
// shows is what wm-load does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/formats.hpp"
#include "weightmap/model.hpp"
#include "weightmap/result.hpp"
#include "weightmap/span.hpp"

namespace wm {

/// Where a tensor goes when no rule matches it.
inline constexpr std::string_view default_target_name = "device";
/// The target name that means the CPU (llama.cpp's buffer type name).
inline constexpr std::string_view cpu_target_name = "CPU";
/// llama.cpp's `--cpu-moe`: every expert tensor on the CPU.
inline constexpr std::string_view cpu_moe_pattern = R"(\.ffn_(up|down|gate|gate_up)_(ch|)exps)";

/// One rule as given.
struct OverrideRule {
    std::string pattern; ///< ECMAScript regex, searched in the tensor name
    std::string target;  ///< target name; "CPU" is the CPU
};

/// An ordered list of rules. Copies share the compiled expressions (immutable), so a copy is
/// cheap. const member functions are safe to call from several threads at once; adding rules is
/// not concurrent with anything.
class WM_API PlacementRules {
public:
    PlacementRules();
    ~PlacementRules();
    PlacementRules(const PlacementRules&);
    PlacementRules& operator=(const PlacementRules&);
    PlacementRules(PlacementRules&&) noexcept;
    PlacementRules& operator=(PlacementRules&&) noexcept;

    /// Appends a rule. Fails (invalid_argument) for an empty target or a pattern std::regex
    /// refuses, naming the pattern and the regex error; the rules are unchanged then.
    Status add(std::string pattern, std::string target);

    /// Appends the rules of one `-ot` argument: "REGEX=TARGET" (split at the last '=', so a
    /// regex may contain '='), or llama.cpp's list form "R1=T1,R2=T2" when every comma-separated
    /// piece holds an '=' (otherwise the commas belong to the regex, as in `a{1,2}=CPU`).
    /// Fails (invalid_argument) for a piece without '=' or with an empty regex or target, or a
    /// bad regex; nothing is appended then.
    Status add_override(std::string_view spec);

    /// Appends llama.cpp's `--cpu-moe` rule: cpu_moe_pattern -> "CPU".
    void add_cpu_moe();

    /// The target of `tensor_name`: the first matching rule's, else default_target_name. The
    /// view stays valid while these rules live. Tensor names from readers are at most
    /// ReadLimits::max_name_length bytes, which keeps std::regex's recursion shallow; a rule
    /// with ambiguous nested repetition such as `(a|.)*` backtracks exponentially, as it does in
    /// llama.cpp - the rules are the user's, not the file's.
    std::string_view target_for(std::string_view tensor_name) const;

    /// The rules in order, as given.
    Span<const OverrideRule> rules() const noexcept { return rules_; }

private:
    struct Compiled;
    std::vector<OverrideRule> rules_;
    std::vector<std::shared_ptr<const Compiled>> compiled_;
};

/// Makes the planner's TargetDesc for a target name the rules produced, or refuses it (say, an
/// engine with no importer by that name). Called once per distinct name. It must return a CPU
/// target (caps.is_cpu) for "CPU" and a non-CPU one for every other name.
using TargetFactory = std::function<Result<TargetDesc>(std::string_view target_name)>;

/// Builds the planner's description of `model` placed by `rules`: one FileDesc per file (path,
/// size), one TensorDesc per tensor in ModelInfo order (same indices), and one TargetDesc per
/// target name in use: non-CPU targets in order of first use, then the CPU last. Each target's
/// name is the rule's target name (whatever the factory put there). Fails with the factory's
/// error, or invalid_argument when the factory's is_cpu disagrees with the name, or a tensor's
/// file index is out of range.
WM_API Result<ModelDesc> to_model_desc(const ModelInfo& model, const PlacementRules& rules,
                                const TargetFactory& make_target);

} // namespace wm
