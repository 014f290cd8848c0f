// SPDX-License-Identifier: MIT
// The split simulator: virtual backends, a reusing graph allocator, hazard detection by vector
// clocks, the rules it judges, and the random and named graphs. See split_sim.hpp.
#include "testkit/split_sim.hpp"

#include <algorithm>
#include <bit>

namespace wm::testkit::sim {

namespace {

constexpr BackendMask bit_of(std::uint32_t index) { return BackendMask{1} << index; }

BackendMask all_backends(std::uint32_t n) {
    return n >= 64 ? ~BackendMask{0} : bit_of(n) - 1;
}

template <class F>
void for_each_bit(std::uint64_t mask, F&& f) {
    while (mask != 0) {
        f(static_cast<std::uint32_t>(std::countr_zero(mask)));
        mask &= mask - 1;
    }
}

bool copies_async(const SplitDesc& d) {
    return d.n_inputs > 0 && d.backend_async && d.input_copies_async;
}

BackendMask sources(const SplitDesc& d) { return d.input_backends & ~bit_of(d.backend); }

} // namespace

std::uint64_t Rng::next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

std::uint32_t Rng::below(std::uint32_t bound) {
    return static_cast<std::uint32_t>(((next() >> 32) * bound) >> 32);
}

std::uint64_t corpus_seed(std::uint64_t index) {
    Rng rng(0x5711'7500'0000'0000ULL + index);
    return rng.next();
}

// ---------------------------------------------------------------------------------------------
// Graphs

bool Graph::starts_graph(std::size_t split) const {
    // ascending by construction: a replayed trace asks this for each of thousands of splits
    return std::binary_search(graph_starts.begin(), graph_starts.end(), split);
}

void allocate_regions(Graph& graph, std::uint64_t seed) {
    const bool deterministic = seed == 0;
    Rng rng(seed);
    struct Output {
        std::uint32_t region, buffer_type, backend, readers_left; // readers_left 0: forever
        bool live;
    };
    std::vector<Output> outputs;
    std::vector<std::vector<std::uint32_t>> free_list(64);
    std::uint32_t next_region = 0;

    auto alloc = [&](std::uint32_t bt) {
        auto& list = free_list[bt];
        if (!list.empty() && (deterministic || rng.chance(85))) {
            std::size_t pick = deterministic ? list.size() - 1 : rng.below(
                static_cast<std::uint32_t>(list.size()));
            std::uint32_t region = list[pick];
            list.erase(list.begin() + static_cast<std::ptrdiff_t>(pick));
            return region;
        }
        return next_region++;
    };

    graph.accesses.assign(graph.splits.size(), {});
    std::vector<std::pair<std::uint32_t, std::uint32_t>> to_free, temps; // (bt, region)
    std::vector<std::size_t> live;
    for (std::size_t i = 0; i < graph.splits.size(); ++i) {
        const SplitDesc& d = graph.splits[i];
        auto& acc = graph.accesses[i];
        to_free.clear();
        temps.clear();
        if (graph.starts_graph(i)) { // a new engine graph: the same buffers, handed out again
            for (Output& out : outputs) {
                if (out.live) {
                    out.live = false;
                    free_list[out.buffer_type].push_back(out.region);
                }
            }
        }

        if (d.n_inputs > 0) {
            for_each_bit(sources(d), [&](std::uint32_t x) {
                live.clear();
                for (std::size_t o = 0; o < outputs.size(); ++o) {
                    if (outputs[o].live && outputs[o].backend == x) {
                        live.push_back(o);
                    }
                }
                // No live output: the copy reads memory outside the allocator (weights, KV).
                std::uint32_t reads = live.empty() ? 0
                                      : deterministic
                                          ? 1
                                          : 1 + rng.below(std::min<std::uint32_t>(
                                                    2, static_cast<std::uint32_t>(live.size())));
                for (std::uint32_t k = 0; k < reads; ++k) {
                    std::size_t at = deterministic ? live.size() - 1 : rng.below(
                        static_cast<std::uint32_t>(live.size()));
                    Output& out = outputs[live[at]];
                    live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
                    acc.push_back({out.region, out.buffer_type, false, true});
                    if (out.readers_left != 0 && --out.readers_left == 0) {
                        out.live = false;
                        to_free.emplace_back(out.buffer_type, out.region);
                    }
                }
            });
        }

        for_each_bit(d.buffer_types, [&](std::uint32_t bt) {
            std::uint32_t count = deterministic ? 1 : 1 + rng.below(2);
            for (std::uint32_t k = 0; k < count; ++k) {
                std::uint32_t region = alloc(bt);
                acc.push_back({region, bt, true, false});
                temps.emplace_back(bt, region);
            }
        });

        if (d.writes_read_later && d.buffer_types != 0) {
            std::uint32_t bt = static_cast<std::uint32_t>(std::countr_zero(d.buffer_types));
            if (!deterministic) {
                std::uint32_t skip = rng.below(static_cast<std::uint32_t>(
                    std::popcount(d.buffer_types)));
                std::uint64_t m = d.buffer_types;
                for (std::uint32_t k = 0; k < skip; ++k) {
                    m &= m - 1;
                }
                bt = static_cast<std::uint32_t>(std::countr_zero(m));
            }
            std::uint32_t region = alloc(bt);
            acc.push_back({region, bt, true, false});
            std::uint32_t readers = deterministic ? 1 : (rng.chance(20) ? 0 : 1 + rng.below(2));
            outputs.push_back({region, bt, d.backend, readers, true});
        }

        // gallocr frees a tensor once its last consumer is allocated: the next split may reuse.
        for (auto [bt, region] : temps) {
            free_list[bt].push_back(region);
        }
        for (auto [bt, region] : to_free) {
            free_list[bt].push_back(region);
        }
    }
}

Graph random_graph(std::uint64_t seed, const GenParams& params) {
    Rng rng(seed);
    Graph g;
    g.name = "random seed " + std::to_string(seed);
    g.n_backends = params.min_backends + rng.below(params.max_backends - params.min_backends + 1);
    const std::uint32_t n = g.n_backends;
    std::vector<bool> async(n);
    bool any_async = false;
    for (std::uint32_t x = 0; x < n; ++x) {
        async[x] = rng.chance(70);
        any_async = any_async || async[x];
    }
    if (!any_async) {
        async[rng.below(n)] = true;
    }
    const std::uint32_t host_bt = n;
    const std::uint32_t n_splits = params.min_splits + rng.below(params.max_splits -
                                                                  params.min_splits + 1);
    BackendMask produced = 0;
    std::uint32_t prev = n;
    for (std::uint32_t i = 0; i < n_splits; ++i) {
        SplitDesc d;
        std::uint32_t b = rng.below(n);
        if (b == prev && n > 1 && rng.chance(80)) { // ggml merges most same-backend neighbours
            b = (b + 1 + rng.below(n - 1)) % n;
        }
        prev = b;
        d.backend = b;
        d.backend_async = async[b];
        if (!rng.chance(5)) {
            if (rng.chance(85)) {
                d.buffer_types |= bit_of(b);
            }
            if (rng.chance(30)) {
                d.buffer_types |= bit_of(host_bt);
            }
            for (std::uint32_t t = 0; t < n; ++t) {
                if (t != b && rng.chance(10)) {
                    d.buffer_types |= bit_of(t);
                }
            }
            if (d.buffer_types == 0) {
                d.buffer_types = bit_of(b);
            }
        }
        const BackendMask candidates = produced & ~bit_of(b);
        if (candidates != 0 && rng.chance(60)) {
            for_each_bit(candidates, [&](std::uint32_t x) {
                if (rng.chance(50)) {
                    d.input_backends |= bit_of(x);
                }
            });
            if (d.input_backends == 0) {
                d.input_backends = bit_of(static_cast<std::uint32_t>(std::countr_zero(candidates)));
            }
            d.n_inputs = static_cast<std::uint32_t>(std::popcount(d.input_backends)) +
                         rng.below(3);
        } else if (rng.chance(10)) {
            d.n_inputs = 1 + rng.below(2); // graph inputs from the host: no source backend
        }
        d.input_copies_async = rng.chance(50);
        d.writes_read_later = rng.chance(60);
        if (d.writes_read_later) {
            produced |= bit_of(b);
        }
        g.splits.push_back(d);
    }
    allocate_regions(g, seed * 0x2545f4914f6cdd1dULL | 1);
    return g;
}

Graph carried_run(std::uint64_t seed, std::uint32_t n_graphs, const GenParams& params) {
    Rng rng(seed);
    Graph run = random_graph(rng.next(), params);
    run.name = "carried run seed " + std::to_string(seed);
    run.carried = true;
    run.engine_synced_end = all_backends(run.n_backends);
    std::vector<bool> async(run.n_backends, true); // a backend stays what it is across graphs
    for (const SplitDesc& d : run.splits) {
        async[d.backend] = d.backend_async;
    }
    while (run.graph_starts.size() + 1 < n_graphs) {
        Graph next = random_graph(rng.next(), params);
        if (next.n_backends != run.n_backends) {
            continue;
        }
        const auto start = static_cast<std::uint32_t>(run.splits.size());
        run.graph_starts.push_back(start);
        run.engine_synced.resize(start + 1, 0);
        if (rng.chance(50)) { // the engine read results in between: a full synchronization
            run.engine_synced[start] = all_backends(run.n_backends);
        }
        for (SplitDesc d : next.splits) {
            d.backend_async = async[d.backend];
            run.splits.push_back(d);
        }
    }
    allocate_regions(run, seed * 0x9e3779b97f4a7c15ULL | 1);
    return run;
}

SplitDesc make_split(std::uint32_t backend, bool async, BufferTypeMask bts, std::uint32_t n_inputs,
                     BackendMask from, bool copies_async, bool writes_read_later) {
    SplitDesc d;
    d.backend = backend;
    d.backend_async = async;
    d.buffer_types = bts;
    d.n_inputs = n_inputs;
    d.input_backends = from;
    d.input_copies_async = copies_async;
    d.writes_read_later = writes_read_later;
    return d;
}

Graph upstream_vulkan_input_embed() {
    constexpr std::uint32_t vulkan = 0, cpu = 1;         // backends
    constexpr BufferTypeMask vk_buf = 1, cpu_buf = 2;    // buffer types 0 and 1
    Graph g;
    g.name = "upstream: Vulkan async copy of input_embed, then input-less CPU split";
    g.n_backends = 2;
    g.splits = {
        make_split(cpu, false, cpu_buf, 0, 0, true, true),              // get_rows -> input_embed
        make_split(vulkan, true, vk_buf, 1, bit_of(cpu), true, true),   // copies input_embed, async
        make_split(cpu, false, cpu_buf),                                // no inputs, reuses its region
        make_split(vulkan, true, vk_buf, 1, bit_of(cpu), true, false),
    };
    allocate_regions(g, 0);
    return g;
}

Graph upstream_hip_shexp_deferral() {
    constexpr std::uint32_t hip = 0, cpu = 1;
    constexpr BufferTypeMask hip_buf = 1, cpu_buf = 2;
    Graph g;
    g.name = "upstream: HIP shared-expert FFN overlapping the CPU expert-dispatch wait";
    g.n_backends = 2;
    g.splits = {
        make_split(hip, true, hip_buf, 0, 0, true, true),                 // attention
        make_split(cpu, false, cpu_buf, 1, bit_of(hip), true, true),      // expert-dispatch issue
        make_split(hip, true, hip_buf, 1, bit_of(cpu), false, true),      // shexp FFN (host copy)
        make_split(cpu, false, cpu_buf, 0, 0, true, true),                // WAIT: CPU sources only
        make_split(hip, true, hip_buf, 1, bit_of(cpu), false, false),     // shexp + experts
    };
    allocate_regions(g, 0);
    return g;
}

Graph three_backends() {
    constexpr std::uint32_t vulkan = 0, cuda = 1, cpu = 2;
    constexpr BufferTypeMask vk_buf = 1, cuda_buf = 2, host_buf = 4;
    Graph g;
    g.name = "three backends: the sync of the previous backend misses the one before";
    g.n_backends = 3;
    g.splits = {
        make_split(vulkan, true, vk_buf | host_buf),
        make_split(cuda, true, cuda_buf, 1, 0, false), // graph input from the host
        make_split(cpu, false, host_buf),              // no inputs: upstream syncs CUDA only
    };
    allocate_regions(g, 0);
    return g;
}

Graph inputs_from_one_while_another_runs() {
    constexpr std::uint32_t gpu_a = 0, gpu_b = 1, cpu = 2;
    constexpr BufferTypeMask a_buf = 1, b_buf = 2, host_buf = 4;
    Graph g;
    g.name = "inputs from backend A while backend B still runs on a shared buffer type";
    g.n_backends = 3;
    g.splits = {
        make_split(gpu_b, true, b_buf | host_buf),
        make_split(gpu_a, true, a_buf, 1, 0, true, true),          // graph input, output read later
        make_split(cpu, false, host_buf, 1, bit_of(gpu_a)),        // ordered after A only
    };
    allocate_regions(g, 0);
    return g;
}

// ---------------------------------------------------------------------------------------------
// Policies

namespace {

class NoSync final : public Policy {
public:
    const char* name() const override { return "none"; }
    void begin(const Graph& g) override { n_ = g.n_backends; }
    BackendMask before_split(std::size_t) override { return 0; }
    BackendMask after_graph() override { return all_backends(n_); }

private:
    std::uint32_t n_ = 0;
};

class Always final : public Policy {
public:
    const char* name() const override { return "always"; }
    void begin(const Graph& g) override { n_ = g.n_backends; }
    BackendMask before_split(std::size_t) override { return all_backends(n_); }
    BackendMask after_graph() override { return all_backends(n_); }

private:
    std::uint32_t n_ = 0;
};

class Upstream final : public Policy {
public:
    const char* name() const override { return "upstream"; }
    void begin(const Graph& g) override { g_ = &g; }
    BackendMask before_split(std::size_t i) override {
        const SplitDesc& d = g_->splits[i];
        if (d.n_inputs == 0 && i > 0 && !g_->starts_graph(i) &&
            g_->splits[i - 1].backend != d.backend) {
            return bit_of(g_->splits[i - 1].backend);
        }
        return 0;
    }
    BackendMask after_graph() override { return all_backends(g_->n_backends); }

private:
    const Graph* g_ = nullptr;
};

class StartingRule final : public Policy {
public:
    explicit StartingRule(bool copy_footprint) : copy_footprint_(copy_footprint) {}
    const char* name() const override {
        return copy_footprint_ ? "starting+copy_footprint" : "starting";
    }
    void begin(const Graph& g) override {
        g_ = &g;
        in_flight_.assign(g.n_backends, 0);
        pending_ = 0;
        deferred_ = 0;
        exported_.assign(g.n_backends, 0);
    }
    BackendMask before_split(std::size_t i) override {
        const SplitDesc& d = g_->splits[i];
        const std::uint32_t b = d.backend;
        BufferTypeMask copy_reads = 0;
        for_each_bit(sources(d), [&](std::uint32_t x) { copy_reads |= exported_[x]; });
        const BufferTypeMask touched = d.buffer_types | (copy_footprint_ ? copy_reads : 0);
        BackendMask syncs = 0;
        // A deferred sync is performed before the next split that runs on that backend or
        // shares its buffer types.
        for_each_bit(deferred_, [&](std::uint32_t x) {
            if (x == b || (in_flight_[x] & touched) != 0) {
                syncs |= bit_of(x);
            }
        });
        // A split with inputs is ordered by its copies; an input-less one waits for every
        // in-flight backend sharing a buffer type and defers the others.
        if (d.n_inputs == 0) {
            for_each_bit(pending_ & ~bit_of(b), [&](std::uint32_t x) {
                if ((in_flight_[x] & touched) != 0) {
                    syncs |= bit_of(x);
                } else {
                    deferred_ |= bit_of(x);
                }
            });
        }
        for_each_bit(syncs, [&](std::uint32_t x) {
            in_flight_[x] = 0;
            pending_ &= ~bit_of(x);
            deferred_ &= ~bit_of(x);
        });
        if (d.backend_async) {
            pending_ |= bit_of(b);
            in_flight_[b] |= d.buffer_types |
                             (copy_footprint_ && copies_async(d) ? copy_reads : 0);
        }
        if (d.writes_read_later) {
            exported_[b] |= d.buffer_types;
        }
        return syncs;
    }
    BackendMask after_graph() override { return all_backends(g_->n_backends); }

private:
    bool copy_footprint_;
    const Graph* g_ = nullptr;
    std::vector<BufferTypeMask> in_flight_;
    std::vector<BufferTypeMask> exported_;
    BackendMask pending_ = 0;
    BackendMask deferred_ = 0;
};

class Helper final : public Policy {
public:
    explicit Helper(SplitSyncParams params) : params_(params) {}
    const char* name() const override { return "helper"; }
    void begin(const Graph& g) override {
        g_ = &g;
        failure_.clear();
        SplitSyncParams p = params_;
        p.n_backends = g.n_backends;
        auto created = SplitSync::create(p);
        if (!created) {
            failure_ = created.error().message;
            helper_.reset();
            return;
        }
        helper_ = std::make_unique<SplitSync>(std::move(created).value());
    }
    BackendMask before_split(std::size_t i) override {
        if (!helper_) {
            return all_backends(g_->n_backends);
        }
        if (g_->starts_graph(i)) {
            helper_->end_graph();
        }
        helper_->synchronized(g_->engine_synced_before(i));
        auto decision = helper_->next(g_->splits[i]);
        if (!decision) {
            if (failure_.empty()) {
                failure_ = decision.error().message;
            }
            return all_backends(g_->n_backends);
        }
        return decision.value().sync_now;
    }
    BackendMask after_graph() override {
        return helper_ ? helper_->finish() : all_backends(g_->n_backends);
    }
    std::string failure() const override { return failure_; }

private:
    SplitSyncParams params_;
    const Graph* g_ = nullptr;
    std::unique_ptr<SplitSync> helper_;
    std::string failure_;
};

} // namespace

std::unique_ptr<Policy> make_no_sync_policy() { return std::make_unique<NoSync>(); }
std::unique_ptr<Policy> make_always_policy() { return std::make_unique<Always>(); }
std::unique_ptr<Policy> make_upstream_policy() { return std::make_unique<Upstream>(); }
std::unique_ptr<Policy> make_starting_rule_policy(bool copy_footprint) {
    return std::make_unique<StartingRule>(copy_footprint);
}
std::unique_ptr<Policy> make_helper_policy(SplitSyncParams params) {
    return std::make_unique<Helper>(params);
}

// ---------------------------------------------------------------------------------------------
// The simulator

SimResult simulate(const Graph& graph, Policy& policy) {
    const std::uint32_t n = graph.n_backends;
    SimResult result;
    policy.begin(graph);

    // Vector clocks over per-backend split ordinals (1 = first split on that backend).
    std::vector<std::uint64_t> submitted(n, 0), host(n, 0), queue(std::size_t{n} * n, 0), w(n);
    auto host_sync = [&](std::uint32_t x) {
        for (std::uint32_t y = 0; y < n; ++y) {
            host[y] = std::max(host[y], queue[std::size_t{x} * n + y]);
        }
    };
    auto pending = [&](std::uint32_t x) { return submitted[x] > host[x]; };
    // Synchronizes `mask`, counting in `count` the syncs that could block.
    auto sync_counted = [&](BackendMask mask, std::uint64_t& count) {
        for_each_bit(mask & all_backends(n), [&](std::uint32_t x) {
            if (pending(x)) {
                ++count;
                host_sync(x);
            }
        });
    };

    struct Touch {
        std::uint64_t ordinal;
        std::uint32_t split;
        bool write, copy_read;
        std::uint32_t previous; // the same backend's previous touch of the region, or none
    };
    constexpr std::uint32_t none = ~std::uint32_t{0};
    std::uint32_t n_regions = 0;
    for (const auto& acc : graph.accesses) {
        for (const Access& a : acc) {
            n_regions = std::max(n_regions, a.region + 1);
        }
    }
    // latest[region * n + backend]: index in `touches` of that backend's latest touch of the
    // region; older ones follow Touch::previous (two flat vectors: the tests run this 10^5 times).
    std::vector<std::uint32_t> latest(std::size_t{n_regions} * n, none);
    std::vector<Touch> touches;
    std::vector<Hazard> found;

    for (std::size_t i = 0; i < graph.splits.size(); ++i) {
        const SplitDesc& d = graph.splits[i];
        const std::uint32_t b = d.backend;
        sync_counted(graph.engine_synced_before(i), result.engine_own_syncs);
        const BackendMask mask = policy.before_split(i) & all_backends(n);
        result.sync_masks.push_back(mask);
        sync_counted(mask, result.blocking_syncs);
        const bool async_copies = copies_async(d);
        if (d.n_inputs > 0 && !async_copies) { // the engine's fallback copy
            sync_counted(sources(d) | bit_of(b), result.engine_syncs);
        }
        std::copy(host.begin(), host.end(), w.begin());
        auto merge = [&](std::uint32_t x) {
            for (std::uint32_t y = 0; y < n; ++y) {
                w[y] = std::max(w[y], queue[std::size_t{x} * n + y]);
            }
        };
        merge(b);
        if (async_copies) {
            for_each_bit(sources(d), merge);
        }

        // Hazards: an earlier touch of the same region on another backend not ordered before
        // this split. Host reads (fallback copies) are checked with the same clock: the host
        // made it so before reading.
        found.clear();
        static const std::vector<Access> untouched;
        const auto& acc = i < graph.accesses.size() ? graph.accesses[i] : untouched;
        for (const Access& a : acc) {
            for (std::uint32_t x = 0; x < n; ++x) {
                if (x == b) {
                    continue; // the backend's own queue orders it
                }
                for (std::uint32_t t = latest[std::size_t{a.region} * n + x];
                     t != none && touches[t].ordinal > w[x]; t = touches[t].previous) {
                    const Touch* it = &touches[t];
                    Hazard hz;
                    hz.earlier = it->split;
                    hz.later = static_cast<std::uint32_t>(i);
                    hz.region = a.region;
                    hz.buffer_type = a.buffer_type;
                    hz.involves_copy_read = a.copy_read || it->copy_read;
                    hz.later_has_inputs = d.n_inputs > 0;
                    hz.read_read = !a.write && !it->write;
                    found.push_back(hz);
                }
            }
        }
        std::stable_sort(found.begin(), found.end(),
                         [](const Hazard& l, const Hazard& r) { return l.earlier < r.earlier; });
        for (std::size_t k = 0; k < found.size(); ++k) {
            if (k == 0 || found[k].earlier != found[k - 1].earlier) {
                ++result.hazards;
                result.hazard_list.push_back(found[k]);
            } else {
                Hazard& first = result.hazard_list.back();
                first.read_read = first.read_read && found[k].read_read;
                first.involves_copy_read = first.involves_copy_read || found[k].involves_copy_read;
            }
        }

        // Submit.
        const std::uint64_t ordinal = ++submitted[b];
        w[b] = ordinal;
        std::copy(w.begin(), w.end(), queue.begin() + static_cast<std::ptrdiff_t>(b) * n);
        if (!d.backend_async) {
            host_sync(b);
        }
        for (const Access& a : acc) {
            if (a.copy_read && !async_copies) {
                continue; // read on the host before the submit: finished before anything later
            }
            std::uint32_t& head = latest[std::size_t{a.region} * n + b];
            touches.push_back({ordinal, static_cast<std::uint32_t>(i), a.write, a.copy_read, head});
            head = static_cast<std::uint32_t>(touches.size() - 1);
        }
        ++result.splits;
    }

    result.end_mask = (graph.carried ? 0 : policy.after_graph()) & all_backends(n);
    sync_counted(result.end_mask, result.drain_syncs);
    sync_counted(graph.engine_synced_end, result.engine_own_syncs);
    for (std::uint32_t x = 0; x < n && !graph.carried; ++x) { // a carried run is the engine's
        if (pending(x)) {
            ++result.missed_drains;
        }
    }
    result.policy_failure = policy.failure();
    return result;
}

std::vector<std::pair<std::uint32_t, std::uint32_t>>
timed_overlaps(const Graph& graph, const SimResult& result, std::uint64_t seed) {
    const std::uint32_t n = graph.n_backends;
    Rng rng(seed);
    std::vector<std::uint64_t> idle_at(n, 0); // when each backend's queue runs dry
    std::uint64_t host_t = 0;
    struct Span {
        std::uint64_t start, end;
        std::uint32_t split;
    };
    std::vector<std::vector<Span>> by_region;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> overlaps;

    for (std::size_t i = 0; i < graph.splits.size(); ++i) {
        const SplitDesc& d = graph.splits[i];
        const std::uint32_t b = d.backend;
        for_each_bit(result.sync_masks[i], [&](std::uint32_t x) {
            host_t = std::max(host_t, idle_at[x]);
        });
        const bool async_copies = copies_async(d);
        std::uint64_t read_start = 0, read_end = 0;
        if (d.n_inputs > 0 && !async_copies) {
            for_each_bit(sources(d) | bit_of(b), [&](std::uint32_t x) {
                host_t = std::max(host_t, idle_at[x]);
            });
            read_start = host_t;
            host_t += 1 + rng.below(5);
            read_end = host_t;
        }
        std::uint64_t start = std::max(host_t, idle_at[b]);
        if (async_copies) { // the event waits: all work submitted so far to the input backends
            for_each_bit(sources(d), [&](std::uint32_t x) { start = std::max(start, idle_at[x]); });
        }
        const std::uint64_t duration =
            1 + rng.below(d.backend_async && rng.chance(25) ? 5000 : 100);
        const std::uint64_t end = start + duration;
        idle_at[b] = end;
        host_t = d.backend_async ? host_t + 1 : end + 1; // submit cost, or the whole run

        for (const Access& a : graph.accesses[i]) {
            Span s = (a.copy_read && !async_copies)
                         ? Span{read_start, read_end, static_cast<std::uint32_t>(i)}
                         : Span{start, end, static_cast<std::uint32_t>(i)};
            if (by_region.size() <= a.region) {
                by_region.resize(a.region + 1);
            }
            for (const Span& e : by_region[a.region]) {
                if (e.split != s.split && e.start < s.end && s.start < e.end) {
                    overlaps.emplace_back(e.split, s.split);
                }
            }
            by_region[a.region].push_back(s);
        }
    }
    std::sort(overlaps.begin(), overlaps.end());
    overlaps.erase(std::unique(overlaps.begin(), overlaps.end()), overlaps.end());
    return overlaps;
}

void RuleTotals::add(const SimResult& r) {
    ++graphs;
    splits += r.splits;
    blocking_syncs += r.blocking_syncs;
    hazards += r.hazards;
    graphs_with_hazards += r.hazards != 0 ? 1 : 0;
    missed_drains += r.missed_drains;
    failures += r.policy_failure.empty() ? 0 : 1;
}

} // namespace wm::testkit::sim
