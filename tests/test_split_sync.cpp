// SPDX-License-Identifier: MIT
// The split-ordering helper, judged by the simulator: zero hazards under its answers on 10,000
// seeded random graphs and the upstream shapes, hazards without them, validation errors, and
// the simulator itself checked against concrete timings and a broken helper.
#include <algorithm>
#include <bit>
#include <set>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "testkit/split_sim.hpp"
#include "weightmap/split_sync.hpp"

using namespace wm;
namespace sim = wm::testkit::sim;

namespace {

constexpr BackendMask bit(std::uint32_t x) { return BackendMask{1} << x; }

SplitSync make_helper(std::uint32_t n_backends, bool sync_deferred_before_reuse = false) {
    SplitSyncParams params;
    params.n_backends = n_backends;
    params.sync_deferred_before_reuse = sync_deferred_before_reuse;
    auto created = SplitSync::create(params);
    REQUIRE(created.ok());
    return std::move(created).value();
}

SplitSyncPlan plan_for(const sim::Graph& g, bool sync_deferred_before_reuse = false) {
    SplitSyncParams params;
    params.n_backends = g.n_backends;
    params.sync_deferred_before_reuse = sync_deferred_before_reuse;
    auto plan = plan_split_sync(params, g.splits);
    REQUIRE(plan.ok());
    return std::move(plan).value();
}

sim::SimResult run(const sim::Graph& g, std::unique_ptr<sim::Policy> policy) {
    return sim::simulate(g, *policy);
}

sim::Graph graph_of(std::uint32_t n_backends, std::vector<SplitDesc> splits) {
    sim::Graph g;
    g.name = "hand-written";
    g.n_backends = n_backends;
    g.splits = std::move(splits);
    sim::allocate_regions(g, 0);
    return g;
}

// Drops every third sync the helper asks for: a helper with a bug.
class DroppingHelper final : public sim::Policy {
public:
    const char* name() const override { return "dropping helper"; }
    void begin(const sim::Graph& g) override {
        inner_->begin(g);
        asked_ = 0;
    }
    BackendMask before_split(std::size_t i) override {
        BackendMask m = inner_->before_split(i);
        return (m != 0 && asked_++ % 3 == 2) ? 0 : m;
    }
    BackendMask after_graph() override { return inner_->after_graph(); }

private:
    std::unique_ptr<sim::Policy> inner_ = sim::make_helper_policy();
    std::uint64_t asked_ = 0;
};

} // namespace

TEST_CASE("create accepts 1..64 backends and rejects the rest", "[split_sync]") {
    for (std::uint32_t n : {0u, 65u, 1000u}) {
        SplitSyncParams params;
        params.n_backends = n;
        auto created = SplitSync::create(params);
        REQUIRE_FALSE(created.ok());
        CHECK(created.error().kind == ErrorKind::invalid_argument);
        CHECK_THAT(created.error().message, Catch::Contains("n_backends = " + std::to_string(n)));
    }
    for (std::uint32_t n : {1u, 64u}) {
        SplitSyncParams params;
        params.n_backends = n;
        CHECK(SplitSync::create(params).ok());
    }
    auto plan = plan_split_sync(SplitSyncParams{}, {});
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.error().kind == ErrorKind::invalid_argument);
}

