// SPDX-License-Identifier: MIT
// The split-ordering helper: vector clocks over per-backend split ordinals.
//
// Why vector clocks and not "in flight since the last sync": an input copy orders a split after
// its input backends only (ggml_backend_event_wait), so whether an earlier split can still run
// depends on the chain of waits, not on the host's view alone. The starting rule, which
// trusts a split with inputs to be ordered, raced in 5,985 of the simulator's 10,000 random
// graphs (docs/split_sync.md); tracking the waits also lets an event wait replace a sync.
#include "weightmap/split_sync.hpp"

#include <algorithm>
#include <bit>
#include <optional>

#include <fmt/format.h>

namespace wm {

namespace {

constexpr BackendMask bit_of(std::uint32_t index) noexcept { return BackendMask{1} << index; }

constexpr BackendMask valid_backends(std::uint32_t n) noexcept {
    return n >= 64 ? ~BackendMask{0} : bit_of(n) - 1;
}

template <class F>
void for_each_bit(std::uint64_t mask, F&& f) {
    while (mask != 0) {
        f(static_cast<std::uint32_t>(std::countr_zero(mask)));
        mask &= mask - 1;
    }
}

// popcount(mask) > limit, without a libgcc call on targets lacking a popcount instruction.
bool more_bits_than(std::uint64_t mask, std::uint32_t limit) noexcept {
    for (std::uint32_t i = 0; i <= limit; ++i) {
        if (mask == 0) {
            return false;
        }
        mask &= mask - 1;
    }
    return true;
}

// a[i] = max(a[i], b[i]) over 1-64 entries. Plain loops on purpose: std::copy of these short
// clocks compiled to memmove calls that took 17% of next() in perf.
inline void merge_clock(std::uint64_t* a, const std::uint64_t* b, std::uint32_t n) noexcept {
    for (std::uint32_t i = 0; i < n; ++i) {
        a[i] = a[i] < b[i] ? b[i] : a[i];
    }
}

// Why `split` breaks a SplitDesc constraint, or nothing. `index` is the split's index in the
// graph and known_async the helper's async_state_ (0 unseen, 1 synchronous, 2 asynchronous).
std::optional<Error> check_split(const SplitDesc& split, std::uint32_t n, std::uint64_t index,
                                 const std::uint8_t* known_async) {
    const std::uint32_t b = split.backend;
    if (b >= n) {
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("split_sync: split {}: backend = {} out of range "
                                      "(n_backends = {})", index, b, n));
    }
    if ((split.input_backends & ~valid_backends(n)) != 0) {
        return make_error(
            ErrorKind::invalid_argument,
            fmt::format("split_sync: split {}: input_backends = {:#x} names backend {} "
                        "(n_backends = {})", index, split.input_backends,
                        std::countr_zero(split.input_backends & ~valid_backends(n)), n));
    }
    if (split.n_inputs == 0 && split.input_backends != 0) {
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("split_sync: split {}: n_inputs = 0 but input_backends = "
                                      "{:#x}", index, split.input_backends));
    }
    const BackendMask sources = split.input_backends & ~bit_of(b);
    if (more_bits_than(sources, split.n_inputs)) {
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("split_sync: split {}: input_backends = {:#x} names {} "
                                      "other backends but n_inputs = {}", index,
                                      split.input_backends, std::popcount(sources),
                                      split.n_inputs));
    }
    const std::uint8_t state = split.backend_async ? 2 : 1;
    if (known_async[b] != 0 && known_async[b] != state) {
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("split_sync: split {}: backend {} has backend_async = {} "
                                      "but an earlier split of this graph said {}",
                                      index, b, split.backend_async, !split.backend_async));
    }
    return std::nullopt;
}

} // namespace

SplitSync::SplitSync(const SplitSyncParams& params)
    : params_(params), submitted_(params.n_backends, 0), host_clock_(params.n_backends, 0),
      queue_clock_(std::size_t{params.n_backends} * params.n_backends, 0),
      work_clock_(params.n_backends, 0), last_touch_(std::size_t{params.n_backends} * 64, 0),
      exported_(params.n_backends, 0), async_state_(params.n_backends, 0) {}

Result<SplitSync> SplitSync::create(const SplitSyncParams& params) {
    if (params.n_backends == 0 || params.n_backends > split_sync_max_backends) {
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("split_sync: n_backends = {}, must be 1..{}",
                                      params.n_backends, split_sync_max_backends));
    }
    return SplitSync(params);
}

