// SPDX-License-Identifier: MIT
// split_sync.hpp - which graph splits must synchronize before they start.
//
// A ggml-style scheduler runs a graph as splits, each on one backend. Asynchronous backends
// (Vulkan, CUDA, HIP) return before their work is done, and the graph allocator hands memory a
// finished split no longer needs to a later split of the same buffer type. A later split that
// starts while an earlier one on another backend still touches such a region races with it
// (upstream ggml #26040: Vulkan still reading `input_embed` while a CPU split overwrote it).
//
// This helper answers, per split and before it starts, which backends the host must synchronize
// now and which syncs it may defer; at the end of a graph, either which backends must be drained
// (finish()) or nothing: the work in flight is carried into the next graph (end_graph()). It is
// pure: no OS call, no global state, no allocation after create() except for an error's message.
// Its rule is proven race-free by the simulator in testkit/split_sim.cpp over 10,000 seeded
// random graphs and 2,000 carried runs; docs/split_sync.md states the rule and the hazards that
// shaped it.
//
// Model of the engine the answers are valid for (the ggml scheduler's own behaviour):
//  - a backend runs its splits in submission order (one in-order queue per backend);
//  - a synchronous backend has finished its split when the submit call returns;
//  - "synchronize backend X" blocks the host until all work submitted to X has finished;
//  - input copies with SplitDesc::input_copies_async on an asynchronous backend make the split's
//    backend wait (device-side, ggml_backend_event_wait) for all work submitted so far to each
//    backend in SplitDesc::input_backends, then read the source tensors on the split's backend;
//  - other input copies are ggml's fallback: the host synchronizes each input backend and the
//    split's own backend, then copies on the host (ggml_backend_tensor_copy).
#pragma once

#include <cstdint>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/result.hpp"
#include "weightmap/span.hpp"

namespace wm {

/// A set of backend ids: bit b stands for backend b. Backend ids are the engine's own indices
/// (ggml: the scheduler's backend_id), 0 <= id < SplitSyncParams::n_backends.
using BackendMask = std::uint64_t;

/// A set of buffer types: bit t stands for buffer type t. Ids are the engine's own (ggml: index
/// of the ggml_backend_buffer_type_t); any of the 64 bits may be used.
using BufferTypeMask = std::uint64_t;

/// Most backends one helper tracks (the width of BackendMask). ggml allows 16.
inline constexpr std::uint32_t split_sync_max_backends = 64;

/// Describes one split, as the engine knows it just before the split starts. Plain data, owned
/// by the caller and only read during the call it is passed to.
struct SplitDesc {
    /// The backend the split runs on. Must be < SplitSyncParams::n_backends.
    std::uint32_t backend = 0;

    /// True when the backend returns before the split's work is done (Vulkan, CUDA, HIP, Metal).
    /// Must be the same for every split of one backend within a graph.
    bool backend_async = false;

    /// Number of input tensors the engine copies to the split's backend before it runs.
    std::uint32_t n_inputs = 0;

    /// Backends the input copies read from (where the source tensors were produced). Must be a
    /// subset of the valid backends and empty when n_inputs == 0; may hold at most n_inputs
    /// backends other than `backend` (the split's own backend, if present, is ignored: same-
    /// backend data needs no copy). Inputs from the host (graph inputs) add no backend.
    /// An input copy orders the split only after these backends, never after the others: this
    /// is why a split with inputs can still race (docs/split_sync.md, "the strengthened rule").
    BackendMask input_backends = 0;

    /// True when the split's backend copies the inputs asynchronously, i.e. it may still be
    /// reading the source memory after the submit returned (Vulkan from host memory, CUDA from
    /// another CUDA device). False when the engine takes ggml's fallback path: it synchronizes
    /// the input backends and the split's own backend and copies on the host (CUDA/HIP from
    /// host memory). Ignored when backend_async is false (a synchronous backend's copies are
    /// done when it returns). Default true: the safe assumption.
    bool input_copies_async = true;

