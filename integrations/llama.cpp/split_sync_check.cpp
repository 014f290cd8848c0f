// split_sync_check - the scheduler patch (0007) on a real ggml_backend_sched and gallocr, with
// Vulkan (lavapipe: asynchronous) and the CPU, not in the simulator.
//
//   split_sync_check race|deferred RUNS [RULE...]      RULE: none upstream helper (default all)
//
// Builds one graph, computes it RUNS times under each rule with ggml_backend_sched_graph_compute
// and compares every output, bit for bit, with the same graph computed by a CPU-only scheduler.
// The rules are the patched scheduler's (GGML_WEIGHTMAP_SPLIT_SYNC=none|upstream, unset: the
// helper), set before each scheduler is made, alternating in 10 blocks; the scheduler's counters
// come from GGML_WEIGHTMAP_SPLIT_SYNC_STATS=1 on stderr, one line per block. With
// SPLIT_SYNC_CHECK_TRACE=PREFIX each rule's splits are traced to PREFIX.<rule>.trace. Prints:
//   check case=<race|deferred> rule=<rule> runs=<n> wrong_runs=<n> us_per_graph=<median>
//
// Splits, in order (the scheduler keeps the graph's node order; a weight's buffer pins its op):
//   V0  Vulkan  h = W1 x W2                         slow: the queue is busy when V0 returns
//   A   CPU     x = 2 * c1 (deferred: x = C1 x C2)  no inputs
//   B   Vulkan  y = x + v, copying x from the CPU   race only
//   C   CPU     z = 3 * c2                          no inputs; race: gallocr hands it x's memory
// race (ggml #26040's shape): B's copy of x waits behind V0 on Vulkan's queue (the scheduler is
// parallel, so the copy waits on an event, not on the host) while C overwrites x: without a rule
// y is wrong. deferred (the seed's shape): V0 then A only; A uses only CPU memory, so nothing is
// reused under V0: the helper lets them overlap where the old rule waits for V0.
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-vulkan.h"
#include "ggml.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int64_t mat_n = 256, mat_k = 256, mat_m = 64; // V0: [k, n] x [k, m]
constexpr int64_t cpu_m = 1024;                          // deferred's A: [k, n] x [k, cpu_m], about V0's time
constexpr int64_t vec_n = 1 << 18;                        // x, z: 1 MiB of F32 (> Vulkan's 128 KiB CPU-copy path)

[[noreturn]] void die(const char * what) {
    fprintf(stderr, "split_sync_check: %s\n", what);
    exit(1);
}

// Small integers: every sum is exact in F32 (and F16), so outputs compare bit for bit.
void fill(ggml_tensor * t, int seed) {
    std::vector<float> v(ggml_nelements(t));
    for (size_t i = 0; i < v.size(); i++) {
        v[i] = float(int((i * 2654435761u + seed * 40503u) >> 7 & 3) - 1);
    }
    ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
}

struct Weights {
    ggml_context * ctx_gpu = nullptr, * ctx_cpu = nullptr;
    ggml_backend_buffer_t buf_gpu = nullptr, buf_cpu = nullptr;
    ggml_tensor * w1, * w2, * v, * c1, * c2, * cw1, * cw2;
};

ggml_context * tensor_context() {
    ggml_init_params params = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    return ggml_init(params);
}

