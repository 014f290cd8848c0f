// SPDX-License-Identifier: MIT
// Plans a synthetic MoE-shaped model (experts on the CPU) in all three modes and prints the plan
// totals side by side: the smallest use of the public API, no file is opened.
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

int main() {
    constexpr std::uint64_t MiB = 1 << 20;
    wm::ModelDesc model;
    model.files = {{"synthetic-moe.gguf", 0}};
    auto cpu = wm::make_cpu_importer();
    wm::TargetDesc gpu{"GPU0", "gpu", {}};
    gpu.caps.needs_writable_mapping = true;
    gpu.caps.device_memory = wm::DeviceMemory::unified; // an APU: the default policy imports
    model.targets = {gpu, wm::target_for("CPU", *cpu)};
    std::uint64_t offset = 0;
    for (int layer = 0; layer < 48; ++layer) {
        auto add = [&](const std::string& name, std::uint64_t size, std::uint32_t target) {
            model.tensors.push_back({fmt::format("blk.{}.{}", layer, name), 0, offset, size, target});
            offset += (size + 31) / 32 * 32;
        };
        add("attn_qkv.weight", 12 * MiB, 0);
        add("ffn_gate_exps.weight", 128 * MiB, 1);
        add("ffn_up_exps.weight", 128 * MiB, 1);
        add("ffn_down_exps.weight", 128 * MiB, 1);
        add("attn_output.weight", 8 * MiB, 0);
    }
    model.files[0].size = offset;

    fmt::print("{:<6} {:>12} {:>12} {:>12} {:>8}\n", "mode", "device MiB", "imported MiB",
               "pinned MiB", "imports");
    for (wm::PlanMode mode : {wm::PlanMode::span, wm::PlanMode::gate, wm::PlanMode::runs}) {
        wm::PlanOptions options;
        options.mode = mode;
        auto plan = wm::make_plan(model, options);
        if (!plan) {
            fmt::print(stderr, "plan_synthetic: {}\n", plan.error().message);
            return 1;
        }
        const wm::PlanTotals& t = plan->totals;
        fmt::print("{:<6} {:>12} {:>12} {:>12} {:>8}\n", wm::to_string(mode), t.device_bytes / MiB,
                   t.imported_bytes / MiB, t.pinned_bytes / MiB, t.imports);
    }
    return 0;
}