TEST_CASE("next rejects malformed splits with the split, field and numbers, state unchanged",
          "[split_sync]") {
    SplitSync h = make_helper(3);
    REQUIRE(h.next(sim::make_split(0, true, 1)).ok());

    struct Bad {
        SplitDesc split;
        const char* says;
    };
    const Bad bad[] = {
        {sim::make_split(3, true, 1), "split 1: backend = 3 out of range (n_backends = 3)"},
        {sim::make_split(1, true, 1, 1, bit(5)), "input_backends = 0x20 names backend 5"},
        {sim::make_split(1, true, 1, 0, bit(0)), "n_inputs = 0 but input_backends = 0x1"},
        {sim::make_split(2, true, 1, 1, bit(0) | bit(1)), "names 2 other backends but n_inputs = 1"},
        {sim::make_split(0, false, 1), "backend 0 has backend_async = false"},
    };
    for (const Bad& b : bad) {
        auto r = h.next(b.split);
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().kind == ErrorKind::invalid_argument);
        CHECK_THAT(r.error().message, Catch::Contains(b.says));
    }
    CHECK(h.splits_in_graph() == 1);

    // The rejected splits left no trace: the decisions match a helper that never saw them.
    SplitSync clean = make_helper(3);
    REQUIRE(clean.next(sim::make_split(0, true, 1)).ok());
    const SplitDesc follow = sim::make_split(1, true, 1);
    auto a = h.next(follow);
    auto b = clean.next(follow);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a.value().sync_now == b.value().sync_now);
    CHECK(a.value().sync_now == bit(0));
    CHECK(h.finish() == clean.finish());

    // The whole-graph form names the failing split too.
    SplitSyncParams params;
    params.n_backends = 2;
    const std::vector<SplitDesc> graph = {sim::make_split(0, true, 1), sim::make_split(1, false, 1), sim::make_split(7, false, 1)};
    auto plan = plan_split_sync(params, graph);
    REQUIRE_FALSE(plan.ok());
    CHECK_THAT(plan.error().message, Catch::Contains("split 2: backend = 7"));
}

TEST_CASE("a backend may change its async flag between graphs, not within one",
          "[split_sync]") {
    SplitSync h = make_helper(2);
    REQUIRE(h.next(sim::make_split(0, true, 1)).ok());
    CHECK_FALSE(h.next(sim::make_split(0, false, 1)).ok());
    h.finish();
    CHECK(h.next(sim::make_split(0, false, 1)).ok());
}

TEST_CASE("empty buffer-type sets are allowed and never cause a sync", "[split_sync]") {
    const sim::Graph g = graph_of(3, {sim::make_split(0, true, 0), sim::make_split(1, true, 0), sim::make_split(0, true, 0),
                                      sim::make_split(2, false, 0)});
    const SplitSyncPlan plan = plan_for(g);
    for (const SplitSyncDecision& d : plan.splits) {
        CHECK(d.sync_now == 0);
    }
    CHECK(plan.splits[1].deferred == bit(0));
    CHECK(plan.splits[3].deferred == (bit(0) | bit(1)));
    CHECK(plan.drain == (bit(0) | bit(1)));
    CHECK(run(g, sim::make_helper_policy()).hazards == 0);
}

TEST_CASE("upstream race: caught without syncs, fixed by the helper", "[split_sync][upstream]") {
    const sim::Graph g = sim::upstream_vulkan_input_embed();
    constexpr std::uint32_t vulkan = 0;

    const sim::SimResult none = run(g, sim::make_no_sync_policy());
    REQUIRE(none.hazards >= 1);
    const sim::Hazard& h = none.hazard_list.front();
    CHECK(h.earlier == 1);          // Vulkan's asynchronous copy of input_embed ...
    CHECK(h.later == 2);            // ... against the input-less CPU split reusing its region
    CHECK(h.involves_copy_read);
    CHECK_FALSE(h.read_read);

    // The starting rule, fed each split's own buffer types, misses it: the copy reads
    // CPU memory on the Vulkan timeline. The helper counts the copy's source buffer types.
    CHECK(run(g, sim::make_starting_rule_policy(false)).hazards >= 1);

    CHECK(run(g, sim::make_upstream_policy()).hazards == 0);
    const sim::SimResult helper = run(g, sim::make_helper_policy());
    CHECK(helper.hazards == 0);
    CHECK(helper.missed_drains == 0);

    const SplitSyncPlan plan = plan_for(g);
    CHECK(plan.splits[2].sync_now == bit(vulkan));
    CHECK(plan.splits[0].sync_now == 0);
    CHECK(plan.splits[1].sync_now == 0);
}

