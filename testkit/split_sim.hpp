// SPDX-License-Identifier: MIT
// split_sim.hpp - a simulator that runs split sequences on virtual asynchronous backends and
// finds every memory hazard, plus the seeded random graphs it is run on. Shared by
// test_split_sync, bench_split_sync and fuzz_split_sync; not part of the library.
//
// The model (the same engine model split_sync.hpp documents):
//  - each backend is an in-order queue; a synchronous backend finishes a split before the
//    submit returns; a sync blocks the host until a backend's submitted work is done;
//  - input copies: async ones make the split's backend wait for all work submitted so far to
//    its input backends and then read the source memory on that backend; fallback ones block
//    the host on the input backends and the split's own backend and read on the host;
//  - a graph allocator (allocate_regions) hands each split regions of its buffer types, reusing
//    regions freed by earlier splits of the same buffer type (temporaries when the split ends,
//    outputs once their last reader copied them).
// A hazard is two accesses to one region by different splits on different backends (or the
// host) that are not ordered by a chain of queue order, event waits and host syncs: with a slow
// enough device they overlap. The simulator tracks that order exactly with vector clocks, so it
// reports every hazard any timing could produce; timed_overlaps() runs one concrete timing as an
// independent cross-check.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "weightmap/split_sync.hpp"

namespace wm::testkit::sim {

/// splitmix64: a tiny PRNG with the same stream on every compiler and standard library.
class Rng {
public:
    explicit Rng(std::uint64_t seed) : state_(seed) {}
    std::uint64_t next();
    /// Uniform in [0, bound); bound > 0.
    std::uint32_t below(std::uint32_t bound);
    /// True with probability percent / 100.
    bool chance(std::uint32_t percent) { return below(100) < percent; }

private:
    std::uint64_t state_;
};

/// One touch of one allocator region by a split.
struct Access {
    std::uint32_t region = 0;      ///< region id, unique within the graph
    std::uint32_t buffer_type = 0; ///< the buffer type the region belongs to
    bool write = false;            ///< written (temporaries, outputs) or only read (copy sources)
    bool copy_read = false;        ///< read by the split's input copy (another split's output)
};

struct Graph {
    std::string name;
    std::uint32_t n_backends = 0;
    std::vector<SplitDesc> splits;
    std::vector<std::vector<Access>> accesses; ///< per split; filled by allocate_regions
    /// A run of several engine graphs (a trace of ggml's scheduler): the indices of the splits
    /// that start a later engine graph, ascending. The allocator hands each engine graph the same
    /// buffers again; a policy ends the graph before without a drain (SplitSync::end_graph).
    std::vector<std::uint32_t> graph_starts;
    /// Per split, or empty: backends the engine synchronized itself just before the split,
    /// outside any policy (ggml_backend_sched_synchronize before reading results, its sync of
    /// the split's own backend before input copies). Policies are told.
    std::vector<BackendMask> engine_synced;
    /// True when the run's engine graphs end without a drain and the engine's own
    /// synchronization after the last split (engine_synced_end) ends the run; false: the
    /// policy's after_graph() drains, as for one graph.
    bool carried = false;
    BackendMask engine_synced_end = 0;

