// SPDX-License-Identifier: MIT
// Benchmark (meson test --benchmark): wm-plan on a generated sparse 8 GiB MoE model (48 layers,
// 128 experts, the shape of Qwen3-30B-A3B): wall time of --json and of the table, each the best
// of 5 runs, printed with the plan's totals. Not a pass/fail test: it prints numbers; it fails
// only if wm-plan does. Usage: bench_wm_plan [SIZE_MIB]   ($WM_PLAN: the wm-plan binary)
#include <algorithm>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "formats/run_process.hpp"
#include "testkit/synthetic_model.hpp"
#include "support/temp_file.hpp"

int main(int argc, char** argv) {
    using namespace wm::testkit;
    SyntheticModelOptions o;
    o.layers = 48;
    o.experts = 128;
    o.target_bytes = (argc > 1 ? std::stoull(argv[1]) : 8192) << 20;
    const SyntheticModel m = make_synthetic_model(o);
    wm::test::TempDir dir;
    const std::string path = dir.path() + "/moe-sparse.gguf";
    auto layout = write_gguf(path, m.spec, DataFill::sparse);
    if (!layout) {
        fmt::print(stderr, "bench_wm_plan: {}\n", layout.error().message);
        return 1;
    }
    const std::string wm_plan = wm::test::tool_path("WM_PLAN");
    fmt::print("model: {} MiB sparse GGUF, {} tensors, 48 layers x 128 experts (n_embd {}, "
               "n_ff {})\n", layout->file_size >> 20, m.spec.tensors.size(), m.n_embd, m.n_ff);

    auto best_of = [&](std::vector<std::string> args, wm::test::ProcessResult& last) {
        double best = 1e9;
        for (int i = 0; i < 5; ++i) {
            last = wm::test::run_process(args, dir.path());
            if (last.status != 0) return -1.0;
            best = std::min(best, last.seconds);
        }
        return best;
    };
    wm::test::ProcessResult json, table;
    const double t_json = best_of({wm_plan, "--json", "--cpu-moe", path}, json);
    const double t_table = best_of({wm_plan, "--cpu-moe", path}, table);
    if (t_json < 0 || t_table < 0) {
        fmt::print(stderr, "bench_wm_plan: wm-plan failed: {}{}\n", json.err, table.err);
        return 1;
    }
    fmt::print("{:<36} {:>10}\n", "command (--cpu-moe, best of 5)", "wall ms");
    fmt::print("{:<36} {:>10.1f}\n", "wm-plan --json", t_json * 1000);
    fmt::print("{:<36} {:>10.1f}\n", "wm-plan (table)", t_table * 1000);
    const auto totals = table.out.rfind("totals:");
    if (totals != std::string::npos) fmt::print("{}", table.out.substr(totals));
    return 0;
}