TEST_CASE("upstream deferral: the HIP sync is deferred across the CPU wait and drained at the "
          "end", "[split_sync][upstream]") {
    const sim::Graph g = sim::upstream_hip_shexp_deferral();
    constexpr std::uint32_t hip = 0;

    const SplitSyncPlan plan = plan_for(g);
    CHECK(plan.splits[3].sync_now == 0);       // the WAIT runs while the shexp FFN runs
    CHECK(plan.splits[3].deferred == bit(hip));
    CHECK(plan.drain == bit(hip));

    const sim::SimResult helper = run(g, sim::make_helper_policy());
    const sim::SimResult upstream = run(g, sim::make_upstream_policy());
    CHECK(helper.hazards == 0);
    CHECK(helper.missed_drains == 0);
    CHECK(helper.blocking_syncs == 0);
    CHECK(upstream.blocking_syncs == 1);       // upstream blocks on HIP before the WAIT
    CHECK(upstream.hazards == 0);
    CHECK(run(g, sim::make_no_sync_policy()).hazards == 0); // the deferral is safe

    const sim::SimResult reuse = run(g, sim::make_helper_policy({0, true}));
    CHECK(reuse.hazards == 0);
    CHECK(reuse.missed_drains == 0);
}

TEST_CASE("sync_deferred_before_reuse drains a deferred backend before its next split",
          "[split_sync]") {
    // A (async) runs, the input-less CPU split defers it, then A runs again.
    const std::vector<SplitDesc> splits = {sim::make_split(0, true, 1), sim::make_split(1, false, 2), sim::make_split(0, true, 1)};
    SplitSyncParams params;
    params.n_backends = 2;
    auto lazy = plan_split_sync(params, splits);
    params.sync_deferred_before_reuse = true;
    auto eager = plan_split_sync(params, splits);
    REQUIRE(lazy.ok());
    REQUIRE(eager.ok());
    CHECK(lazy.value().splits[1].deferred == bit(0));
    CHECK(lazy.value().splits[2].sync_now == 0);
    CHECK(eager.value().splits[2].sync_now == bit(0));
    CHECK(lazy.value().drain == bit(0));
    CHECK(eager.value().drain == bit(0));
}

TEST_CASE("three backends: syncing the previous backend misses the one before it",
          "[split_sync]") {
    const sim::Graph g = sim::three_backends();
    constexpr std::uint32_t vulkan = 0, cuda = 1;
    const sim::SimResult upstream = run(g, sim::make_upstream_policy());
    CHECK(upstream.hazards >= 1);
    CHECK(upstream.blocking_syncs == 1); // it synced CUDA, which did not matter

    const SplitSyncPlan plan = plan_for(g);
    CHECK(plan.splits[2].sync_now == bit(vulkan));
    CHECK(plan.splits[2].deferred == bit(cuda));
    CHECK(run(g, sim::make_helper_policy()).hazards == 0);
}

TEST_CASE("a split with inputs from A still races with B: its copies order it after A only",
          "[split_sync]") {
    const sim::Graph g = sim::inputs_from_one_while_another_runs();
    constexpr std::uint32_t gpu_b = 1;
    CHECK(run(g, sim::make_starting_rule_policy(false)).hazards >= 1);
    CHECK(run(g, sim::make_starting_rule_policy(true)).hazards >= 1);
    CHECK(run(g, sim::make_upstream_policy()).hazards >= 1);

    const SplitSyncPlan plan = plan_for(g);
    CHECK(plan.splits[2].sync_now == bit(gpu_b));
    CHECK(run(g, sim::make_helper_policy()).hazards == 0);
}

TEST_CASE("an input copy's event wait orders the split: no sync needed", "[split_sync]") {
    constexpr BufferTypeMask shared = 4;
    // B copies from A asynchronously and touches A's buffer type: ordered, no sync.
    const sim::Graph ordered = graph_of(2, {sim::make_split(0, true, shared, 0, 0, true, true),
                                            sim::make_split(1, true, shared, 1, bit(0), true)});
    CHECK(plan_for(ordered).splits[1].sync_now == 0);
    CHECK(run(ordered, sim::make_helper_policy()).hazards == 0);
    CHECK(run(ordered, sim::make_no_sync_policy()).hazards == 0);

    // The same without the input: a race, and the helper syncs A.
    const sim::Graph unordered = graph_of(2, {sim::make_split(0, true, shared), sim::make_split(1, true, shared)});
    CHECK(plan_for(unordered).splits[1].sync_now == bit(0));
    CHECK(run(unordered, sim::make_no_sync_policy()).hazards >= 1);
    CHECK(run(unordered, sim::make_helper_policy()).hazards == 0);
}