    bool starts_graph(std::size_t split) const;
    BackendMask engine_synced_before(std::size_t split) const {
        return split < engine_synced.size() ? engine_synced[split] : 0;
    }
};

struct GenParams {
    std::uint32_t min_backends = 2;
    std::uint32_t max_backends = 4;
    std::uint32_t min_splits = 1;
    std::uint32_t max_splits = 64;
};

/// A seeded random graph: 2-4 backends (each async with p = 0.7, at least one), buffer types
/// 0..n-1 (one per backend) plus n (a shared host type), 1-64 splits on random backends, random
/// inputs from backends that produced outputs, random copy modes and buffer-type sets
/// (empty with p = 0.05). Regions are allocated with allocate_regions(seed).
Graph random_graph(std::uint64_t seed, const GenParams& params = {});

/// `n_graphs` random graphs of one backend count (each backend keeps its async flag) run as the
/// patched ggml scheduler runs them: each ended without a drain and carried into the next,
/// with a full engine synchronization before half of the later graphs (the engine read
/// results) and after the last. Regions from allocate_regions(seed-derived).
Graph carried_run(std::uint64_t seed, std::uint32_t n_graphs, const GenParams& params = {});

/// The graph allocator. Walks the splits in order: each split reads (copies) 1-2 live outputs
/// of each input backend, writes 1-2 temporaries per buffer type and, when writes_read_later,
/// one output; temporaries are freed when the split ends, outputs after their last reader.
/// A free region of the right type is reused with p = 0.85 (seed != 0: a random one; seed == 0:
/// deterministic, always the most recently freed, one temporary per type and one reader per
/// output, as in the named cases).
void allocate_regions(Graph& graph, std::uint64_t seed);

/// The upstream race (ggml #26040): Vulkan async copies `input_embed` from a CPU buffer, the next
/// CPU split has no inputs and is handed the same CPU region.
Graph upstream_vulkan_input_embed();
/// The upstream deferred sync: HIP shared-expert FFN (fallback copies from the host), then the
/// CPU expert-dispatch WAIT with no inputs and only CPU buffers, then a HIP split using both.
Graph upstream_hip_shexp_deferral();
/// Three backends: the input-less CPU split after CUDA reuses a region Vulkan (two splits back)
/// still uses; the upstream rule only syncs the previous backend.
Graph three_backends();
/// A split with inputs from backend A while backend B still runs and shares its buffer type:
/// its copies order it after A only.
Graph inputs_from_one_while_another_runs();

/// Decides the syncs of one run; the simulator asks it before every split and at the end.
/// A policy sees the graph's engine graphs and engine syncs through the Graph it is given.
class Policy {
public:
    virtual ~Policy() = default;
    virtual const char* name() const = 0;
    virtual void begin(const Graph& graph) = 0;
    /// Backends to synchronize before split `index` starts (before its input copies).
    virtual BackendMask before_split(std::size_t index) = 0;
    /// Backends to synchronize after the last split (not asked of a carried run).
    virtual BackendMask after_graph() = 0;
    /// Empty unless the policy failed (the helper returned an error).
    virtual std::string failure() const { return {}; }
};

std::unique_ptr<Policy> make_no_sync_policy();
/// Before every split, synchronize every backend (full serialization).
std::unique_ptr<Policy> make_always_policy();
/// ggml #26040: a split without inputs synchronizes the previous split's backend if different.
std::unique_ptr<Policy> make_upstream_policy();
/// The starting rule, tracked from the host's view: a split with inputs is ordered by
/// its copies; an input-less split syncs every in-flight backend that shares a buffer type with
/// it and defers the others until the next split that runs on them or shares their buffer types.
/// copy_footprint: also count the copies' source buffer types (as the helper does).
std::unique_ptr<Policy> make_starting_rule_policy(bool copy_footprint);
/// wm::SplitSync, incremental form.
std::unique_ptr<Policy> make_helper_policy(SplitSyncParams params = {});

struct Hazard {
    std::uint32_t earlier = 0;      ///< split index (earlier in execution order)
    std::uint32_t later = 0;        ///< split index
    std::uint32_t region = 0;
    std::uint32_t buffer_type = 0;
    bool involves_copy_read = false;
    bool later_has_inputs = false;
    bool read_read = false;         ///< both accesses reads (two copies of one output)
};

struct SimResult {
    std::uint64_t splits = 0;
    /// Policy syncs that could block: on an async backend with work the host did not know
    /// finished. Syncs of idle or synchronous backends are free and not counted.
    std::uint64_t blocking_syncs = 0;
    /// The engine's own fallback-copy syncs that could block (same for every policy).
    std::uint64_t engine_syncs = 0;
    /// End-of-graph syncs that could block.
    std::uint64_t drain_syncs = 0;
    /// The engine's own syncs (Graph::engine_synced, engine_synced_end) that could block.
    std::uint64_t engine_own_syncs = 0;
    /// Pairs (earlier split, later split) with at least one unordered access to a shared region.
    std::uint64_t hazards = 0;
    /// Async backends still running after the policy's end-of-graph syncs.
    std::uint64_t missed_drains = 0;
    std::vector<Hazard> hazard_list;            ///< one per hazard, flags merged over its accesses
    std::vector<BackendMask> sync_masks;        ///< what the policy asked, per split
    BackendMask end_mask = 0;
    std::string policy_failure;
};

SimResult simulate(const Graph& graph, Policy& policy);

/// One concrete timing of the run `result` recorded (its sync masks), with random split
/// durations: the (earlier, later) split pairs whose accesses to a region overlap in time.
/// Every such pair must be a hazard simulate() reported.
std::vector<std::pair<std::uint32_t, std::uint32_t>>
timed_overlaps(const Graph& graph, const SimResult& result, std::uint64_t seed);

/// Per-rule totals over many graphs (the benchmark's lines).
struct RuleTotals {
    std::uint64_t graphs = 0;
    std::uint64_t splits = 0;
    std::uint64_t blocking_syncs = 0;
    std::uint64_t hazards = 0;
    std::uint64_t graphs_with_hazards = 0;
    std::uint64_t missed_drains = 0;
    std::uint64_t failures = 0;
    void add(const SimResult& r);
    double syncs_per_1k() const {
        return splits == 0 ? 0.0 : 1000.0 * static_cast<double>(blocking_syncs) /
                                       static_cast<double>(splits);
    }
};

/// The seeds of the standard corpus: graph i uses corpus_seed(i).
std::uint64_t corpus_seed(std::uint64_t index);
inline constexpr std::uint64_t corpus_size = 10000;

/// A SplitDesc in one call, for named cases and tests.
SplitDesc make_split(std::uint32_t backend, bool async, BufferTypeMask bts, std::uint32_t n_inputs = 0,
                     BackendMask from = 0, bool copies_async = true, bool writes_read_later = false);

} // namespace wm::testkit::sim
