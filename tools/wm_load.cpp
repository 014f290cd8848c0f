// SPDX-License-Identifier: MIT
// wm-load: the demo loader. Maps a model with the mapping policy, plans, imports through one
// importer, copies what falls back (as an engine would), verifies every device tensor's bytes as
// the device sees them against the file, and reports time, bytes and memory. `--copy` is the
// control arm: the same device tensors copied into buffers the importer's device allocates.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan_cli.hpp"
#include "weightmap/backends/cuda.hpp"
#include "weightmap/formats.hpp"
#include "weightmap/loader.hpp"
#include "weightmap/memstat.hpp"
#include "weightmap/placement_rules.hpp"
#include "weightmap/registry.hpp"

namespace {

constexpr std::uint64_t verify_chunk = 1 << 20;

// Progress on stderr, only when it is a terminal (scripts and CI logs stay clean).
class Progress {
public:
    Progress(const char* what, std::uint64_t total)
        : what_(what), total_(total), enabled_(isatty(STDERR_FILENO) != 0 && total > 0) {}
    void update(std::uint64_t done) {
        if (!enabled_) return;
        int percent = static_cast<int>(done * 100 / total_);
        if (percent == last_) return;
        last_ = percent;
        int filled = percent * 30 / 100;
        fmt::print(stderr, "\r{:<9} [{:<30}] {:3}% {:8.1f} MiB", what_, std::string(filled, '#'),
                   percent, static_cast<double>(done) / (1 << 20));
        std::fflush(stderr);
    }
    ~Progress() {
        if (enabled_ && last_ >= 0) fmt::print(stderr, "\n");
    }

private:
    const char* what_;
    std::uint64_t total_;
    bool enabled_;
    int last_ = -1;
};

struct FileReader {
    std::vector<int> fds;
    explicit FileReader(const wm::ModelDesc& model) {
        for (const auto& f : model.files) fds.push_back(open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
    }
    ~FileReader() {
        for (int fd : fds)
            if (fd >= 0) close(fd);
    }
    bool read(std::uint32_t file, std::uint64_t offset, std::uint64_t size, unsigned char* out) {
        while (size > 0) {
            ssize_t n = pread(fds[file], out, size, static_cast<off_t>(offset));
            if (n <= 0) return false;
            out += n;
            offset += static_cast<std::uint64_t>(n);
            size -= static_cast<std::uint64_t>(n);
        }
        return true;
    }
};

struct Counts {
    std::uint64_t imported_bytes = 0, fallback_bytes = 0, copied_bytes = 0;
    bool copies_staged = false; // read from the file into anonymous staging (CopySource)
    bool copies_unsupported = false; // the importer makes no device copies (HSA): the engine would
    std::optional<wm::CudaImporterState> cuda; // after the load, for the CUDA importer
    std::uint64_t tensors_verified = 0, tensors_mismatched = 0;
    std::vector<std::string> mismatches;
};

nlohmann::json optional_json(const std::optional<std::uint64_t>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
nlohmann::json optional_json(const std::optional<std::int64_t>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
std::string human(const std::optional<std::int64_t>& v) {
    return v ? fmt::format("{:+.1f} MiB", static_cast<double>(*v) / (1 << 20)) : "unknown";
}
std::string human(const std::optional<std::uint64_t>& v) {
    return v ? fmt::format("{:.1f} MiB", static_cast<double>(*v) / (1 << 20)) : "unknown";
}

int fail(const std::string& message) {
    fmt::print(stderr, "wm-load: {}\n", message);
    return 1;
}

struct Args {
    std::string importer_name = "auto";
    bool copy_arm = false, json = false, no_populate = false;
    wm::tools::PlanCli plan_cli;
    std::vector<std::string> paths;
};

// Every name wm::create_importer accepts: "auto", then the registry's in its order.
std::vector<std::string> importer_choices() {
    std::vector<std::string> names = {"auto"};
    for (const wm::ImporterEntry& entry : wm::importer_registry()) names.emplace_back(entry.name);
    return names;
}

// Parses the command line into `args`. Returns the exit status when wm-load stops here
// (--help, or a parse error).
std::optional<int> parse_args(int argc, char** argv, Args& args) {
    CLI::App app{"wm-load: load a model through libweightmap, verify it, report its memory", "wm-load"};
    const std::vector<std::string> importers = importer_choices();
    app.add_option("--importer", args.importer_name,
                   fmt::format("{} (auto: first available)", fmt::join(importers, "|")))
        ->check(CLI::IsMember(importers));
    app.add_flag("--copy", args.copy_arm, "control arm: copy device tensors instead of importing");
    app.add_flag("--json", args.json, "print one JSON object");
    app.add_flag("--no-populate", args.no_populate,
                 "do not read the import extents in ahead of the import (the A/B of a cold load)");
    args.plan_cli.add_options(app);
    app.add_option("FILE", args.paths, "model file(s): GGUF (first shard) or safetensors")->required();
    try {
        wm::tools::parse_with_llama_spelling(app, argc, argv);
    } catch (const CLI::Success& e) {
        return app.exit(e); // --help
    } catch (const CLI::ParseError& e) {
        return fail(fmt::format("{} (see --help)", e.what()));
    }
    return std::nullopt;
}

// The model as the planner sees it: the CPU target served by `cpu`, every other by `importer`.
wm::Result<wm::ModelDesc> describe_model(const wm::ModelInfo& info, const wm::PlacementRules& rules,
                                         wm::Importer& importer, wm::Importer& cpu,
                                         const wm::tools::PlanCli& plan_cli) {
    return wm::to_model_desc(info, rules, [&](std::string_view name)
                                              -> wm::Result<wm::TargetDesc> {
        if (name == wm::cpu_target_name) return wm::target_for(std::string(name), cpu);
        wm::TargetDesc target = wm::target_for(std::string(name), importer);
        // `--importer cpu` stands in for a unified-memory device: its tensors are planned as a
        // device's (gate, runs, pinned bytes) and served by passthrough.
        target.caps.is_cpu = false;
        return plan_cli.adjust(std::move(target));
    });
}

wm::LoadOptions load_options(const Args& args) {
    wm::LoadOptions options;
    options.plan = args.plan_cli.plan_options();
    if (args.copy_arm) options.plan.import_enabled = false;
    options.populate = !args.no_populate;
    options.execute.log = [](wm::LogLevel level, std::string_view message) {
        if (level >= wm::LogLevel::warning) fmt::print(stderr, "wm-load: {}\n", message);
    };
    return options;
}

// What the import will pin, for its progress bar (the import is where a large model spends its
// time); 0 when the plan fails, which load_model() then reports.
std::uint64_t planned_import_bytes(const wm::ModelDesc& desc, const wm::PlanOptions& options) {
    auto plan_preview = wm::make_plan(desc, options);
    return plan_preview ? plan_preview->totals.pinned_bytes : 0;
}

// Device copies of the tensors that fall back, as an engine makes them; freed on destruction.
struct DeviceCopies {
    wm::Importer& importer;
    std::vector<std::pair<std::uint32_t, wm::ImportedBuffer>> buffers; // (tensor, its copy)
    explicit DeviceCopies(wm::Importer& device) : importer(device) {}
    DeviceCopies(const DeviceCopies&) = delete;
    DeviceCopies& operator=(const DeviceCopies&) = delete;
    ~DeviceCopies() {
        for (auto& [tensor, buffer] : buffers) (void)importer.free_copy(buffer);
    }
};

bool on_device(const wm::ModelDesc& model, const wm::TensorDesc& t) {
    return !model.targets[t.target].caps.is_cpu;
}

// Where a fallback tensor's copy reads from. On a CUDA device that reads pageable memory itself
// (GH200, GB10, GB300) a copy out of file-backed mapped pages is reported pathologically slow
// (NVIDIA/cosmos-framework#150: 1,184 s -> 67 s once tensors were read into anonymous memory
// first), so there each tensor is read from the file with one large pread into anonymous
// staging; elsewhere the copy reads the mapping, as an engine does.
class CopySource {
public:
    CopySource(const wm::ModelDesc& model, const wm::Importer& importer) {
        if (auto state = wm::cuda_importer_state(importer); state && state->pageable_access)
            files_.emplace(model);
    }
    bool stages() const { return files_.has_value(); }
    // The tensor's bytes for one copy, or null when the read failed.
    const void* bytes(const wm::TensorDesc& t, const wm::TensorLocation& where) {
        if (!files_) return where.host_address;
        if (staging_.size() < t.size) staging_.resize(t.size);
        return files_->read(t.file, t.offset, t.size, staging_.data()) ? staging_.data() : nullptr;
    }

private:
    std::optional<FileReader> files_; // set when copies are staged from the file
    std::vector<unsigned char> staging_;
};

// Copies every device tensor that was not imported into a device buffer, one tensor at a time as
// an engine's loader does (not the library's parallel-pread copy_fallback_tensors); counts
// imported, fallback and copied bytes. On a failed copy, reports it and returns false.
bool copy_fallbacks_to_device(const wm::LoadedModel& loaded, DeviceCopies& copies, Counts& counts) {
    const wm::ModelDesc& model = loaded.model();
    std::uint64_t to_copy = 0;
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i)
        if (on_device(model, model.tensors[i]) && !loaded.locate(i).imported)
            to_copy += model.tensors[i].size;
    Progress copy_progress("copying", to_copy);
    CopySource source(model, copies.importer);
    counts.copies_staged = source.stages();
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
        const wm::TensorDesc& t = model.tensors[i];
        if (!on_device(model, t)) continue;
        wm::TensorLocation where = loaded.locate(i);
        if (where.imported) {
            counts.imported_bytes += t.size;
            continue;
        }
        counts.fallback_bytes += t.size;
        if (t.size == 0) continue;
        const void* bytes = source.bytes(t, where);
        if (bytes == nullptr) {
            fail(fmt::format("pread of tensor '{}' for its copy failed", t.name));
            return false;
        }
        auto copy = copies.importer.allocate_copy(bytes, t.size);
        if (!copy && copy.error().kind == wm::ErrorKind::unsupported) {
            // HSA's regions that fall back (a runtime refusing read-only locks) are the engine's
            // to copy; this demo cannot, so it reports them as fallback bytes, not copied
            counts.copies_unsupported = true;
            continue;
        }
        if (!copy) {
            fail(fmt::format("copy of tensor '{}' failed: {}", t.name, copy.error().message));
            return false;
        }
        copies.buffers.emplace_back(i, copy.value());
        counts.copied_bytes += t.size;
        copy_progress.update(counts.copied_bytes);
    }
    return true;
}

// Reads device tensors back and compares them with the file, chunk by chunk, with progress.
class Verifier {
public:
    Verifier(const wm::ModelDesc& model, wm::Importer& importer, std::uint64_t total_bytes)
        : files_(model), importer_(importer), progress_("verifying", total_bytes) {}

