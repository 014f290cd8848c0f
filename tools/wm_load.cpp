// SPDX-License-Identifier: MIT
// wm-load: the demo loader. Maps a model with the mapping policy, plans, imports through one
// importer, copies what falls back (as an engine would), verifies every device tensor's bytes as
// the device sees them against the file, and reports time, bytes and memory. `--copy` is the
// control arm: the same device tensors copied into buffers the importer's device allocates.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan_cli.hpp"
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

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"wm-load: load a model through libweightmap, verify it, report its memory", "wm-load"};
    std::string importer_name = "auto";
    bool copy_arm = false, json = false;
    wm::tools::PlanCli plan_cli;
    std::vector<std::string> paths;
    app.add_option("--importer", importer_name, "auto|cpu|vulkan|hsa (auto: first available)")
        ->check(CLI::IsMember({"auto", "cpu", "vulkan", "hsa"}));
    app.add_flag("--copy", copy_arm, "control arm: copy device tensors instead of importing");
    app.add_flag("--json", json, "print one JSON object");
    plan_cli.add_options(app);
    app.add_option("FILE", paths, "model file(s): GGUF (first shard) or safetensors")->required();
    auto fail = [](const std::string& message) {
        fmt::print(stderr, "wm-load: {}\n", message);
        return 1;
    };
    try {
        wm::tools::parse_with_llama_spelling(app, argc, argv);
    } catch (const CLI::Success& e) {
        return app.exit(e); // --help
    } catch (const CLI::ParseError& e) {
        return fail(fmt::format("{} (see --help)", e.what()));
    }

    auto rules = plan_cli.rules();
    if (!rules) return fail(rules.error().message);
    auto info = wm::read_model(paths);
    if (!info) return fail(info.error().message);
    auto device = wm::create_importer(importer_name);
    if (!device) return fail(device.error().message);
    wm::Importer& importer = *device.value();
    auto cpu = wm::make_cpu_importer();

    auto desc = wm::to_model_desc(info.value(), rules.value(), [&](std::string_view name)
                                                                  -> wm::Result<wm::TargetDesc> {
        if (name == wm::cpu_target_name) return wm::target_for(std::string(name), *cpu);
        wm::TargetDesc target = wm::target_for(std::string(name), importer);
        // `--importer cpu` stands in for a unified-memory device: its tensors are planned as a
        // device's (gate, runs, pinned bytes) and served by passthrough.
        target.caps.is_cpu = false;
        return plan_cli.adjust(std::move(target));
    });
    if (!desc) return fail(desc.error().message);
    std::vector<wm::Importer*> importers;
    for (const wm::TargetDesc& t : desc->targets)
        importers.push_back(t.caps.is_cpu ? cpu.get() : &importer);

    wm::LoadOptions options;
    options.plan = plan_cli.plan_options();
    if (copy_arm) options.plan.import_enabled = false;
    options.execute.log = [](wm::LogLevel level, std::string_view message) {
        if (level >= wm::LogLevel::warning) fmt::print(stderr, "wm-load: {}\n", message);
    };

    // --- load: map, plan, import, then copy what the device still needs ------------------------
    wm::MemSampler sampler;
    sampler.start();
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t planned_import_bytes = 0;
    {
        // Progress of the import, which is where a large model spends its time.
        auto plan_preview = wm::make_plan(desc.value(), options.plan);
        if (plan_preview) planned_import_bytes = plan_preview->totals.pinned_bytes;
    }
    Progress import_progress("importing", planned_import_bytes);
    options.execute.progress = [&](std::uint64_t done, std::uint64_t) {
        import_progress.update(done);
        return true;
    };
    auto loaded = wm::load_model(desc.value(), importers, options);
    if (!loaded) return fail(loaded.error().message);

    Counts counts;
    std::vector<std::pair<std::uint32_t, wm::ImportedBuffer>> copies;
    struct CopyGuard {
        wm::Importer& importer;
        std::vector<std::pair<std::uint32_t, wm::ImportedBuffer>>& copies;
        ~CopyGuard() {
            for (auto& [tensor, buffer] : copies) (void)importer.free_copy(buffer);
        }
    } guard{importer, copies};
    const wm::ModelDesc& model = loaded->model();
    std::uint64_t to_copy = 0;
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i)
        if (!model.targets[model.tensors[i].target].caps.is_cpu && !loaded->locate(i).imported)
            to_copy += model.tensors[i].size;
    {
        Progress copy_progress("copying", to_copy);
        for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
            const wm::TensorDesc& t = model.tensors[i];
            if (model.targets[t.target].caps.is_cpu) continue;
            wm::TensorLocation where = loaded->locate(i);
            if (where.imported) {
                counts.imported_bytes += t.size;
                continue;
            }
            counts.fallback_bytes += t.size;
            if (t.size == 0) continue;
            auto copy = importer.allocate_copy(where.host_address, t.size);
            if (!copy) return fail(fmt::format("copy of tensor '{}' failed: {}", t.name,
                                               copy.error().message));
            copies.emplace_back(i, copy.value());
            counts.copied_bytes += t.size;
            copy_progress.update(counts.copied_bytes);
        }
    }
    const double load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    wm::MemStat peak = sampler.stop();
    wm::MemStat before = sampler.first();
    wm::MemStat after = wm::read_memstat();

    // --- verify: every device tensor as the device sees it, against the file -----------------
    FileReader files(model);
    std::vector<unsigned char> expected(verify_chunk), seen(verify_chunk);
    std::vector<std::int64_t> copy_of(model.tensors.size(), -1);
    for (std::size_t k = 0; k < copies.size(); ++k) copy_of[copies[k].first] = static_cast<std::int64_t>(k);
    {
        Progress verify_progress("verifying", counts.imported_bytes + counts.copied_bytes);
        std::uint64_t verified_bytes = 0;
        for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
            const wm::TensorDesc& t = model.tensors[i];
            if (model.targets[t.target].caps.is_cpu || t.size == 0) continue;
            wm::TensorLocation where = loaded->locate(i);
            const wm::ImportedBuffer* buffer = where.imported ? where.buffer
                                                               : &copies[static_cast<std::size_t>(copy_of[i])].second;
            std::uint64_t base = where.imported ? where.offset_in_buffer : 0;
            bool same = true;
            std::string why;
            for (std::uint64_t done = 0; done < t.size && same; done += verify_chunk) {
                std::uint64_t n = std::min(verify_chunk, t.size - done);
                if (!files.read(t.file, t.offset + done, n, expected.data())) {
                    why = "pread of the file failed";
                    same = false;
                    break;
                }
                if (wm::Status s = importer.read_back(*buffer, base + done, n, seen.data()); !s) {
                    why = s.error().message;
                    same = false;
                    break;
                }
                if (std::memcmp(expected.data(), seen.data(), n) != 0) {
                    why = fmt::format("bytes differ in [{}, +{})", done, n);
                    same = false;
                }
                verified_bytes += n;
                verify_progress.update(verified_bytes);
            }
            if (same) {
                ++counts.tensors_verified;
            } else {
                ++counts.tensors_mismatched;
                if (counts.mismatches.size() < 10)
                    counts.mismatches.push_back(fmt::format("{}: {}", t.name, why));
            }
        }
    }

    const wm::PlanTotals& totals = loaded->placement().plan().totals;
    auto anon_delta = wm::delta(before.rss_anon, after.rss_anon);
    auto file_delta = wm::delta(before.rss_file, after.rss_file);
    auto lck_delta = wm::delta(before.vm_lck, after.vm_lck);
    auto pin_delta = wm::delta(before.vm_pin, after.vm_pin);
    if (json) {
        nlohmann::json out;
        out["importer"] = std::string(importer.name());
        out["arm"] = copy_arm ? "copy" : "import";
        out["mapping"] = wm::to_string(loaded->mapping_decision().access);
        out["read_only_after_load"] = loaded->read_only();
        out["device_bytes"] = totals.device_bytes;
        out["imported_bytes"] = counts.imported_bytes;
        out["pinned_bytes"] = totals.pinned_bytes;
        out["imports"] = totals.imports;
        out["fallback_bytes"] = counts.fallback_bytes;
        out["copied_bytes"] = counts.copied_bytes;
        out["tensors_verified"] = counts.tensors_verified;
        out["tensors_mismatched"] = counts.tensors_mismatched;
        out["load_seconds"] = load_seconds;
        out["rss_anon_delta"] = optional_json(anon_delta);
        out["rss_file_delta"] = optional_json(file_delta);
        out["vm_lck_delta"] = optional_json(lck_delta);
        out["vm_pin_delta"] = optional_json(pin_delta);
        out["rss_anon_peak"] = optional_json(peak.rss_anon);
        out["rss_file_peak"] = optional_json(peak.rss_file);
        out["vm_lck_peak"] = optional_json(peak.vm_lck);
        out["vm_pin_peak"] = optional_json(peak.vm_pin);
        nlohmann::json drm = nlohmann::json::object();
        for (const auto& [region, mem] : peak.drm)
            drm[region] = {{"total_peak", optional_json(mem.total)},
                           {"resident_peak", optional_json(mem.resident)}};
        out["drm_peak"] = drm;
        out["mismatches"] = counts.mismatches;
        fmt::print("{}\n", out.dump());
    } else {
        fmt::print("importer        {} ({} arm), mapping {}{}\n", importer.name(),
                   copy_arm ? "copy" : "import", wm::to_string(loaded->mapping_decision().access),
                   loaded->read_only() ? ", PROT_READ after load" : "");
        fmt::print("device bytes    {:.1f} MiB: imported {:.1f} MiB in {} imports (pinned {:.1f} "
                   "MiB), fallback {:.1f} MiB, copied {:.1f} MiB\n",
                   totals.device_bytes / 1048576.0, counts.imported_bytes / 1048576.0,
                   totals.imports, totals.pinned_bytes / 1048576.0,
                   counts.fallback_bytes / 1048576.0, counts.copied_bytes / 1048576.0);
        fmt::print("verified        {} tensors, {} mismatched\n", counts.tensors_verified,
                   counts.tensors_mismatched);
        fmt::print("load            {:.3f} s\n", load_seconds);
        fmt::print("RssAnon         delta {}, peak {}\n", human(anon_delta), human(peak.rss_anon));
        fmt::print("RssFile         delta {}, peak {}\n", human(file_delta), human(peak.rss_file));
        fmt::print("VmLck / VmPin   delta {} / {}\n", human(lck_delta), human(pin_delta));
        for (const auto& [region, mem] : peak.drm)
            fmt::print("DRM {:<11} total peak {}, resident peak {}\n", region, human(mem.total),
                       human(mem.resident));
        for (const std::string& m : counts.mismatches) fmt::print("MISMATCH        {}\n", m);
    }
    return counts.tensors_mismatched == 0 ? 0 : 2;
}