TEST_CASE("one sync covers a chain of event waits", "[split_sync]") {
    constexpr BufferTypeMask shared = 4;
    // A writes `shared`; B copies it asynchronously (so B reads `shared` too); the input-less
    // CPU split touches `shared`. Both A and B conflict, but B's copy waited for all of A.
    const sim::Graph g = graph_of(3, {sim::make_split(0, true, shared, 0, 0, true, true),
                                      sim::make_split(1, true, 2, 1, bit(0), true),
                                      sim::make_split(2, false, shared)});
    const SplitSyncPlan plan = plan_for(g);
    CHECK(plan.splits[2].sync_now == bit(1));
    CHECK(plan.drain == 0);
    const sim::SimResult r = run(g, sim::make_helper_policy());
    CHECK(r.hazards == 0);
    CHECK(r.blocking_syncs == 1);
    CHECK(run(g, sim::make_no_sync_policy()).hazards >= 1);
}

TEST_CASE("10,000 seeded random graphs: zero hazards under the helper, hazards without it",
          "[split_sync][corpus]") {
    sim::RuleTotals none, always, upstream, starting, helper, helper_reuse;
    std::uint64_t requested_syncs = 0, drain_requested = 0, drain_blocking = 0;
    std::uint32_t max_backends = 0, min_backends = 99, max_splits = 0, min_splits = 99;
    bool saw_sync_backend = false;
    auto none_p = sim::make_no_sync_policy();
    auto always_p = sim::make_always_policy();
    auto upstream_p = sim::make_upstream_policy();
    auto starting_p = sim::make_starting_rule_policy(false);
    auto helper_p = sim::make_helper_policy();
    auto reuse_p = sim::make_helper_policy({0, true});
    for (std::uint64_t i = 0; i < sim::corpus_size; ++i) {
        const sim::Graph g = sim::random_graph(sim::corpus_seed(i));
        max_backends = std::max(max_backends, g.n_backends);
        min_backends = std::min(min_backends, g.n_backends);
        max_splits = std::max(max_splits, static_cast<std::uint32_t>(g.splits.size()));
        min_splits = std::min(min_splits, static_cast<std::uint32_t>(g.splits.size()));
        for (const SplitDesc& d : g.splits) {
            saw_sync_backend = saw_sync_backend || !d.backend_async;
        }
        none.add(sim::simulate(g, *none_p));
        always.add(sim::simulate(g, *always_p));
        upstream.add(sim::simulate(g, *upstream_p));
        if (i < 2000) { // enough to show them; the bench runs them on the whole corpus
            starting.add(sim::simulate(g, *starting_p));
            helper_reuse.add(sim::simulate(g, *reuse_p));
        }
        const sim::SimResult r = sim::simulate(g, *helper_p);
        helper.add(r);
        if (r.hazards != 0 || !r.policy_failure.empty() || r.missed_drains != 0) {
            FAIL_CHECK(g.name << ": hazards " << r.hazards << ", missed drains "
                              << r.missed_drains << ", failure '" << r.policy_failure << "'");
        }
        for (BackendMask m : r.sync_masks) {
            requested_syncs += static_cast<std::uint64_t>(std::popcount(m));
        }
        drain_requested += static_cast<std::uint64_t>(std::popcount(r.end_mask));
        drain_blocking += r.drain_syncs;
    }
    // The corpus is what the issue asks for.
    CHECK(helper.graphs == 10000);
    CHECK(min_backends == 2);
    CHECK(max_backends == 4);
    CHECK(min_splits == 1);
    CHECK(max_splits == 64);
    CHECK(saw_sync_backend);

    CHECK(helper.hazards == 0);
    CHECK(helper.missed_drains == 0);
    CHECK(helper.failures == 0);
    CHECK(helper_reuse.hazards == 0);
    CHECK(helper_reuse.missed_drains == 0);
    // Every sync the helper asks for could block (no wasted sync), and so does every drain.
    CHECK(requested_syncs == helper.blocking_syncs);
    CHECK(drain_requested == drain_blocking);

    // The simulator can fail: without syncs, and under the rules the helper strengthens.
    CHECK(none.hazards > 0);
    CHECK(none.graphs_with_hazards > 1000);
    CHECK(upstream.hazards > 0);
    CHECK(starting.hazards > 0);
    CHECK(always.hazards == 0);

    // The helper is the cheapest of the three rules.
    CHECK(helper.blocking_syncs < upstream.blocking_syncs);
    CHECK(helper.blocking_syncs < always.blocking_syncs);
    CHECK(helper_reuse.graphs == 2000);
}

