// SPDX-License-Identifier: MIT
// bench_planner - plans model-shaped layouts in the three modes (span, gate, runs) and prints
// what each would import and pin, and how long planning takes; then how planning time grows
// from 1k to 1M tensors. Exits 1 when a target of issue 6 is missed:
//   30B-A3B, experts on the CPU: runs imports >= 99 % of device bytes, pinned/imported <= 1.01,
//   at most 2 imports per layer; gate imports 0 %; span pins the whole file.
//   Dense: gate and runs identical. 1M tensors planned in under a second (first call), and the
//   step from 100k to 1M tensors no worse than n log n (at most 2x its ratio: timer noise on a
//   shared machine).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <malloc.h>
#include <vector>

#include <fmt/format.h>

#include "testkit/layouts.hpp"
#include "weightmap/planner.hpp"

namespace {

using namespace wm;
using namespace wm::testkit;

constexpr double MiB = 1024.0 * 1024.0;

PlanOptions options_for(PlanMode mode) {
    PlanOptions o;
    o.mode = mode;
    o.page_size = 4096;
    o.import_enabled = true;
    return o;
}

// Evicts the caches (64 MiB written), so every size is timed from memory, not from a cache
// that holds 10k tensors and not 100k.
void flush_caches() {
    static std::vector<unsigned char> scratch(64u << 20);
    for (std::size_t i = 0; i < scratch.size(); i += 64) scratch[i] = static_cast<unsigned char>(scratch[i] + 1);
}

struct Timing {
    double first_ms = 0; // the first call: what one engine load pays (fresh pages included)
    double best_ms = 0;  // best of the rest: the algorithm, memory already mapped
};

// Times `reps` + 1 calls; the plan of the last in `out`.
Timing time_plan(const ModelDesc& model, const PlanOptions& options, int reps, Plan& out) {
    Timing timing{0, 1e300};
    for (int i = 0; i <= reps; ++i) {
        flush_caches();
        const auto t0 = std::chrono::steady_clock::now();
        Result<Plan> plan = make_plan(model, options);
        const auto t1 = std::chrono::steady_clock::now();
        if (!plan) {
            fmt::print(stderr, "bench_planner: {}\n", plan.error().message);
            std::exit(2);
        }
        const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        if (i == 0) timing.first_ms = ms;
        else timing.best_ms = std::min(timing.best_ms, ms);
        out = std::move(plan).value();
    }
    return timing;
}

int failures = 0;
void require(bool ok, const std::string& what) {
    fmt::print("  [{}] {}\n", ok ? "ok" : "FAIL", what);
    failures += !ok;
}

bool same_plan(const Plan& a, const Plan& b) {
    if (a.regions.size() != b.regions.size()) return false;
    for (std::size_t r = 0; r < a.regions.size(); ++r) {
        const auto& x = a.regions[r].runs;
        const auto& y = b.regions[r].runs;
        if (x.size() != y.size()) return false;
        for (std::size_t k = 0; k < x.size(); ++k)
            if (x[k].extent_offset != y[k].extent_offset || x[k].extent_size != y[k].extent_size ||
                x[k].tensors != y[k].tensors)
                return false;
    }
    return a.totals.imported_bytes == b.totals.imported_bytes &&
           a.totals.pinned_bytes == b.totals.pinned_bytes;
}

} // namespace

