// split_sync_check - the scheduler's sync hook with libllama's split-ordering helper
// (llama-split-sync.cpp, compiled in) on a real ggml_backend_sched and gallocr, with Vulkan
// (lavapipe: asynchronous) and the CPU, not in the simulator.
//
//   split_sync_check race|deferred|inplace RUNS [RULE...]   RULE: none upstream helper (default all)
//
// Builds one graph, computes it RUNS times under each rule with ggml_backend_sched_graph_compute
// and compares every output, bit for bit, with the same graph computed by a CPU-only scheduler.
// The rules are the hook's (LLAMA_WEIGHTMAP_SPLIT_SYNC=none|upstream, unset: the helper), set
// before each scheduler is made and its hook installed, alternating in 10 blocks; the counters
// come from LLAMA_WEIGHTMAP_SPLIT_SYNC_STATS=1 on stderr, one line per block. With
// SPLIT_SYNC_CHECK_TRACE=PREFIX each rule's splits are traced to PREFIX.<rule>.trace. Prints:
//   check case=<race|deferred|inplace> rule=<rule> runs=<n> wrong_runs=<n> us_per_graph=<median>
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
//
// inplace (integrated CUDA's shape: its device accepts cuda_host, the CPU's compute buffer type in
// llama.cpp, so a CUDA split reads a CPU tensor in place, without an input copy; ggml-hexagon has
// the same shape). Vulkan accepts only its own buffer types, so the program registers a small
// device of its own, "AsyncDev": asynchronous (a worker thread computes each graph after a
// delay), its own buffer type, and it supports the CPU's buffer type as integrated CUDA supports
// cuda_host. Splits: A CPU x = 2 * q1; B AsyncDev y = v + x (x broadcast), reading x in place;
// C CPU z = 3 * q2, no inputs, handed x's memory: without a rule, y reads z. A description that names
// only the split's own buffer type would not see the sharing; every buffer the split reads does.
#include "ggml-alloc.h"
#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-vulkan.h"
#include "ggml.h"
#include "llama-split-sync.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