TEST_CASE("end_graph carries work in flight into the next graph; synchronized() settles it",
          "[split_sync]") {
    // Graph 1: Vulkan (async) still touches buffer type 0. Graph 2: a CPU split handed the same
    // buffer type. Without a drain the helper must sync Vulkan there, unless the engine did.
    const SplitDesc vulkan = sim::make_split(0, true, bit(0));
    const SplitDesc cpu = sim::make_split(1, false, bit(0));
    SplitSync h = make_helper(2);
    REQUIRE(h.next(vulkan)->sync_now == 0);
    h.end_graph();
    CHECK(h.in_flight() == bit(0));
    CHECK(h.splits_in_graph() == 0);
    auto carried = h.next(cpu);
    REQUIRE(carried.ok());
    CHECK(carried->sync_now == bit(0));
    CHECK(h.in_flight() == 0);

    SplitSync settled = make_helper(2);
    REQUIRE(settled.next(vulkan).ok());
    settled.end_graph();
    settled.synchronized(bit(0) | bit(63)); // bits past n_backends are ignored
    CHECK(settled.in_flight() == 0);
    CHECK(settled.next(cpu)->sync_now == 0);

    // A split of another buffer type runs alongside: the carried work is only deferred.
    SplitSync overlap = make_helper(2);
    REQUIRE(overlap.next(vulkan).ok());
    overlap.end_graph();
    auto other = overlap.next(sim::make_split(1, false, bit(1)));
    CHECK(other->sync_now == 0);
    CHECK(other->deferred == bit(0));
}

TEST_CASE("carried runs: zero hazards across graphs without a drain, hazards when forgotten",
          "[split_sync][corpus]") {
    // Forgets everything at each graph start, as a helper that drained without syncing would.
    class Forgetful final : public sim::Policy {
    public:
        const char* name() const override { return "forgetful"; }
        void begin(const sim::Graph& g) override {
            g_ = &g;
            h_ = std::make_unique<SplitSync>(make_helper(g.n_backends));
        }
        BackendMask before_split(std::size_t i) override {
            if (g_->starts_graph(i)) h_->reset();
            return h_->next(g_->splits[i])->sync_now;
        }
        BackendMask after_graph() override { return h_->finish(); }

    private:
        const sim::Graph* g_ = nullptr;
        std::unique_ptr<SplitSync> h_;
    };
    auto helper_p = sim::make_helper_policy();
    auto none_p = sim::make_no_sync_policy();
    Forgetful forgetful;
    std::uint64_t helper_hazards = 0, helper_failures = 0, cross_none = 0, forgotten = 0;
    for (std::uint64_t seed = 1; seed <= 2000; ++seed) {
        const sim::Graph run = sim::carried_run(seed, 3, {2, 4, 1, 16});
        REQUIRE(run.graph_starts.size() == 2);
        const sim::SimResult h = sim::simulate(run, *helper_p);
        helper_hazards += h.hazards;
        helper_failures += h.policy_failure.empty() ? 0 : 1;
        CHECK(h.drain_syncs == 0); // a carried run never drains
        const sim::SimResult none = sim::simulate(run, *none_p);
        for (const sim::Hazard& hz : none.hazard_list) {
            const bool across = std::any_of(run.graph_starts.begin(), run.graph_starts.end(),
                                            [&](std::uint32_t s) { return hz.earlier < s && s <= hz.later; });
            cross_none += across ? 1 : 0;
        }
        forgotten += sim::simulate(run, forgetful).hazards;
    }
    CHECK(helper_hazards == 0);
    CHECK(helper_failures == 0);
    CHECK(cross_none > 0); // the runs do race across graphs without syncs...
    CHECK(forgotten > 0);  // ...and a helper that forgot the previous graph lets that through
}

