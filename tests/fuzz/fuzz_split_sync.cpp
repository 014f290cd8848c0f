// SPDX-License-Identifier: MIT
// libFuzzer target: arbitrary bytes -> a split sequence (valid or not) -> the helper, both forms,
// and the simulator, as one graph and as graphs carried without a drain. Traps when the helper's
// answers allow a hazard or miss a drain, when the incremental and whole-graph forms disagree
// (decisions, drain, or the error and where), or when a reused object gives different answers
// from a fresh one.
//
// Layout: [n_backends-1 (low 3 bits) | reuse flag (bit 3)] [async bits]
//         then 5 bytes per split (at most 256 splits):
//         backend, flags, input mask, buffer types low, buffer types high.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "testkit/split_sim.hpp"
#include "weightmap/split_sync.hpp"

namespace {

using namespace wm;
namespace sim = wm::testkit::sim;

[[noreturn]] void fail() { __builtin_trap(); }

std::vector<SplitDesc> decode(const std::uint8_t* data, std::size_t size, std::uint32_t n,
                              std::uint8_t async_bits) {
    std::vector<SplitDesc> splits;
    const BackendMask valid = (BackendMask{1} << n) - 1;
    for (std::size_t at = 2; at + 5 <= size && splits.size() < 256; at += 5) {
        const std::uint8_t c0 = data[at], flags = data[at + 1], inputs = data[at + 2];
        SplitDesc d;
        // 0xF8..0xFF: an out-of-range backend id, to exercise validation.
        d.backend = c0 >= 0xF8 ? n + (c0 & 7u) : c0 % n;
        const bool async_backend = ((async_bits >> (d.backend % 8)) & 1) != 0;
        // flags bit 5+6: flip the async flag (an inconsistent description).
        d.backend_async = (flags & 0x60) == 0x60 ? !async_backend : async_backend;
        d.input_copies_async = (flags & 1) != 0;
        d.writes_read_later = (flags & 2) != 0;
        const std::uint32_t extra = (flags >> 2) & 7u;
        d.input_backends = (flags & 0x80) != 0 ? inputs : (inputs & valid);
        const BackendMask others = d.input_backends & ~(BackendMask{1} << (d.backend % 64));
        // flags bit 7: raw counts (may contradict the mask); otherwise consistent.
        d.n_inputs = (flags & 0x80) != 0
                         ? extra
                         : static_cast<std::uint32_t>(std::popcount(others)) + extra;
        if ((flags & 0x80) == 0 && d.n_inputs == 0) {
            d.input_backends = 0;
        }
        d.buffer_types = BufferTypeMask{data[at + 3]} | (BufferTypeMask{data[at + 4]} << 8);
        if ((data[at + 4] & 0x80) != 0) {
            d.buffer_types |= BufferTypeMask{1} << 63; // the widest id
        }
        splits.push_back(d);
    }
    return splits;
}

bool same(const SplitSyncDecision& a, const SplitSyncDecision& b) {
    return a.sync_now == b.sync_now && a.deferred == b.deferred;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) {
        return 0;
    }
    SplitSyncParams params;
    params.n_backends = 1 + (data[0] & 7u);
    params.sync_deferred_before_reuse = (data[0] & 8u) != 0;
    const std::vector<SplitDesc> splits = decode(data, size, params.n_backends, data[1]);

    auto plan = plan_split_sync(params, splits);
    auto created = SplitSync::create(params);
    if (!created) {
        fail();
    }
    SplitSync& helper = created.value();

    // Two passes on one object: the second must not see the first graph's state.
    for (int pass = 0; pass < 2; ++pass) {
        bool failed = false;
        for (std::size_t i = 0; i < splits.size(); ++i) {
            auto decision = helper.next(splits[i]);
            if (!decision) {
                // The whole-graph form must fail with the same message (it names the split).
                if (plan.ok() || plan.error().message != decision.error().message ||
                    plan.error().kind != decision.error().kind) {
                    fail();
                }
                failed = true;
                break;
            }
            if (!plan.ok() && i + 1 == splits.size()) {
                fail(); // the plan failed but every split was accepted
            }
            if (plan.ok() && !same(decision.value(), plan.value().splits[i])) {
                fail();
            }
        }
        if (failed) {
            helper.reset(); // the engine drained everything after the aborted graph
            continue;
        }
        if (!plan.ok()) {
            fail(); // only possible with zero splits, which cannot fail
        }
        if (helper.finish() != plan.value().drain) {
            fail();
        }
    }
    if (!plan.ok()) {
        return 0;
    }

    // Judge the answers: two allocations of the same sequence.
    sim::Graph graph;
    graph.name = "fuzz";
    graph.n_backends = params.n_backends;
    graph.splits = splits;
    std::uint64_t seed = 0xcbf29ce484222325ULL; // FNV-1a of the input: a reproducible allocation
    for (std::size_t i = 0; i < size; ++i) {
        seed = (seed ^ data[i]) * 0x100000001b3ULL;
    }
    for (std::uint64_t alloc_seed : {std::uint64_t{0}, seed | 1}) {
        sim::allocate_regions(graph, alloc_seed);
        auto policy = sim::make_helper_policy(params);
        const sim::SimResult result = sim::simulate(graph, *policy);
        if (result.hazards != 0 || result.missed_drains != 0 || !result.policy_failure.empty()) {
            fail();
        }
        for (std::size_t i = 0; i < splits.size(); ++i) {
            if (result.sync_masks[i] != plan.value().splits[i].sync_now) {
                fail();
            }
        }
    }

    // The same splits as engine graphs carried without a drain (end_graph), cut where the
    // input's bytes say, the engine synchronizing everything before some of them.
    graph.carried = true;
    graph.engine_synced_end = ~BackendMask{0};
    for (std::size_t i = 1; i < splits.size(); ++i) {
        if ((data[1] ^ static_cast<std::uint8_t>(i * 37)) % 5 == 0) {
            graph.graph_starts.push_back(static_cast<std::uint32_t>(i));
            graph.engine_synced.resize(i + 1, 0);
            graph.engine_synced[i] = (data[1] & 0x10) != 0 && i % 2 == 0 ? ~BackendMask{0} : 0;
        }
    }
    sim::allocate_regions(graph, seed | 1);
    auto carried = sim::make_helper_policy(params);
    const sim::SimResult result = sim::simulate(graph, *carried);
    if (result.hazards != 0 || result.drain_syncs != 0 || !result.policy_failure.empty()) {
        fail();
    }
    return 0;
}