// Weights in a Vulkan buffer and in a CPU buffer, marked as weights so the scheduler runs the ops
// that read them where they are. With `gpu` null, all of them on the CPU (the reference).
Weights make_weights(ggml_backend_buffer_type_t gpu) {
    Weights w;
    w.ctx_gpu = tensor_context();
    w.ctx_cpu = tensor_context();
    ggml_context * g = gpu ? w.ctx_gpu : w.ctx_cpu;
    w.w1 = ggml_new_tensor_2d(g, GGML_TYPE_F32, mat_k, mat_n);
    w.w2 = ggml_new_tensor_2d(g, GGML_TYPE_F32, mat_k, mat_m);
    w.v  = ggml_new_tensor_1d(g, GGML_TYPE_F32, vec_n);
    w.c1 = ggml_new_tensor_1d(w.ctx_cpu, GGML_TYPE_F32, vec_n);
    w.c2 = ggml_new_tensor_1d(w.ctx_cpu, GGML_TYPE_F32, vec_n);
    w.cw1 = ggml_new_tensor_2d(w.ctx_cpu, GGML_TYPE_F32, mat_k, mat_n);
    w.cw2 = ggml_new_tensor_2d(w.ctx_cpu, GGML_TYPE_F32, mat_k, cpu_m);
    if (gpu) {
        w.buf_gpu = ggml_backend_alloc_ctx_tensors_from_buft(w.ctx_gpu, gpu);
        ggml_backend_buffer_set_usage(w.buf_gpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    w.buf_cpu = ggml_backend_alloc_ctx_tensors_from_buft(w.ctx_cpu, ggml_backend_cpu_buffer_type());
    ggml_backend_buffer_set_usage(w.buf_cpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    int seed = 1;
    for (ggml_tensor * t : {w.w1, w.w2, w.v, w.c1, w.c2, w.cw1, w.cw2}) {
        fill(t, seed++);
    }
    return w;
}

void free_weights(Weights & w) {
    ggml_backend_buffer_free(w.buf_gpu);
    ggml_backend_buffer_free(w.buf_cpu);
    ggml_free(w.ctx_gpu);
    ggml_free(w.ctx_cpu);
}

struct Graph {
    ggml_context * ctx;
    ggml_cgraph * gf;
    std::vector<ggml_tensor *> outputs;
};

Graph build_graph(const Weights & w, bool race) {
    Graph g;
    g.ctx = tensor_context();
    g.gf = ggml_new_graph(g.ctx);
    ggml_tensor * h = ggml_mul_mat(g.ctx, w.w1, w.w2);
    // deferred: as much work on the CPU as V0 has on Vulkan, so that overlapping them shows
    ggml_tensor * x = race ? ggml_scale(g.ctx, w.c1, 2.0f) : ggml_mul_mat(g.ctx, w.cw1, w.cw2);
    g.outputs = {h};
    if (race) {
        ggml_tensor * y = ggml_add(g.ctx, x, w.v);
        ggml_tensor * z = ggml_scale(g.ctx, w.c2, 3.0f);
        g.outputs.push_back(y);
        g.outputs.push_back(z);
    } else {
        g.outputs.push_back(x);
    }
    for (ggml_tensor * t : g.outputs) {
        ggml_set_output(t);
        ggml_build_forward_expand(g.gf, t);
    }
    return g;
}

std::vector<std::vector<float>> read_outputs(const Graph & g) {
    std::vector<std::vector<float>> out;
    for (ggml_tensor * t : g.outputs) {
        out.emplace_back(ggml_nelements(t));
        ggml_backend_tensor_get(t, out.back().data(), 0, ggml_nbytes(t));
    }
    return out;
}

// The outputs of the graph on a CPU-only scheduler.
std::vector<std::vector<float>> reference(ggml_backend_t cpu, bool race) {
    Weights w = make_weights(nullptr);
    Graph g = build_graph(w, race);
    ggml_backend_t backends[] = {cpu};
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, nullptr, 1, GGML_DEFAULT_GRAPH_SIZE, false, false);
    if (ggml_backend_sched_graph_compute(sched, g.gf) != GGML_STATUS_SUCCESS) die("reference graph failed");
    auto out = read_outputs(g);
    ggml_backend_sched_free(sched);
    ggml_free(g.ctx);
    free_weights(w);
    return out;
}

struct RuleRuns {
    explicit RuleRuns(const char * name) : rule(name) {}
    const char * rule;
    int wrong = 0;
    std::vector<double> us;
};

// One block of `runs` graphs under `rule` on a scheduler made for it (the patch reads
// GGML_WEIGHTMAP_SPLIT_SYNC* when a scheduler is made), with a graph of its own (a graph keeps the
// addresses its scheduler's allocator gave it). Returns the split count it saw.
int run_block(RuleRuns & r, int runs, const Weights & w, bool race, ggml_backend_t * backends,
              ggml_backend_buffer_type_t * bufts, const std::vector<std::vector<float>> & expected,
              const char * trace_prefix) {
    if (strcmp(r.rule, "helper") == 0) {
        unsetenv("GGML_WEIGHTMAP_SPLIT_SYNC");
    } else {
        setenv("GGML_WEIGHTMAP_SPLIT_SYNC", r.rule, 1);
    }
    if (trace_prefix != nullptr) {
        setenv("GGML_WEIGHTMAP_SPLIT_SYNC_TRACE", (std::string(trace_prefix) + "." + r.rule + ".trace").c_str(), 1);
    }
    // parallel: events, so an input copy waits on the device, not the host (n_copies > 1)
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, bufts, 2, GGML_DEFAULT_GRAPH_SIZE, true, false);
    Graph g = build_graph(w, race);
    for (int run = 0; run < runs; run++) {
        const auto start = std::chrono::steady_clock::now();
        if (ggml_backend_sched_graph_compute(sched, g.gf) != GGML_STATUS_SUCCESS) die("graph failed");
        r.us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
        r.wrong += read_outputs(g) != expected;
    }
    const int n_splits = ggml_backend_sched_get_n_splits(sched);
    ggml_backend_sched_free(sched); // prints GGML_WEIGHTMAP_SPLIT_SYNC_STATS
    ggml_free(g.ctx);
    return n_splits;
}

} // namespace