    // Why tensor `t`, at `base` in `buffer`, differs from its bytes in the file; nothing when it
    // does not.
    std::optional<std::string> compare(const wm::TensorDesc& t, const wm::ImportedBuffer& buffer,
                                       std::uint64_t base) {
        std::optional<std::string> why;
        for (std::uint64_t done = 0; done < t.size && !why; done += verify_chunk) {
            std::uint64_t n = std::min(verify_chunk, t.size - done);
            if (!files_.read(t.file, t.offset + done, n, expected_.data()))
                return "pread of the file failed";
            if (wm::Status s = importer_.read_back(buffer, base + done, n, seen_.data()); !s)
                return s.error().message;
            if (std::memcmp(expected_.data(), seen_.data(), n) != 0)
                why = fmt::format("bytes differ in [{}, +{})", done, n);
            verified_bytes_ += n;
            progress_.update(verified_bytes_);
        }
        return why;
    }

private:
    FileReader files_;
    wm::Importer& importer_;
    std::vector<unsigned char> expected_ = std::vector<unsigned char>(verify_chunk);
    std::vector<unsigned char> seen_ = std::vector<unsigned char>(verify_chunk);
    Progress progress_;
    std::uint64_t verified_bytes_ = 0;
};

// Verifies every device tensor as the device sees it (its import, or its copy) against the file.
void verify_device_tensors(const wm::LoadedModel& loaded, const DeviceCopies& copies,
                           Counts& counts) {
    const wm::ModelDesc& model = loaded.model();
    std::vector<std::int64_t> copy_of(model.tensors.size(), -1);
    for (std::size_t k = 0; k < copies.buffers.size(); ++k)
        copy_of[copies.buffers[k].first] = static_cast<std::int64_t>(k);
    Verifier verifier(model, copies.importer, counts.imported_bytes + counts.copied_bytes);
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
        const wm::TensorDesc& t = model.tensors[i];
        if (!on_device(model, t) || t.size == 0) continue;
        wm::TensorLocation where = loaded.locate(i);
        if (!where.imported && copy_of[i] < 0) continue; // no copy made (copies_unsupported)
        const wm::ImportedBuffer* buffer =
            where.imported ? where.buffer
                           : &copies.buffers[static_cast<std::size_t>(copy_of[i])].second;
        const std::uint64_t base = where.imported ? where.offset_in_buffer : 0;
        if (std::optional<std::string> why = verifier.compare(t, *buffer, base)) {
            ++counts.tensors_mismatched;
            if (counts.mismatches.size() < 10)
                counts.mismatches.push_back(fmt::format("{}: {}", t.name, *why));
        } else {
            ++counts.tensors_verified;
        }
    }
}

// What the load cost: its time, and memory at the sampler's first sample, at its peak and after.
struct LoadCost {
    double seconds = 0;
    wm::MemStat before, peak, after;
};

// What wm-load reports, in either output form.
struct Report {
    const Args& args;
    const wm::Importer& importer;
    const wm::LoadedModel& loaded;
    const Counts& counts;
    const LoadCost& cost;
    const wm::PlanTotals& totals() const { return loaded.placement().plan().totals; }
    const char* arm() const { return args.copy_arm ? "copy" : "import"; }
};

void print_json(const Report& r) {
    const wm::MemStat &before = r.cost.before, &peak = r.cost.peak, &after = r.cost.after;
    nlohmann::json out;
    const wm::ImporterCaps caps = r.importer.caps();
    out["importer"] = std::string(r.importer.name());
    out["device_memory"] = wm::to_string(caps.device_memory);
    out["device_memory_note"] = std::string(r.importer.notes().device_memory);
    out["import_policy"] = wm::to_string(r.loaded.placement().plan().import_policy);
    out["arm"] = r.arm();
    out["mapping"] = wm::to_string(r.loaded.mapping_decision().access);
    out["read_only_after_load"] = r.loaded.read_only();
    out["device_bytes"] = r.totals().device_bytes;
    out["imported_bytes"] = r.counts.imported_bytes;
    out["pinned_bytes"] = r.totals().pinned_bytes;
    out["imports"] = r.totals().imports;
    out["fallback_bytes"] = r.counts.fallback_bytes;
    out["copied_bytes"] = r.counts.copied_bytes;
    out["tensors_verified"] = r.counts.tensors_verified;
    out["tensors_mismatched"] = r.counts.tensors_mismatched;
    out["load_seconds"] = r.cost.seconds;
    out["populate_seconds"] = r.loaded.populate_report().seconds;
    out["rss_anon_delta"] = optional_json(wm::delta(before.rss_anon, after.rss_anon));
    out["rss_file_delta"] = optional_json(wm::delta(before.rss_file, after.rss_file));
    out["vm_lck_delta"] = optional_json(wm::delta(before.vm_lck, after.vm_lck));
    out["vm_pin_delta"] = optional_json(wm::delta(before.vm_pin, after.vm_pin));
    out["rss_anon_peak"] = optional_json(peak.rss_anon);
    out["rss_file_peak"] = optional_json(peak.rss_file);
    out["vm_lck_peak"] = optional_json(peak.vm_lck);
    out["vm_pin_peak"] = optional_json(peak.vm_pin);
    nlohmann::json drm = nlohmann::json::object();
    for (const auto& [region, mem] : peak.drm)
        drm[region] = {{"total_peak", optional_json(mem.total)},
                       {"resident_peak", optional_json(mem.resident)}};
    out["drm_peak"] = drm;
    out["mismatches"] = r.counts.mismatches;
    out["copies_unsupported"] = r.counts.copies_unsupported;
    if (r.counts.cuda) {
        out["cuda_method"] = wm::to_string(r.counts.cuda->method);
        out["registrations"] = r.counts.cuda->registrations;
        out["copies_staged"] = r.counts.copies_staged;
    }
    fmt::print("{}\n", out.dump());
}

void print_text(const Report& r) {
    const wm::MemStat &before = r.cost.before, &peak = r.cost.peak, &after = r.cost.after;
    const wm::PlanTotals& totals = r.totals();
    const Counts& counts = r.counts;
    const wm::ImporterCaps caps = r.importer.caps();
    fmt::print("importer        {} ({} arm), mapping {}{}\n", r.importer.name(), r.arm(),
               wm::to_string(r.loaded.mapping_decision().access),
               r.loaded.read_only() ? ", PROT_READ after load" : "");
    fmt::print("device memory   {} ({}), import policy {}\n", wm::to_string(caps.device_memory),
               r.importer.notes().device_memory,
               wm::to_string(r.loaded.placement().plan().import_policy));
    fmt::print("device bytes    {:.1f} MiB: imported {:.1f} MiB in {} imports (pinned {:.1f} "
               "MiB), fallback {:.1f} MiB, copied {:.1f} MiB\n",
               totals.device_bytes / 1048576.0, counts.imported_bytes / 1048576.0,
               totals.imports, totals.pinned_bytes / 1048576.0,
               counts.fallback_bytes / 1048576.0, counts.copied_bytes / 1048576.0);
    if (counts.cuda)
        fmt::print("cuda method     {}, {} registrations, {} direct imports{} ({})\n",
                   wm::to_string(counts.cuda->method), counts.cuda->registrations,
                   counts.cuda->direct_imports,
                   counts.copies_staged ? ", copies staged from the file" : "",
                   counts.cuda->method_note);
    if (counts.copies_unsupported)
        fmt::print("copies          {} makes no device copies: the fallback bytes are the "
                   "engine's to copy (not verified here)\n", r.importer.name());
    fmt::print("verified        {} tensors, {} mismatched\n", counts.tensors_verified,
               counts.tensors_mismatched);
    fmt::print("load            {:.3f} s (populate {:.3f} s, {:.1f} MiB{})\n", r.cost.seconds,
               r.loaded.populate_report().seconds, r.loaded.populate_report().bytes / 1048576.0,
               r.loaded.populate_report().method.empty()
                   ? ""
                   : ", " + r.loaded.populate_report().method);
    fmt::print("RssAnon         delta {}, peak {}\n",
               human(wm::delta(before.rss_anon, after.rss_anon)), human(peak.rss_anon));
    fmt::print("RssFile         delta {}, peak {}\n",
               human(wm::delta(before.rss_file, after.rss_file)), human(peak.rss_file));
    fmt::print("VmLck / VmPin   delta {} / {}\n", human(wm::delta(before.vm_lck, after.vm_lck)),
               human(wm::delta(before.vm_pin, after.vm_pin)));
    for (const auto& [region, mem] : peak.drm)
        fmt::print("DRM {:<11} total peak {}, resident peak {}\n", region, human(mem.total),
                   human(mem.resident));
    for (const std::string& m : counts.mismatches) fmt::print("MISMATCH        {}\n", m);
}

// The registry's importer; for `--importer cuda --import-policy always`, a CUDA importer that
// also imports on a discrete card (allow_discrete): the user asked to import anyway.
wm::Result<std::unique_ptr<wm::Importer>> make_device_importer(const Args& args) {
    if (args.importer_name != "cuda" ||
        args.plan_cli.plan_options().import_policy != wm::ImportPolicy::always)
        return wm::create_importer(args.importer_name);
    wm::CudaImporterParams params;
    params.allow_discrete = true;
    auto cuda = wm::make_cuda_importer(params);
    if (cuda && !cuda.value()->available().available)
        return wm::make_error(wm::ErrorKind::unsupported,
                              "cuda importer not available: " +
                                  cuda.value()->available().reason);
    return cuda;
}

} // namespace