enum class Case { race, deferred, inplace };

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
    ggml_tensor * w1, * w2, * v, * c1, * c2, * cw1, * cw2, * q1, * q2;
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
    w.q1 = ggml_new_tensor_1d(w.ctx_cpu, GGML_TYPE_F32, vec_n / 4); // inplace: x and z
    w.q2 = ggml_new_tensor_1d(w.ctx_cpu, GGML_TYPE_F32, vec_n / 4);
    if (gpu) {
        w.buf_gpu = ggml_backend_alloc_ctx_tensors_from_buft(w.ctx_gpu, gpu);
        ggml_backend_buffer_set_usage(w.buf_gpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    w.buf_cpu = ggml_backend_alloc_ctx_tensors_from_buft(w.ctx_cpu, ggml_backend_cpu_buffer_type());
    ggml_backend_buffer_set_usage(w.buf_cpu, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    int seed = 1;
    for (ggml_tensor * t : {w.w1, w.w2, w.v, w.c1, w.c2, w.cw1, w.cw2, w.q1, w.q2}) {
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

Graph build_inplace_graph(const Weights & w);

Graph build_graph(const Weights & w, Case c) {
    if (c == Case::inplace) {
        return build_inplace_graph(w);
    }
    const bool race = c == Case::race;
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
std::vector<std::vector<float>> reference(ggml_backend_t cpu, Case c) {
    Weights w = make_weights(nullptr);
    Graph g = build_graph(w, c);
    ggml_backend_t backends[] = {cpu};
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, nullptr, 1, GGML_DEFAULT_GRAPH_SIZE, false, false);
    if (ggml_backend_sched_graph_compute(sched, g.gf) != GGML_STATUS_SUCCESS) die("reference graph failed");
    auto out = read_outputs(g);
    ggml_backend_sched_free(sched);
    ggml_free(g.ctx);
    free_weights(w);
    return out;
}

// --- AsyncDev: an asynchronous device that reads the CPU's buffer type in place --------------------

// Its buffers: host memory (so its worker can compute on them), of a buffer type of its own.
void async_buffer_free(ggml_backend_buffer_t b) { free(b->context); }
void * async_buffer_base(ggml_backend_buffer_t b) { return b->context; }
void async_buffer_memset(ggml_backend_buffer_t, ggml_tensor * t, uint8_t v, size_t off, size_t n) { memset((char *) t->data + off, v, n); }
void async_buffer_set(ggml_backend_buffer_t, ggml_tensor * t, const void * d, size_t off, size_t n) { memcpy((char *) t->data + off, d, n); }
void async_buffer_get(ggml_backend_buffer_t, const ggml_tensor * t, void * d, size_t off, size_t n) { memcpy(d, (const char *) t->data + off, n); }
void async_buffer_clear(ggml_backend_buffer_t b, uint8_t v) { memset(b->context, v, b->size); }

ggml_backend_buffer_t async_buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    static ggml_backend_buffer_i iface = [] {
        ggml_backend_buffer_i i = {};
        i.free_buffer = async_buffer_free;
        i.get_base = async_buffer_base;
        i.memset_tensor = async_buffer_memset;
        i.set_tensor = async_buffer_set;
        i.get_tensor = async_buffer_get;
        i.clear = async_buffer_clear;
        return i;
    }();
    void * data = aligned_alloc(64, (size + 63) / 64 * 64 + 64);
    return ggml_backend_buffer_init(buft, iface, data, size);
}
const char * async_buft_name(ggml_backend_buffer_type_t) { return "AsyncDev"; }
size_t async_buft_alignment(ggml_backend_buffer_type_t) { return 64; }

// The device's queue: graphs run on a worker thread, each after a delay, in order.
struct AsyncQueue {
    std::mutex m;
    std::condition_variable cv;
    std::deque<ggml_cgraph *> jobs;
    bool busy = false, stop = false;
    ggml_backend_t cpu = ggml_backend_cpu_init();
    std::thread worker{[this] { run(); }};

    void run() {
        ggml_backend_cpu_set_n_threads(cpu, 1);
        std::unique_lock<std::mutex> lock(m);
        for (;;) {
            cv.wait(lock, [this] { return stop || !jobs.empty(); });
            if (jobs.empty()) return;
            ggml_cgraph * g = jobs.front();
            jobs.pop_front();
            busy = true;
            lock.unlock();
            std::this_thread::sleep_for(std::chrono::milliseconds(2)); // a busy device
            ggml_backend_graph_compute(cpu, g);
            lock.lock();
            busy = false;
            cv.notify_all();
        }
    }
    void wait_idle() {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [this] { return jobs.empty() && !busy; });
    }
    ~AsyncQueue() {
        { std::lock_guard<std::mutex> lock(m); stop = true; }
        cv.notify_all();
        worker.join();
        ggml_backend_free(cpu);
    }
};

struct AsyncDev {
    ggml_backend_buffer_type buft;
    ggml_backend_device device;
    ggml_backend_reg reg;
};
AsyncDev & async_dev();

const char * async_name(ggml_backend_t) { return "AsyncDev"; }
void async_free(ggml_backend_t backend) {
    delete (AsyncQueue *) backend->context;
    delete backend;
}
void async_synchronize(ggml_backend_t backend) { ((AsyncQueue *) backend->context)->wait_idle(); }
ggml_status async_graph_compute(ggml_backend_t backend, ggml_cgraph * g) {
    auto * q = (AsyncQueue *) backend->context;
    { std::lock_guard<std::mutex> lock(q->m); q->jobs.push_back(g); }
    q->cv.notify_all();
    return GGML_STATUS_SUCCESS; // returns before the work is done, as CUDA does
}

ggml_backend_t async_init(ggml_backend_dev_t dev, const char *) {
    static ggml_guid guid = {0x61, 0x73, 0x79, 0x6e, 0x63, 0x64, 0x65, 0x76};
    ggml_backend_i iface = {};
    iface.get_name = async_name;
    iface.free = async_free;
    iface.synchronize = async_synchronize;
    iface.graph_compute = async_graph_compute;
    return new ggml_backend{&guid, iface, dev, new AsyncQueue};
}
const char * async_dev_name(ggml_backend_dev_t) { return "AsyncDev"; }
void async_dev_memory(ggml_backend_dev_t, size_t * free_mem, size_t * total) { *free_mem = *total = size_t(1) << 30; }
enum ggml_backend_dev_type async_dev_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_IGPU; }
void async_dev_props(ggml_backend_dev_t dev, ggml_backend_dev_props * props) {
    *props = {};
    props->name = props->description = async_dev_name(dev);
    props->type = GGML_BACKEND_DEVICE_TYPE_IGPU;
}
ggml_backend_buffer_type_t async_dev_buft(ggml_backend_dev_t) { return &async_dev().buft; }
bool async_supports_op(ggml_backend_dev_t, const ggml_tensor * op) { return op->op == GGML_OP_ADD || op->op == GGML_OP_NONE; }
// integrated CUDA accepts cuda_host; this device accepts the CPU's buffer type
bool async_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) {
    return buft == &async_dev().buft || buft == ggml_backend_cpu_buffer_type();
}
size_t async_reg_count(ggml_backend_reg_t) { return 1; }
ggml_backend_dev_t async_reg_device(ggml_backend_reg_t, size_t) { return &async_dev().device; }
const char * async_reg_name(ggml_backend_reg_t) { return "AsyncDev"; }