int main() {
    // Keep freed memory in the heap: otherwise every call of 100k tensors or more maps and
    // faults in fresh pages while smaller ones reuse the heap, which is not the algorithm's cost.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    std::vector<Layout> layouts;
    layouts.push_back(dense_4b());
    {
        Layout limited = dense_4b();
        limited.name = "dense 4B, 1 GiB import limit";
        limited.model.targets[device_target].caps.max_import_size = std::uint64_t{1} << 30;
        layouts.push_back(std::move(limited));
    }
    layouts.push_back(moe_30b_a3b());
    layouts.push_back(moe_30b_a3b(3));
    layouts.push_back(moe_30b_a3b(1, BlockOrder::name_sorted));
    layouts.push_back(moe_235b_a22b());

    fmt::print("Planning model-shaped layouts (Q4_K_M sizes; MoE experts and token_embd on the "
               "CPU; page 4 KiB)\n\n");
    fmt::print("{:<30} {:>5} {:>9} {:>6} | {:<4} {:>10} {:>9} {:>11} {:>8} {:>7} {:>8} {:>8}\n",
               "layout", "files", "file GB", "layers", "mode", "device MiB", "imported",
               "pinned MiB", "pin/imp", "imports", "/layer", "plan ms");
    for (const Layout& l : layouts) {
        std::uint64_t file_bytes = 0;
        for (const FileDesc& f : l.model.files) file_bytes += f.size;
        Plan plans[3];
        const PlanMode modes[3] = {PlanMode::span, PlanMode::gate, PlanMode::runs};
        for (int i = 0; i < 3; ++i) {
            const double ms = time_plan(l.model, options_for(modes[i]), 5, plans[i]).best_ms;
            const PlanTotals& t = plans[i].totals;
            fmt::print("{:<30} {:>5} {:>9.2f} {:>6} | {:<4} {:>10.1f} {:>8.2f}% {:>11.1f} {:>8} "
                       "{:>7} {:>8.2f} {:>8.3f}\n",
                       i == 0 ? l.name : "", i == 0 ? fmt::format("{}", l.model.files.size()) : "",
                       file_bytes / 1e9, i == 0 ? fmt::format("{}", l.layers) : "",
                       to_string(modes[i]), t.device_bytes / MiB,
                       t.device_bytes ? 100.0 * t.imported_bytes / t.device_bytes : 0.0,
                       t.pinned_bytes / MiB,
                       t.imported_bytes ? fmt::format("{:.4f}", double(t.pinned_bytes) /
                                                                     t.imported_bytes)
                                        : std::string("-"),
                       t.imports, double(t.imports) / l.layers, ms);
        }
        const PlanTotals& span = plans[0].totals;
        const PlanTotals& gate = plans[1].totals;
        const PlanTotals& runs = plans[2].totals;
        if (l.name.starts_with("dense")) {
            require(same_plan(plans[1], plans[2]), l.name + ": gate and runs plans are identical");
        } else {
            require(runs.imported_bytes * 100 >= runs.device_bytes * 99,
                    fmt::format("{}: runs imports {:.2f}% >= 99% of device bytes", l.name,
                                100.0 * runs.imported_bytes / runs.device_bytes));
            require(runs.pinned_bytes * 100 <= runs.imported_bytes * 101,
                    fmt::format("{}: runs pinned/imported {:.4f} <= 1.01", l.name,
                                double(runs.pinned_bytes) / runs.imported_bytes));
            // Name-sorted blocks have two device clusters a layer (ffn_gate_inp and ffn_norm sit
            // between the experts), and the output head after the last experts is one more.
            const bool sorted = l.name.find("name-sorted") != std::string::npos;
            require(runs.imports <= 2ull * l.layers + (sorted ? 1 : 0),
                    fmt::format("{}: runs {} imports <= 2 per layer ({} layers){}", l.name,
                                runs.imports, l.layers, sorted ? " + 1 for the output head" : ""));
            require(gate.imported_bytes == 0, l.name + ": gate imports 0%");
            require(span.pinned_bytes * 100 >= file_bytes * (l.model.files.size() == 1 ? 98 : 95),
                    fmt::format("{}: span pins {:.1f}% of the file bytes (all but the CPU-only "
                                "head and tail of each file)",
                                l.name, 100.0 * span.pinned_bytes / file_bytes));
        }
    }

    fmt::print("\nPlanning time against the number of tensors (caches flushed before each call; "
               "best: best of N with the heap warm; first: the first call)\n");
    fmt::print("{:<34} {:>8} {:>7} {:>9} {:>8} {:>9} {:>10} {:>10}\n", "layout", "tensors",
               "imports", "best ms", "ns/tensor", "first ms", "x previous", "n log n x");
    struct Series {
        const char* name;
        Layout (*make)(std::size_t);
        PlanMode mode;
    };
    const Series series[] = {{"scaled MoE (per-expert), runs", scaled_moe, PlanMode::runs},
                             {"scaled MoE (per-expert), gate", scaled_moe, PlanMode::gate},
                             {"scaled MoE (per-expert), span", scaled_moe, PlanMode::span},
                             {"adversarial equal gaps, runs", adversarial_gaps, PlanMode::runs}};
    for (const Series& s : series) {
        double previous = 0;
        std::size_t previous_n = 0;
        for (std::size_t n : {std::size_t{1'000}, std::size_t{10'000}, std::size_t{100'000},
                              std::size_t{1'000'000}}) {
            const Layout l = s.make(n);
            Plan plan;
            const Timing t = time_plan(l.model, options_for(s.mode), n >= 1'000'000 ? 3 : 7, plan);
            std::string ratio = "-", bound = "-";
            bool grows_ok = true;
            double nlogn = 0;
            if (previous_n != 0) {
                nlogn = double(n) * std::log2(double(n)) /
                        (double(previous_n) * std::log2(double(previous_n)));
                ratio = fmt::format("{:.2f}", t.best_ms / previous);
                bound = fmt::format("{:.2f}", nlogn);
                grows_ok = t.best_ms / previous <= 2 * nlogn;
            }
            fmt::print("{:<34} {:>8} {:>7} {:>9.2f} {:>8.0f} {:>9.2f} {:>10} {:>10}\n", s.name, n,
                       plan.totals.imports, t.best_ms, t.best_ms * 1e6 / double(n), t.first_ms,
                       ratio, bound);
            // Only the last step is held to n log n: below 100k a plan partly fits in the caches
            // and fixed costs dominate (the ratios are printed all the same).
            if (n == 1'000'000)
                require(grows_ok, fmt::format("{}: {} -> {} tensors costs {}x, n log n {:.2f}x",
                                              s.name, previous_n, n, ratio, nlogn));
            if (n == 1'000'000)
                require(t.first_ms < 1000.0,
                        fmt::format("{}: 1M tensors planned in {:.0f} ms (first call) < 1 s",
                                    s.name, t.first_ms));
            previous = t.best_ms;
            previous_n = n;
        }
    }
    fmt::print("\n{}\n", failures == 0 ? "all targets met" : fmt::format("{} target(s) missed",
                                                                          failures));
    return failures == 0 ? 0 : 1;
}