int main(int argc, char ** argv) {
    if (argc < 3 || (strcmp(argv[1], "race") != 0 && strcmp(argv[1], "deferred") != 0)) {
        die("usage: split_sync_check race|deferred RUNS [RULE...] (rules: none upstream helper)");
    }
    const bool race = strcmp(argv[1], "race") == 0;
    const int runs = atoi(argv[2]);
    if (runs < 1) die("RUNS must be >= 1");
    std::vector<RuleRuns> rules;
    for (int i = 3; i < argc; i++) rules.emplace_back(argv[i]);
    if (rules.empty()) {
        for (const char * rule : {"none", "upstream", "helper"}) rules.emplace_back(rule);
    }
    if (ggml_backend_vk_get_device_count() < 1) die("no Vulkan device (GGML_VK_VISIBLE_DEVICES=0 for lavapipe)");

    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 1); // one core for the CPU splits, one for lavapipe
    const auto expected = reference(cpu, race);

    ggml_backend_t vk = ggml_backend_vk_init(0);
    if (vk == nullptr) die("ggml_backend_vk_init(0) failed");
    Weights w = make_weights(ggml_backend_vk_buffer_type(0));
    // llama.cpp's choice for the CPU's compute buffer: the GPU's pinned host memory, which
    // Vulkan's input copies read asynchronously
    ggml_backend_t backends[] = {vk, cpu};
    ggml_backend_buffer_type_t bufts[] = {ggml_backend_vk_buffer_type(0), ggml_backend_vk_host_buffer_type()};

    // the rules alternate in blocks, so that their times come from the same stretch of the run
    const int blocks = std::min(10, runs);
    const int want_splits = race ? 4 : 2;
    for (int b = 0; b < blocks; b++) {
        for (RuleRuns & r : rules) {
            const int n = runs / blocks + (b < runs % blocks);
            const int n_splits = run_block(r, n, w, race, backends, bufts, expected, getenv("SPLIT_SYNC_CHECK_TRACE"));
            if (n_splits != want_splits) { // not the shape described above: the check would prove nothing
                fprintf(stderr, "split_sync_check: %d splits, expected %d\n", n_splits, want_splits);
                return 1;
            }
        }
    }
    for (RuleRuns & r : rules) {
        std::nth_element(r.us.begin(), r.us.begin() + r.us.size() / 2, r.us.end());
        printf("check case=%s rule=%s runs=%zu wrong_runs=%d us_per_graph=%.1f\n", argv[1], r.rule,
               r.us.size(), r.wrong, r.us[r.us.size() / 2]);
    }
    free_weights(w);
    ggml_backend_free(vk);
    ggml_backend_free(cpu);
    return 0;
}