int main(int argc, char** argv) {
    Args args;
    if (std::optional<int> stop = parse_args(argc, argv, args)) return *stop;
    auto rules = args.plan_cli.rules();
    if (!rules) return fail(rules.error().message);
    auto info = wm::read_model(args.paths);
    if (!info) return fail(info.error().message);
    auto device = make_device_importer(args);
    if (!device) return fail(device.error().message);
    wm::Importer& importer = *device.value();
    auto cpu = wm::make_cpu_importer();
    auto desc = describe_model(info.value(), rules.value(), importer, *cpu, args.plan_cli);
    if (!desc) return fail(desc.error().message);
    std::vector<wm::Importer*> importers;
    for (const wm::TargetDesc& t : desc->targets)
        importers.push_back(t.caps.is_cpu ? cpu.get() : &importer);
    wm::LoadOptions options = load_options(args);

    // --- load: map, plan, import, then copy what the device still needs ------------------------
    wm::MemSampler sampler;
    sampler.start();
    const auto t0 = std::chrono::steady_clock::now();
    // Here, not in a helper: the import's progress callback below refers to it.
    const std::uint64_t planned = planned_import_bytes(desc.value(), options.plan);
    Progress populate_progress("reading", options.populate ? planned : 0);
    options.populate_options.progress = [&](std::uint64_t done, std::uint64_t) {
        populate_progress.update(done);
        return true;
    };
    Progress import_progress("importing", planned);
    options.execute.progress = [&](std::uint64_t done, std::uint64_t) {
        import_progress.update(done);
        return true;
    };
    auto loaded = wm::load_model(desc.value(), importers, options);
    if (!loaded) return fail(loaded.error().message);
    Counts counts;
    DeviceCopies copies(importer);
    if (!copy_fallbacks_to_device(loaded.value(), copies, counts)) return 1;
    if (auto cuda = wm::cuda_importer_state(importer)) counts.cuda = std::move(cuda).value();
    LoadCost cost;
    cost.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cost.peak = sampler.stop();
    cost.before = sampler.first();
    cost.after = wm::read_memstat();

    // --- verify: every device tensor as the device sees it, against the file -----------------
    verify_device_tensors(loaded.value(), copies, counts);
    const Report report{args, importer, loaded.value(), counts, cost};
    if (args.json) print_json(report);
    else print_text(report);
    return counts.tensors_mismatched == 0 ? 0 : 2;
}