    /// Buffer types the memory of the split's own tensors lives in: what the graph allocator can
    /// hand to another split. Empty is allowed (the split touches no allocator memory).
    BufferTypeMask buffer_types = 0;

    /// True when the split writes memory that a later split reads through its input copies
    /// (the split's outputs). The helper then counts this split's buffer types as touched by
    /// every later split that copies inputs from this backend: the copy reads them, on the
    /// copying backend's timeline (the upstream Vulkan `input_embed` race). Ordering the read
    /// after the write is the engine's job (the copy's event wait or host sync).
    bool writes_read_later = false;
};

/// Creation parameters.
struct SplitSyncParams {
    /// Number of backends the scheduler has. 1..split_sync_max_backends.
    std::uint32_t n_backends = 0;

    /// Upstream's HIP graph capture wants a backend drained before it is used again once its
    /// sync was deferred. When true, a backend reported in SplitSyncDecision::deferred is
    /// synchronized before the next split that runs on it. Memory safety does not need it (the
    /// simulator finds no hazard without it); it costs blocking syncs. Default false.
    bool sync_deferred_before_reuse = false;
};

/// The answer for one split. Plain data.
struct SplitSyncDecision {
    /// Backends the host must synchronize (block on until all their submitted work is done)
    /// before starting the split, in any order. Only asynchronous backends with work that may
    /// still run are listed; never the split's own backend unless sync_deferred_before_reuse.
    BackendMask sync_now = 0;

    /// Asynchronous backends other than the split's that may still run while it runs: their
    /// sync is deferred. It will be listed in the sync_now of a later split that would race with
    /// them, or in the drain returned by SplitSync::finish() (with end_graph(): in a later
    /// graph's split that would race with them, or never, once the engine synchronized them).
    BackendMask deferred = 0;
};

/// Whole-graph answer: one decision per split, in execution order, and the drain.
struct SplitSyncPlan {
    std::vector<SplitSyncDecision> splits;
    /// Backends the host must synchronize after the last split before the allocator reuses the
    /// graph's memory (the next graph) or the outputs are read. Synchronizing them finishes all
    /// the graph's work: a backend left out has provably finished (ordered before one listed).
    BackendMask drain = 0;
};

/// Incremental form, called once per split from the scheduler loop.
///
/// Thread-safety: an object is not thread-safe; distinct objects are independent.
/// Cost per split: O(n_backends * buffer types in the split), O(n_backends^2) on a split that
/// syncs; with 2-4 backends about 60 ns hot, 90-130 ns walking bench_split_sync's cold corpus.
/// No allocation after create() unless next() fails.
class WM_API SplitSync {
public:
    /// Fails with invalid_argument when params.n_backends is 0 or above split_sync_max_backends.
    static Result<SplitSync> create(const SplitSyncParams& params);

    /// The decision for the next split of the current graph. The caller must synchronize
    /// `sync_now` before starting the split, and start the split, before the next call.
    /// Fails with invalid_argument (message names the split index, field and numbers) when the
    /// description breaks a SplitDesc constraint; the state is then unchanged and the split is
    /// not counted, so the caller may correct it and call again, or reset().
    Result<SplitSyncDecision> next(const SplitDesc& split);

    /// Ends the graph: returns the backends to synchronize now (SplitSyncPlan::drain). The
    /// caller must synchronize them before the next graph's first split; the helper then
    /// assumes every submitted split has finished and starts a new graph. Never fails.
    /// A scheduler that overlaps graphs calls end_graph() instead.
    BackendMask finish() noexcept;

    /// Ends the graph without a drain: the work still in flight is carried into the next graph,
    /// whose splits are synchronized against it where they share a buffer type (the graph
    /// allocator hands the next graph the same buffers), so no graph waits for more than its
    /// own hazards. For an engine that synchronizes everything itself before it reads results
    /// (ggml_backend_sched_synchronize) and reports that through synchronized(): a drain at
    /// the end of every graph cost ggml one blocking sync per token and removed the overlap
    /// of pipeline parallelism (docs/split_sync.md). Never fails.
    void end_graph() noexcept;

