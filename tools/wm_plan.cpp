// SPDX-License-Identifier: MIT
// wm-plan [options] FILE... - what would be imported, before anything is loaded.
//
// Reads the model's headers (never its data), places tensors with llama.cpp-style -ot rules,
// plans, and prints the regions, their decisions and runs, and the totals - as a table, or with
// --json as one JSON object for scripts. Bad input: one line on stderr and exit status 1.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_main.hpp"
#include "plan_cli.hpp"
#include "weightmap/formats.hpp"
#include "weightmap/placement_rules.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

namespace {

struct Options {
    std::vector<std::string> files;
    bool json = false;
    wm::tools::PlanCli plan; // -ot/--override, --cpu-moe, --mode, --align, --tensor-alignment,
                             // --device, --import-policy: shared with wm-load
};

int fail(const std::string& message) { return wm::tools::fail_line("wm-plan", message); }

std::string mib(std::uint64_t bytes) {
    return fmt::format("{:.1f}", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

// The tensors of a device region that fall back for a reason of their own (not the region's):
// a tensor off the importer's tensor alignment, over the size limit, on a shared page, ...
std::vector<std::uint32_t> own_fallbacks(const wm::ModelDesc& desc, const wm::Plan& plan,
                                         const wm::PlanRegion& region) {
    std::vector<std::uint32_t> out;
    if (desc.targets[region.target].caps.is_cpu) return out;
    for (std::uint32_t t : region.tensors) {
        const wm::TensorPlacement& place = plan.tensors[t];
        if (place.run == wm::no_index && place.reason != region.reason) out.push_back(t);
    }
    return out;
}

nlohmann::ordered_json to_json(const wm::ModelInfo& info, const wm::ModelDesc& desc,
                               const wm::Plan& plan) {
    // ordered: keys come out in the documented order, for people reading it.
    using json = nlohmann::ordered_json;
    json files = json::array();
    for (const wm::ModelFile& f : info.files)
        files.push_back({{"path", f.path}, {"size", f.size}, {"format", wm::to_string(f.format)},
                         {"tensors", f.tensor_count}});
    json tensors = json::array();
    for (const wm::TensorDesc& t : desc.tensors)
        tensors.push_back({{"name", t.name}, {"file", t.file}, {"offset", t.offset},
                           {"size", t.size}, {"target", desc.targets[t.target].name}});
    json regions = json::array();
    for (const wm::PlanRegion& r : plan.regions) {
        const wm::TargetDesc& target = desc.targets[r.target];
        json runs = json::array();
        // Runs are what is pinned: the CPU's passthrough pins nothing.
        if (!target.caps.is_cpu && r.decision == wm::Decision::import)
            for (const wm::PlanRun& run : r.runs)
                runs.push_back({{"offset", run.extent_offset}, {"size", run.extent_size}});
        json fallbacks = json::array();
        for (std::uint32_t t : own_fallbacks(desc, plan, r))
            fallbacks.push_back({{"tensor", t}, {"name", desc.tensors[t].name},
                                 {"reason", plan.tensors[t].reason}});
        regions.push_back({{"target", target.name},
                           {"device_memory", wm::to_string(target.caps.device_memory)},
                           {"file", r.file}, {"first", r.first},
                           {"last", r.last}, {"ctx_bytes", r.ctx_bytes}, {"gate", r.gate},
                           {"decision", wm::to_string(r.decision)}, {"reason", r.reason},
                           {"runs", std::move(runs)},
                           {"fallback_tensors", std::move(fallbacks)}});
    }
    const wm::PlanTotals& t = plan.totals;
    json totals = {{"device_bytes", t.device_bytes}, {"imported_bytes", t.imported_bytes},
                   {"pinned_bytes", t.pinned_bytes}, {"fallback_bytes", t.fallback_bytes},
                   {"imports", t.imports}};
    return {{"import_policy", wm::to_string(plan.import_policy)},
            {"files", std::move(files)}, {"tensors", std::move(tensors)},
            {"regions", std::move(regions)}, {"totals", std::move(totals)}};
}

void print_table(const wm::ModelInfo& info, const wm::PlacementRules& rules,
                 const wm::ModelDesc& desc, const wm::Plan& plan) {
    std::uint64_t total = 0;
    for (const wm::TensorInfo& t : info.tensors) total += t.size;
    fmt::print("model: {}{} file(s), {} tensors, {} MiB of tensor data\n",
               info.architecture.empty() ? "" : info.architecture + ", ", info.files.size(),
               info.tensors.size(), mib(total));
    for (std::size_t i = 0; i < info.files.size(); ++i) {
        const wm::ModelFile& f = info.files[i];
        fmt::print("  [{}] {}  {}{}  {} bytes  alignment {}  data at {:#x}  {} tensors\n", i,
                   f.path, wm::to_string(f.format),
                   f.format == wm::ModelFormat::gguf ? fmt::format(" v{}", f.version) : "",
                   f.size, f.alignment, f.data_offset, f.tensor_count);
    }
    fmt::print("rules:");
    for (const wm::OverrideRule& r : rules.rules()) fmt::print(" '{}' -> {};", r.pattern, r.target);
    fmt::print(" otherwise {}\n", wm::default_target_name);
    fmt::print("plan: mode {}, page {}, import policy {}", wm::to_string(plan.mode),
               plan.page_size, wm::to_string(plan.import_policy));
    for (const wm::TargetDesc& t : desc.targets)
        if (!t.caps.is_cpu)
            fmt::print(", {} import alignment {}{} device memory {} ({})", t.name,
                       std::max({plan.page_size, t.caps.alignment, t.caps.tensor_alignment}),
                       t.caps.tensor_alignment > 1
                           ? fmt::format(" tensor alignment {}", t.caps.tensor_alignment)
                           : "",
                       wm::to_string(t.caps.device_memory), t.device_memory_note);
    fmt::print("\n\n");

    fmt::print("{:<10} {:>4} {:>7} {:>14} {:>14} {:>10} {:>10} {:>4}  {:<8}  {}\n", "target",
               "file", "tensors", "first", "last", "span MiB", "ctx MiB", "gate", "decision",
               "reason");
    constexpr std::size_t max_runs_shown = 16;
    for (const wm::PlanRegion& r : plan.regions) {
        const wm::TargetDesc& target = desc.targets[r.target];
        fmt::print("{:<10} {:>4} {:>7} {:>#14x} {:>#14x} {:>10} {:>10} {:>4}  {:<8}  {}\n",
                   target.name, r.file, r.tensors.size(), r.first, r.last, mib(r.last - r.first),
                   mib(r.ctx_bytes), r.gate ? "yes" : "no", wm::to_string(r.decision), r.reason);
        if (target.caps.is_cpu) continue;
        const std::size_t shown_runs = r.decision == wm::Decision::import ? r.runs.size() : 0;
        for (std::size_t k = 0; k < shown_runs && k < max_runs_shown; ++k) {
            const wm::PlanRun& run = r.runs[k];
            fmt::print("  run {:>3}: pin [{:#x}, {:#x})  {} MiB for {} tensor(s)\n", k,
                       run.extent_offset, run.extent_offset + run.extent_size,
                       mib(run.extent_size), run.tensors.size());
        }
        if (shown_runs > max_runs_shown)
            fmt::print("  ... {} more runs (--json lists every run)\n",
                       shown_runs - max_runs_shown);
        const std::vector<std::uint32_t> alone = own_fallbacks(desc, plan, r);
        for (std::size_t k = 0; k < alone.size() && k < max_runs_shown; ++k) {
            const wm::TensorDesc& t = desc.tensors[alone[k]];
            fmt::print("  falls back: {} [{:#x}, +{}): {}\n", t.name, t.offset, t.size,
                       plan.tensors[alone[k]].reason);
        }
        if (alone.size() > max_runs_shown)
            fmt::print("  ... {} more tensors fall back (--json lists every one)\n",
                       alone.size() - max_runs_shown);
    }
    const wm::PlanTotals& t = plan.totals;
    fmt::print("\ntotals: device {} MiB, imported {} MiB, pinned {} MiB, fallback {} MiB, "
               "imports {}\n", mib(t.device_bytes), mib(t.imported_bytes), mib(t.pinned_bytes),
               mib(t.fallback_bytes), t.imports);
}

int run(const Options& o) {
    auto rules = o.plan.rules();
    if (!rules) return fail(rules.error().message);

    auto info = wm::read_model(o.files);
    if (!info) return fail(info.error().message);

    // No importer is created: the device target's caps are what a typical importer declares
    // (needs a writable mapping, page alignment unless --align says otherwise) on the kind of
    // device this library is for, unified memory, unless --device says otherwise.
    const auto cpu = wm::make_cpu_importer();
    wm::TargetFactory factory = [&](std::string_view name) -> wm::Result<wm::TargetDesc> {
        if (name == wm::cpu_target_name) return wm::target_for(std::string(name), *cpu);
        wm::TargetDesc target;
        target.name = std::string(name);
        target.importer_key = std::string(name);
        target.caps.needs_writable_mapping = true;
        target.caps.device_memory = wm::DeviceMemory::unified;
        target.device_memory_note = "assumed; --device to change";
        return o.plan.adjust(std::move(target));
    };
    auto desc = wm::to_model_desc(*info, *rules, factory);
    if (!desc) return fail(desc.error().message);

    auto plan = wm::make_plan(*desc, o.plan.plan_options());
    if (!plan) return fail(plan.error().message);

    if (o.json)
        wm::tools::print_json(to_json(*info, *desc, *plan));
    else
        print_table(*info, *rules, *desc, *plan);
    return wm::tools::flush_stdout("wm-plan");
}

} // namespace

int main(int argc, char** argv) {
    Options o;
    CLI::App app{"wm-plan: what libweightmap would import from a model, read from its headers "
                 "only (no tensor data is read). -ot is accepted for --override.",
                 "wm-plan"};
    app.add_option("FILE", o.files,
                   "GGUF file(s) (the first shard of a split finds the rest), safetensors "
                   "file(s), or a model.safetensors.index.json")
        ->required();
    o.plan.add_options(app);
    app.add_flag("--json", o.json, "print one JSON object instead of the table");
    return wm::tools::run_cli(app, argc, argv, "wm-plan", [&] { return run(o); });
}