AsyncDev & async_dev() {
    static AsyncDev d = [] {
        AsyncDev a = {};
        a.buft.iface.get_name = async_buft_name;
        a.buft.iface.alloc_buffer = async_buft_alloc;
        a.buft.iface.get_alignment = async_buft_alignment;
        a.device.iface.get_name = a.device.iface.get_description = async_dev_name;
        a.device.iface.get_memory = async_dev_memory;
        a.device.iface.get_type = async_dev_type;
        a.device.iface.get_props = async_dev_props;
        a.device.iface.init_backend = async_init;
        a.device.iface.get_buffer_type = async_dev_buft;
        a.device.iface.supports_op = async_supports_op;
        a.device.iface.supports_buft = async_supports_buft;
        a.reg.api_version = GGML_BACKEND_API_VERSION;
        a.reg.iface.get_name = async_reg_name;
        a.reg.iface.get_device_count = async_reg_count;
        a.reg.iface.get_device = async_reg_device;
        return a;
    }();
    static bool linked = [] {
        d.buft.device = &d.device;
        d.device.reg = &d.reg;
        return true;
    }();
    (void) linked;
    return d;
}

// inplace: x = 2 * q1 (CPU), y = v + x (AsyncDev, v its weight, x read in place), z = 3 * q2 (CPU).
Graph build_inplace_graph(const Weights & w) {
    Graph g;
    g.ctx = tensor_context();
    g.gf = ggml_new_graph(g.ctx);
    // x is a quarter of y, broadcast by the add: y cannot be computed in place over x (the
    // allocator would, and then nothing would be handed x's memory), and z, x's size, can be
    ggml_tensor * x = ggml_scale(g.ctx, w.q1, 2.0f);
    ggml_tensor * y = ggml_add(g.ctx, w.v, x);
    ggml_tensor * z = ggml_scale(g.ctx, w.q2, 3.0f);
    g.outputs = {y, z};
    for (ggml_tensor * t : g.outputs) {
        ggml_set_output(t);
        ggml_build_forward_expand(g.gf, t);
    }
    return g;
}

struct RuleRuns {
    explicit RuleRuns(const char * name) : rule(name) {}
    const char * rule;
    int wrong = 0;
    std::vector<double> us;
};