TEST_CASE("the simulator catches a helper that drops syncs", "[split_sync][simulator]") {
    DroppingHelper broken;
    std::uint64_t hazards = 0;
    for (std::uint64_t i = 0; i < 1000; ++i) {
        hazards += sim::simulate(sim::random_graph(sim::corpus_seed(i)), broken).hazards;
    }
    CHECK(hazards > 0);
}

TEST_CASE("the simulator's ordering matches concrete timings", "[split_sync][simulator]") {
    // Every overlap a random timing produces must be a hazard the vector clocks reported; the
    // timings must also find overlaps, or the check would be vacuous.
    std::uint64_t overlaps_none = 0, unexplained = 0, overlaps_helper = 0;
    auto none = sim::make_no_sync_policy();
    auto upstream = sim::make_upstream_policy();
    auto helper = sim::make_helper_policy();
    for (std::uint64_t i = 0; i < 1000; ++i) {
        const sim::Graph g = sim::random_graph(sim::corpus_seed(i));
        for (sim::Policy* p : {none.get(), upstream.get(), helper.get()}) {
            const sim::SimResult r = sim::simulate(g, *p);
            std::set<std::pair<std::uint32_t, std::uint32_t>> reported;
            for (const sim::Hazard& h : r.hazard_list) {
                reported.emplace(h.earlier, h.later);
            }
            for (std::uint64_t t = 0; t < 3; ++t) {
                for (const auto& pair : sim::timed_overlaps(g, r, i * 7 + t)) {
                    unexplained += reported.count(pair) == 0 ? 1 : 0;
                    overlaps_none += p == none.get() ? 1 : 0;
                    overlaps_helper += p == helper.get() ? 1 : 0;
                }
            }
        }
    }
    CHECK(unexplained == 0);
    CHECK(overlaps_none > 100);
    CHECK(overlaps_helper == 0);
}

TEST_CASE("incremental and whole-graph forms agree; one object serves many graphs",
          "[split_sync]") {
    std::vector<std::unique_ptr<SplitSync>> reused(5);
    for (std::uint32_t n = 2; n <= 4; ++n) {
        reused[n] = std::make_unique<SplitSync>(make_helper(n));
    }
    std::uint64_t compared = 0, mismatches = 0;
    for (std::uint64_t i = 0; i < 2000; ++i) {
        const sim::Graph g = sim::random_graph(sim::corpus_seed(i));
        const SplitSyncPlan plan = plan_for(g);
        SplitSync& h = *reused[g.n_backends];
        REQUIRE(plan.splits.size() == g.splits.size());
        for (std::size_t s = 0; s < g.splits.size(); ++s) {
            auto d = h.next(g.splits[s]);
            mismatches += !d.ok() || d.value().sync_now != plan.splits[s].sync_now ||
                          d.value().deferred != plan.splits[s].deferred;
            ++compared;
        }
        mismatches += h.finish() != plan.drain;
    }
    CHECK(compared > 30000);
    CHECK(mismatches == 0);
    // reset() returns to the fresh state.
    const sim::Graph g = sim::random_graph(sim::corpus_seed(1));
    SplitSync& h = *reused[g.n_backends];
    REQUIRE(h.next(g.splits[0]).ok());
    h.reset();
    const SplitSyncPlan plan = plan_for(g);
    for (std::size_t s = 0; s < g.splits.size(); ++s) {
        auto d = h.next(g.splits[s]);
        REQUIRE(d.ok());
        CHECK(d.value().sync_now == plan.splits[s].sync_now);
    }
    CHECK(h.finish() == plan.drain);
}
