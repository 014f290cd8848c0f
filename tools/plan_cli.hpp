// SPDX-License-Identifier: MIT
// The plan options wm-plan and wm-load share: -ot/--override, --cpu-moe, --mode, --align,
// --tensor-alignment, --device, --import-policy.
// One definition, so what wm-plan shows is what wm-load does.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "weightmap/placement_rules.hpp"
#include "weightmap/planner.hpp"

namespace wm::tools {

/// Parses argv with llama.cpp's spelling `-ot` accepted (CLI11 short options are one letter):
/// "-ot" becomes "--override" before CLI11 sees it.
inline void parse_with_llama_spelling(CLI::App& app, int argc, char** argv) {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) {
        std::string arg = argv[i];
        args.push_back(arg == "-ot" ? std::string("--override") : arg);
    }
    app.parse(args); // CLI11 takes the arguments in reverse order
}

/// CLI11 check: a power of two (1 included), else why not.
inline std::string power_of_two_check(const std::string& v) {
    std::uint64_t n = 0;
    try {
        n = std::stoull(v);
    } catch (...) {
        return "not a number: " + v;
    }
    return n != 0 && (n & (n - 1)) == 0 ? "" : "must be a power of two: " + v;
}

class PlanCli {
public:
    void add_options(CLI::App& app) {
        app.add_option("--ot,--override", overrides_,
                       "REGEX=TARGET: tensors whose name matches go to TARGET (repeatable, first "
                       "match wins; CPU is the CPU; unmatched tensors go to 'device')")
            ->take_all()
            ->allow_extra_args(false);
        app.add_flag("--cpu-moe", cpu_moe_, "every expert tensor on the CPU (llama.cpp --cpu-moe)");
        app.add_option("--mode", mode_, "span|gate|runs (default runs)")
            ->check(CLI::IsMember({"span", "gate", "runs"}));
        app.add_option("--align", align_, "importer alignment in bytes (default: the importer's, "
                                          "at least the page size)")
            ->check(power_of_two_check);
        app.add_option("--tensor-alignment", tensor_alignment_,
                       "alignment every device tensor's offset in its import must meet, in bytes "
                       "(an engine buffer type's, e.g. ggml-vulkan's minStorageBufferOffsetAlignment; "
                       "default: the importer's, none for wm-plan): a tensor off it falls back alone")
            ->check(power_of_two_check);
        app.add_option("--device", device_,
                       "unified|discrete|unknown: plan as if the device reached imported memory "
                       "this way (a what-if; wm-load still refuses what its importer's own answer "
                       "refuses)")
            ->check(CLI::IsMember({"unified", "discrete", "coherent", "unknown"}));
        app.add_option("--import-policy", policy_,
                       "unified_only|always|never (default unified_only: import only on a "
                       "unified-memory device)")
            ->check(CLI::IsMember({"unified_only", "always", "never"}));
    }

    /// The placement rules, in the order given; --cpu-moe comes after the -ot rules (llama.cpp
    /// appends it the same way).
    Result<PlacementRules> rules() const {
        PlacementRules rules;
        for (const std::string& spec : overrides_)
            if (Status s = rules.add_override(spec); !s) return std::move(s).error();
        if (cpu_moe_) rules.add_cpu_moe();
        return rules;
    }

    PlanOptions plan_options() const {
        PlanOptions options;
        options.mode = mode_ == "span" ? PlanMode::span
                       : mode_ == "gate" ? PlanMode::gate
                                         : PlanMode::runs;
        options.import_policy = policy_ == "always"  ? ImportPolicy::always
                                : policy_ == "never" ? ImportPolicy::never
                                                     : ImportPolicy::unified_only;
        return options;
    }

    /// Applies --align, --tensor-alignment and --device to a non-CPU target.
    TargetDesc adjust(TargetDesc target) const {
        if (target.caps.is_cpu) return target;
        if (!align_.empty()) target.caps.alignment = std::stoull(align_);
        if (!tensor_alignment_.empty())
            target.caps.tensor_alignment = std::stoull(tensor_alignment_);
        if (!device_.empty()) {
            target.caps.device_memory = device_ == "unified"    ? DeviceMemory::unified
                                        : device_ == "discrete" ? DeviceMemory::discrete
                                        : device_ == "coherent" ? DeviceMemory::coherent
                                                                : DeviceMemory::unknown;
            target.device_memory_note = "--device " + device_;
        }
        return target;
    }

private:
    std::vector<std::string> overrides_;
    bool cpu_moe_ = false;
    std::string mode_ = "runs";
    std::string align_;
    std::string tensor_alignment_;
    std::string device_;
    std::string policy_ = "unified_only";
};

} // namespace wm::tools