    /// The engine synchronized `backends` itself, outside the helper's answers (a full
    /// synchronization before reading results, or before reallocating the graph's buffers):
    /// the host knows all their submitted work finished, and what they waited for. Bits at or
    /// above n_backends are ignored. Never fails; may be called between graphs or splits.
    void synchronized(BackendMask backends) noexcept;

    /// Backends with submitted work the host does not know finished: what a full
    /// synchronization would wait for (finish() drains a subset of them that covers the rest).
    BackendMask in_flight() const noexcept;

    /// Forgets everything, as if freshly created (use after an aborted graph once the engine
    /// has synchronized all backends).
    void reset() noexcept;

    /// Number of splits accepted by next() in the current graph.
    std::uint64_t splits_in_graph() const noexcept { return graph_splits_; }

    const SplitSyncParams& params() const noexcept { return params_; }

private:
    explicit SplitSync(const SplitSyncParams& params);

    std::uint64_t& queue_clock(std::uint32_t backend, std::uint32_t of) noexcept {
        return queue_clock_[std::size_t{backend} * params_.n_backends + of];
    }
    std::uint64_t& last_touch(std::uint32_t backend, std::uint32_t buffer_type) noexcept {
        return last_touch_[std::size_t{backend} * 64 + buffer_type];
    }

    // The steps of next() and finish(), defined in split_sync.cpp, their only caller. Declared
    // inline on purpose: inline members are hidden (-fvisibility-inlines-hidden), so they are not
    // exported, and GCC inlines them; an exported member would be interposable under -fPIC and
    // stay a call, and these steps are the per-split cost.
    inline void host_sync(std::uint32_t backend) noexcept;
    inline void order_work_clock(std::uint32_t backend, BackendMask waited_on) noexcept;
    inline bool drain_before_reuse(std::uint32_t backend) noexcept;
    inline BackendMask conflicts(std::uint32_t backend, BufferTypeMask touched) const noexcept;
    inline BackendMask sync_conflicts(std::uint32_t backend, BufferTypeMask touched) noexcept;
    inline std::uint32_t covering_most(BackendMask backends, const std::uint64_t* need) noexcept;
    inline void submit(const SplitDesc& split, BufferTypeMask in_flight) noexcept;
    inline BackendMask unordered_async(std::uint32_t backend) const noexcept;

    SplitSyncParams params_;
    std::uint64_t graph_splits_ = 0;
    // Vector clocks, in per-backend split ordinals (1 = first split ever on that backend):
    // submitted_[x]: splits submitted to x; host_clock_[x]: how many of them the host knows have
    // finished; queue_clock_[x][y]: how many of y's splits x's latest split waited for;
    // work_clock_: scratch for the split being decided.
    std::vector<std::uint64_t> submitted_;
    std::vector<std::uint64_t> host_clock_;
    std::vector<std::uint64_t> queue_clock_;
    std::vector<std::uint64_t> work_clock_;
    // last_touch_[x][t]: ordinal of x's latest split that touched buffer type t while in flight.
    std::vector<std::uint64_t> last_touch_;
    std::vector<BufferTypeMask> exported_;  // buffer types of x's splits that writes_read_later
    std::vector<std::uint8_t> async_state_; // 0 unseen in this graph, 1 synchronous, 2 async
    BackendMask deferred_outstanding_ = 0;  // reported deferred and not synchronized since
};

/// Whole-graph form: the decisions for `splits` in execution order plus the drain. Equal to
/// calling SplitSync::next for each split and finish() on a fresh object.
/// Fails like SplitSync::create and SplitSync::next (the message names the failing split).
/// Thread-safe (reentrant).
WM_API Result<SplitSyncPlan> plan_split_sync(const SplitSyncParams& params,
                                      Span<const SplitDesc> splits);

} // namespace wm