// One block of `runs` graphs under `rule` on a scheduler made for it (the hook reads
// LLAMA_WEIGHTMAP_SPLIT_SYNC* when it is installed), with a graph of its own (a graph keeps the
// addresses its scheduler's allocator gave it). Returns the split count it saw.
int run_block(RuleRuns & r, int runs, const Weights & w, Case c, ggml_backend_t * backends,
              ggml_backend_buffer_type_t * bufts, const std::vector<std::vector<float>> & expected,
              const char * trace_prefix) {
    if (strcmp(r.rule, "helper") == 0) {
        unsetenv("LLAMA_WEIGHTMAP_SPLIT_SYNC");
    } else {
        setenv("LLAMA_WEIGHTMAP_SPLIT_SYNC", r.rule, 1);
    }
    if (trace_prefix != nullptr) {
        setenv("LLAMA_WEIGHTMAP_SPLIT_SYNC_TRACE", (std::string(trace_prefix) + "." + r.rule + ".trace").c_str(), 1);
    }
    // parallel: events, so an input copy waits on the device, not the host (n_copies > 1)
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, bufts, 2, GGML_DEFAULT_GRAPH_SIZE, true, false);
    llama_split_sync_install(sched, 2);
    Graph g = build_graph(w, c);
    for (int run = 0; run < runs; run++) {
        const auto start = std::chrono::steady_clock::now();
        if (ggml_backend_sched_graph_compute(sched, g.gf) != GGML_STATUS_SUCCESS) die("graph failed");
        r.us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
        r.wrong += read_outputs(g) != expected;
    }
    const int n_splits = ggml_backend_sched_get_n_splits(sched);
    ggml_backend_sched_free(sched); // logs LLAMA_WEIGHTMAP_SPLIT_SYNC_STATS
    ggml_free(g.ctx);
    return n_splits;
}

} // namespace

int main(int argc, char ** argv) {
    const std::string name = argc >= 3 ? argv[1] : "";
    if (name != "race" && name != "deferred" && name != "inplace") {
        die("usage: split_sync_check race|deferred|inplace RUNS [RULE...] (rules: none upstream helper)");
    }
    const Case c = name == "race" ? Case::race : name == "deferred" ? Case::deferred : Case::inplace;
    const int runs = atoi(argv[2]);
    if (runs < 1) die("RUNS must be >= 1");
    std::vector<RuleRuns> rules;
    for (int i = 3; i < argc; i++) rules.emplace_back(argv[i]);
    if (rules.empty()) {
        for (const char * rule : {"none", "upstream", "helper"}) rules.emplace_back(rule);
    }

    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 1); // one core for the CPU splits, one for the device
    const auto expected = reference(cpu, c);

    ggml_backend_t dev = nullptr;
    ggml_backend_buffer_type_t bufts[2];
    if (c == Case::inplace) {
        dev = ggml_backend_dev_init(&async_dev().device, nullptr);
        // the CPU's own buffer type: what AsyncDev reads in place
        bufts[0] = &async_dev().buft;
        bufts[1] = ggml_backend_cpu_buffer_type();
    } else {
        if (ggml_backend_vk_get_device_count() < 1) die("no Vulkan device (GGML_VK_VISIBLE_DEVICES=0 for lavapipe)");
        dev = ggml_backend_vk_init(0);
        if (dev == nullptr) die("ggml_backend_vk_init(0) failed");
        // llama.cpp's choice for the CPU's compute buffer: the GPU's pinned host memory, which
        // Vulkan's input copies read asynchronously
        bufts[0] = ggml_backend_vk_buffer_type(0);
        bufts[1] = ggml_backend_vk_host_buffer_type();
    }
    Weights w = make_weights(bufts[0]);
    ggml_backend_t backends[] = {dev, cpu};

    // the rules alternate in blocks, so that their times come from the same stretch of the run
    const int blocks = std::min(10, runs);
    const int want_splits = c == Case::race ? 4 : c == Case::inplace ? 3 : 2;
    for (int b = 0; b < blocks; b++) {
        for (RuleRuns & r : rules) {
            const int n = runs / blocks + (b < runs % blocks);
            const int n_splits = run_block(r, n, w, c, backends, bufts, expected, getenv("SPLIT_SYNC_CHECK_TRACE"));
            if (n_splits != want_splits) { // not the shape described above: the check would prove nothing
                fprintf(stderr, "split_sync_check: %d splits, expected %d\n", n_splits, want_splits);
                return 1;
            }
        }
    }
    for (RuleRuns & r : rules) {
        std::nth_element(r.us.begin(), r.us.begin() + r.us.size() / 2, r.us.end());
        printf("check case=%s rule=%s runs=%zu wrong_runs=%d us_per_graph=%.1f\n", name.c_str(), r.rule,
               r.us.size(), r.wrong, r.us[r.us.size() / 2]);
    }
    free_weights(w);
    ggml_backend_free(dev);
    ggml_backend_free(cpu);
    return 0;
}