Result<SplitSyncDecision> SplitSync::next(const SplitDesc& split) {
    // Validation first: on failure nothing below has run, so the state is unchanged.
    if (std::optional<Error> invalid =
            check_split(split, params_.n_backends, graph_splits_, async_state_.data())) {
        return std::move(*invalid);
    }
    const std::uint32_t b = split.backend;
    const BackendMask sources = split.input_backends & ~bit_of(b);
    const bool has_inputs = split.n_inputs > 0;
    const bool copies_async = has_inputs && split.backend_async && split.input_copies_async;
    SplitSyncDecision decision;

    // The engine's own copy fallback blocks on the input backends and on the split's backend
    // before copying on the host (ggml_backend_sched_compute_splits); the host then knows them
    // finished. Those syncs are the engine's, not ours: not reported.
    if (has_inputs && !copies_async) {
        for_each_bit(sources, [this](std::uint32_t x) { host_sync(x); });
        host_sync(b);
    }

    // The copies read the outputs of the input backends' splits (their buffer types), on the
    // split's backend (async copies) or on the host just before it (fallback).
    BufferTypeMask copy_reads = 0;
    for_each_bit(sources, [&](std::uint32_t x) { copy_reads |= exported_[x]; });
    const BufferTypeMask touched = split.buffer_types | copy_reads;

    order_work_clock(b, copies_async ? sources : 0);
    if (drain_before_reuse(b)) {
        decision.sync_now |= bit_of(b);
    }
    decision.sync_now |= sync_conflicts(b, touched);

    // While in flight the split touches its own memory and, with async copies, the copies'
    // sources; fallback copies finished on the host before the submit.
    submit(split, split.buffer_types | (copies_async ? copy_reads : 0));

    decision.deferred = unordered_async(b);
    deferred_outstanding_ |= decision.deferred;
    ++graph_splits_;
    return decision;
}

// The host has synchronized `x`: it knows everything x's latest split waited for.
inline void SplitSync::host_sync(std::uint32_t x) noexcept {
    merge_clock(host_clock_.data(), &queue_clock(x, 0), params_.n_backends);
    deferred_outstanding_ &= ~bit_of(x);
}

// What the split is ordered after: the host's knowledge when it is submitted, its own queue,
// and, through the copies' event waits, everything submitted to the backends in `waited_on`.
inline void SplitSync::order_work_clock(std::uint32_t b, BackendMask waited_on) noexcept {
    const std::uint32_t n = params_.n_backends;
    std::uint64_t* w = work_clock_.data();
    for (std::uint32_t y = 0; y < n; ++y) {
        w[y] = host_clock_[y];
    }
    merge_clock(w, &queue_clock(b, 0), n);
    for_each_bit(waited_on, [&](std::uint32_t x) { merge_clock(w, &queue_clock(x, 0), n); });
}

// sync_deferred_before_reuse: a backend reported deferred is synchronized before its next split
// while it still has work in flight. Returns whether it was.
inline bool SplitSync::drain_before_reuse(std::uint32_t b) noexcept {
    if (!params_.sync_deferred_before_reuse || (deferred_outstanding_ & bit_of(b)) == 0 ||
        submitted_[b] <= host_clock_[b]) {
        return false;
    }
    host_sync(b);
    merge_clock(work_clock_.data(), &queue_clock(b, 0), params_.n_backends);
    return true;
}

// Backends other than b with a split not ordered before this one (per work_clock_) that
// touched one of `touched` while in flight.
inline BackendMask SplitSync::conflicts(std::uint32_t b, BufferTypeMask touched) const noexcept {
    BackendMask result = 0;
    for (std::uint32_t x = 0; x < params_.n_backends; ++x) {
        if (x == b || submitted_[x] <= work_clock_[x]) {
            continue;
        }
        const std::uint64_t* touch = &last_touch_[std::size_t{x} * 64];
        for (std::uint64_t m = touched; m != 0; m &= m - 1) {
            if (touch[std::countr_zero(m)] > work_clock_[x]) {
                result |= bit_of(x);
                break;
            }
        }
    }
    return result;
}

// Syncs until no unordered in-flight split on another backend shares a buffer type with this
// one; returns the backends synchronized. Greedy: sync the backend whose completion also
// finishes the most other conflicting backends (its latest split waited on them), so a chain
// X -> Y costs one sync, not two.
inline BackendMask SplitSync::sync_conflicts(std::uint32_t b, BufferTypeMask touched) noexcept {
    BackendMask synced = 0;
    for (BackendMask conflict = conflicts(b, touched); conflict != 0;
         conflict = conflicts(b, touched)) {
        std::uint64_t need[split_sync_max_backends];
        for_each_bit(conflict, [&](std::uint32_t y) {
            std::uint64_t latest = 0;
            for_each_bit(touched, [&](std::uint32_t t) {
                latest = std::max(latest, last_touch(y, t));
            });
            need[y] = latest;
        });
        const std::uint32_t best = covering_most(conflict, need);
        host_sync(best);
        synced |= bit_of(best);
        merge_clock(work_clock_.data(), host_clock_.data(), params_.n_backends);
    }
    return synced;
}

