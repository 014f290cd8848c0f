// SPDX-License-Identifier: MIT
// wm-doctor [options] FILE... - before a load: per device, whether this model on this machine
// will be read in place, how, how much, and why not (with what to change).
//
// doctor.cpp makes the findings with the calls a load makes; this prints them as a table, or with
// --json as one JSON object. Bad input: one line on stderr and exit status 1.
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "doctor.hpp"
#include "cli_main.hpp"
#include "plan_cli.hpp"

namespace {

namespace doc = wm::doctor;

int fail(const std::string& message) { return wm::tools::fail_line("wm-doctor", message); }

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

nlohmann::ordered_json group_json(const doc::TensorGroup& g) {
    return {{"group", g.name},       {"tensors", g.tensors},     {"bytes", g.bytes},
            {"on_cpu", g.on_cpu},    {"copied", g.fallbacks},    {"copied_reason", g.fallback_reason},
            {"padded_rows", g.padded_rows}};
}

nlohmann::ordered_json device_json(const doc::Device& d) {
    nlohmann::ordered_json groups = nlohmann::ordered_json::array();
    for (const doc::TensorGroup& g : d.groups) groups.push_back(group_json(g));
    return {{"backend", d.backend},         {"usable", d.usable},
            {"unusable_reason", d.unusable_reason}, {"method", d.method},
            {"device_class", d.device_class}, {"device_note", d.device_note},
            {"policy_imports", d.policy_imports}, {"policy_reason", d.policy_reason},
            {"mapping", d.mapping},         {"mapping_reason", d.mapping_reason},
            {"probe_ran", d.probe_ran},     {"probe_ok", d.probe_ok},
            {"probe_reason", d.probe_reason}, {"device_bytes", d.device_bytes},
            {"import_bytes", d.import_bytes}, {"copy_bytes", d.copy_bytes},
            {"cpu_bytes", d.cpu_bytes},     {"pinned_bytes", d.pinned_bytes},
            {"imports", d.imports},         {"tensor_alignment", d.tensor_alignment},
            {"saves_bytes", d.saves_bytes}, {"verdict", d.verdict},
            {"advice", d.advice},           {"groups", std::move(groups)}};
}

nlohmann::ordered_json to_json(const doc::Diagnosis& r, doc::Engine engine) {
    using json = nlohmann::ordered_json;
    json files = json::array();
    for (const wm::ModelFile& f : r.model.files)
        files.push_back({{"path", f.path}, {"size", f.size}, {"format", wm::to_string(f.format)},
                         {"alignment", f.alignment}, {"tensors", f.tensor_count}});
    json devices = json::array();
    for (const doc::Device& d : r.devices) devices.push_back(device_json(d));
    return {{"engine", doc::to_string(engine)},
            {"model", {{"architecture", r.model.architecture}, {"files", std::move(files)}}},
            {"file", {{"path", r.file.path}, {"filesystem", r.file.filesystem},
                      {"mount_point", r.file.mount_point}, {"dax", r.file.dax},
                      {"lease", r.file.lease}, {"lease_reason", r.file.lease_reason},
                      {"lease_advice", r.file.lease_advice}}},
            {"devices", std::move(devices)}};
}

void print_header(const doc::Diagnosis& r, doc::Engine engine) {
    std::uint64_t total = 0;
    for (const wm::TensorInfo& t : r.model.tensors) total += t.size;
    const wm::ModelFile& f = r.model.files[0];
    fmt::print("wm-doctor: {} ({}{}, {} file(s), {} tensors, {:.1f} MiB)\n", f.path,
               wm::to_string(f.format),
               r.model.architecture.empty() ? "" : ", " + r.model.architecture,
               r.model.files.size(), r.model.tensors.size(), mib(total));
    fmt::print("  file system {}{}{}\n", r.file.filesystem,
               r.file.mount_point.empty() ? "" : " on " + r.file.mount_point,
               r.file.dax ? " (dax)" : "");
    fmt::print("  read lease: {}{}\n", r.file.lease ? "yes" : "no",
               r.file.lease_reason.empty() ? "" : " (" + r.file.lease_reason + ")");
    if (!r.file.lease_advice.empty()) fmt::print("  - {}\n", r.file.lease_advice);
    fmt::print("  engine: {}\n\n", engine == doc::Engine::llama_cpp
                                       ? "llama.cpp with LLAMA_WEIGHTMAP (token_embd.weight stays on the CPU)"
                                       : "libweightmap's load_model (wm-load)");
}

void print_summary(const doc::Diagnosis& r) {
    fmt::print("{:<8} {:<15} {:<9} {:<6} {:<9} {:<5} {:>11} {:>10} {:>9} {:>10}\n", "device",
               "method", "class", "policy", "mapping", "probe", "import MiB", "copy MiB",
               "cpu MiB", "saves MiB");
    for (const doc::Device& d : r.devices)
        fmt::print("{:<8} {:<15} {:<9} {:<6} {:<9} {:<5} {:>11.1f} {:>10.1f} {:>9.1f} {:>10.1f}\n",
                   d.backend, d.method, d.usable ? d.device_class : "-",
                   d.usable ? (d.policy_imports ? "yes" : "no") : "-",
                   d.usable ? d.mapping : "-",
                   !d.probe_ran ? "-" : d.probe_ok ? "ok" : "no", mib(d.import_bytes),
                   mib(d.copy_bytes), mib(d.cpu_bytes), mib(d.saves_bytes));
}

// Every group with --groups; otherwise those with a tensor copied or padded.
void print_groups(const doc::Device& d, bool all) {
    std::size_t shown = 0;
    for (const doc::TensorGroup& g : d.groups) shown += all || g.fallbacks > 0 || g.padded_rows > 0;
    fmt::print("  tensor groups: {}, tensor alignment {}{}\n", d.groups.size(), d.tensor_alignment,
               shown == 0 ? ": no device tensor copied or padded (--groups lists them)" : "");
    if (shown == 0) return;
    fmt::print("    {:<32} {:>7} {:>10} {:>6} {:>6} {:>6}  {}\n", "group", "tensors", "MiB", "cpu",
               "copied", "padded", "why copied");
    for (const doc::TensorGroup& g : d.groups)
        if (all || g.fallbacks > 0 || g.padded_rows > 0)
            fmt::print("    {:<32} {:>7} {:>10.1f} {:>6} {:>6} {:>6}  {}\n", g.name, g.tensors,
                   mib(g.bytes), g.on_cpu, g.fallbacks, g.padded_rows, g.fallback_reason);
}

void print_device(const doc::Device& d, bool all_groups) {
    fmt::print("\n{}: {}\n", d.backend, d.verdict);
    if (d.usable) {
        fmt::print("  device: {} memory ({}), method {}\n", d.device_class, d.device_note, d.method);
        fmt::print("  policy: {}\n", d.policy_reason);
        fmt::print("  mapping: {}\n", d.mapping_reason);
        if (d.probe_ran) fmt::print("  probe: {}: {}\n", d.probe_ok ? "ok" : "refused", d.probe_reason);
        print_groups(d, all_groups);
        fmt::print("  saves {:.1f} MiB of device memory against upstream llama.cpp, which copies "
                   "every offloaded weight\n", mib(d.saves_bytes));
    }
    for (const std::string& a : d.advice) fmt::print("  - {}\n", a);
}

struct Args {
    std::vector<std::string> files;
    std::vector<std::string> backends;
    std::vector<std::string> overrides;
    bool cpu_moe = false;
    std::string engine = "llama.cpp";
    std::string policy = "unified_only";
    std::string tensor_alignment;
    bool json = false;
    bool groups = false;
};

wm::Result<doc::Options> options_from(const Args& a) {
    doc::Options o;
    o.files = a.files;
    for (const std::string& b : a.backends) o.backends.push_back(b == "hip" ? "hsa" : b);
    o.engine = a.engine == "library" ? doc::Engine::library : doc::Engine::llama_cpp;
    for (const std::string& spec : a.overrides)
        if (wm::Status s = o.rules.add_override(spec); !s) return std::move(s).error();
    if (a.cpu_moe) o.rules.add_cpu_moe();
    o.plan.import_policy = a.policy == "always"  ? wm::ImportPolicy::always
                           : a.policy == "never" ? wm::ImportPolicy::never
                                                 : wm::ImportPolicy::unified_only;
    if (!a.tensor_alignment.empty()) o.tensor_alignment = std::stoull(a.tensor_alignment);
    return o;
}

void add_options(CLI::App& app, Args& a) {
    app.add_option("FILE", a.files, "GGUF file(s) (the first shard finds the rest) or safetensors")
        ->required();
    app.add_option("--backend", a.backends,
                   "vulkan|cuda|hip|hsa (repeatable; default: every importer of this build)");
    app.add_option("--engine", a.engine, "llama.cpp (default) or library: whose load to predict")
        ->check(CLI::IsMember({"llama.cpp", "library"}));
    app.add_option("--ot,--override", a.overrides, "REGEX=TARGET as llama.cpp's -ot (repeatable)")
        ->take_all()
        ->allow_extra_args(false);
    app.add_flag("--cpu-moe", a.cpu_moe, "every expert tensor on the CPU (llama.cpp --cpu-moe)");
    app.add_option("--import-policy", a.policy, "unified_only (default)|always|never")
        ->check(CLI::IsMember({"unified_only", "always", "never"}));
    app.add_option("--tensor-alignment", a.tensor_alignment,
                   "the alignment each device tensor's offset must meet (default: the engine's)")
        ->check(wm::tools::power_of_two_check);
    app.add_flag("--json", a.json, "print one JSON object instead of the table");
    app.add_flag("--groups", a.groups, "list every tensor group, not only those with a tensor copied or padded");
}

int run(const Args& a) {
    auto options = options_from(a);
    if (!options) return fail(options.error().message);
    auto r = doc::diagnose(*options);
    if (!r) return fail(r.error().message);
    if (a.json) {
        wm::tools::print_json(to_json(*r, options->engine));
    } else {
        print_header(*r, options->engine);
        print_summary(*r);
        for (const doc::Device& d : r->devices) print_device(d, a.groups);
    }
    return wm::tools::flush_stdout("wm-doctor");
}

} // namespace

int main(int argc, char** argv) {
    Args a;
    CLI::App app{"wm-doctor: before a load, per device: will this model be read in place on this "
                 "machine, how much, and why not. -ot is accepted for --override.",
                 "wm-doctor"};
    add_options(app, a);
    return wm::tools::run_cli(app, argc, argv, "wm-doctor", [&] { return run(a); });
}