// The backend x of `backends` whose latest split waited for need[y] splits of the most backends
// y of `backends`, the lowest on ties: synchronizing it finishes those too.
inline std::uint32_t SplitSync::covering_most(BackendMask backends,
                                              const std::uint64_t* need) noexcept {
    std::uint32_t best = 0;
    int best_covered = -1;
    for_each_bit(backends, [&](std::uint32_t x) {
        int covered = 0;
        for_each_bit(backends, [&](std::uint32_t y) {
            covered += queue_clock(x, y) >= need[y] ? 1 : 0;
        });
        if (covered > best_covered) {
            best_covered = covered;
            best = x;
        }
    });
    return best;
}

// Submits the split, ordered after work_clock_: it touches `in_flight` until it finishes.
inline void SplitSync::submit(const SplitDesc& split, BufferTypeMask in_flight) noexcept {
    const std::uint32_t b = split.backend;
    std::uint64_t* w = work_clock_.data();
    const std::uint64_t ordinal = ++submitted_[b];
    w[b] = ordinal;
    std::uint64_t* own = &queue_clock(b, 0);
    for (std::uint32_t y = 0; y < params_.n_backends; ++y) {
        own[y] = w[y];
    }
    if (split.backend_async) {
        for_each_bit(in_flight, [&](std::uint32_t t) { last_touch(b, t) = ordinal; });
    } else {
        host_sync(b); // a synchronous backend has finished when the submit returns
    }
    if (split.writes_read_later) {
        exported_[b] |= split.buffer_types;
    }
    async_state_[b] = split.backend_async ? 2 : 1;
}

// Asynchronous backends other than b whose work the split just submitted is not ordered after:
// they may still run while it runs. (A synchronous backend's work is always in host_clock_, so
// in work_clock_; work carried from an earlier graph counts, whatever this graph has seen.)
inline BackendMask SplitSync::unordered_async(std::uint32_t b) const noexcept {
    BackendMask deferred = 0;
    for (std::uint32_t x = 0; x < params_.n_backends; ++x) {
        if (x != b && submitted_[x] > work_clock_[x]) {
            deferred |= bit_of(x);
        }
    }
    return deferred;
}

BackendMask SplitSync::in_flight() const noexcept {
    BackendMask pending = 0;
    for (std::uint32_t x = 0; x < params_.n_backends; ++x) {
        if (submitted_[x] > host_clock_[x]) {
            pending |= bit_of(x);
        }
    }
    return pending;
}

BackendMask SplitSync::finish() noexcept {
    BackendMask drain = 0;
    // Same greedy as next(): a backend whose latest split waited on all of another's work
    // finishes that one too.
    for (BackendMask left = in_flight(); left != 0; left = in_flight()) {
        const std::uint32_t best = covering_most(left, submitted_.data());
        host_sync(best);
        drain |= bit_of(best);
    }
    deferred_outstanding_ = 0; // every backend has finished, the ones the drain implied too
    end_graph();
    return drain;
}

// Ordinals stay monotonic across graphs, so the clocks and last_touch_ carry the work still in
// flight into the next graph as they are; only what describes this graph's splits is cleared.
void SplitSync::end_graph() noexcept {
    std::fill(exported_.begin(), exported_.end(), BufferTypeMask{0});
    std::fill(async_state_.begin(), async_state_.end(), std::uint8_t{0});
    graph_splits_ = 0;
}

void SplitSync::synchronized(BackendMask backends) noexcept {
    for_each_bit(backends & valid_backends(params_.n_backends),
                 [this](std::uint32_t x) { host_sync(x); });
}

void SplitSync::reset() noexcept {
    std::fill(submitted_.begin(), submitted_.end(), 0);
    std::fill(host_clock_.begin(), host_clock_.end(), 0);
    std::fill(queue_clock_.begin(), queue_clock_.end(), 0);
    std::fill(work_clock_.begin(), work_clock_.end(), 0);
    std::fill(last_touch_.begin(), last_touch_.end(), 0);
    std::fill(exported_.begin(), exported_.end(), BufferTypeMask{0});
    std::fill(async_state_.begin(), async_state_.end(), std::uint8_t{0});
    deferred_outstanding_ = 0;
    graph_splits_ = 0;
}

Result<SplitSyncPlan> plan_split_sync(const SplitSyncParams& params,
                                      Span<const SplitDesc> splits) {
    auto helper = SplitSync::create(params);
    if (!helper) {
        return std::move(helper).error();
    }
    SplitSyncPlan plan;
    plan.splits.reserve(splits.size());
    for (const SplitDesc& split : splits) {
        auto decision = helper->next(split);
        if (!decision) {
            return std::move(decision).error();
        }
        plan.splits.push_back(decision.value());
    }
    plan.drain = helper->finish();
    return plan;
}

} // namespace wm
