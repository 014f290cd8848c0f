// SPDX-License-Identifier: MIT
// Split traces (testkit/split_trace.hpp): what a patched scheduler writes reads back into the
// same simulator graphs, bad traces are errors naming line and field, and replayed traces keep
// the hazards the simulator finds in the graphs they were written from.
#include <catch2/catch.hpp>

#include "testkit/split_sim.hpp"
#include "testkit/split_trace.hpp"

using namespace wm;
using namespace wm::testkit::sim;

namespace {

bool same_splits(const Graph& a, const Graph& b) {
    if (a.n_backends != b.n_backends || a.splits.size() != b.splits.size()) return false;
    for (std::size_t i = 0; i < a.splits.size(); ++i) {
        const SplitDesc &x = a.splits[i], &y = b.splits[i];
        if (x.backend != y.backend || x.backend_async != y.backend_async ||
            x.n_inputs != y.n_inputs || x.input_backends != y.input_backends ||
            x.input_copies_async != y.input_copies_async || x.buffer_types != y.buffer_types ||
            x.writes_read_later != y.writes_read_later)
            return false;
    }
    return true;
}

} // namespace

TEST_CASE("a trace reads back the graphs it was written from") {
    std::vector<Graph> written = {upstream_vulkan_input_embed(), upstream_hip_shexp_deferral(),
                                  three_backends()};
    for (std::uint64_t seed = 1; seed <= 200; ++seed) written.push_back(random_graph(seed));
    std::string text = "# weightmap split trace\n\n";
    for (const Graph& g : written) text += format_split_trace(g);
    auto read = parse_split_trace(text, "t.trace");
    REQUIRE(read.ok());
    REQUIRE(read->size() == written.size());
    for (std::size_t i = 0; i < written.size(); ++i) {
        INFO(written[i].name);
        CHECK(same_splits((*read)[i], written[i]));
        CHECK((*read)[i].accesses.empty()); // allocate_regions makes them
    }
    CHECK((*read)[0].name == "t.trace:3");
}

TEST_CASE("a bad trace is an error naming the line and the field") {
    const std::string split_line = "split backend=0 async=1 n_inputs=0 input_backends=0 "
                                   "copies_async=1 buffer_types=0x1 writes_read_later=0\n";
    const struct {
        std::string text;
        const char* says;
    } cases[] = {
        {split_line, "t:1: split outside a graph"},
        {"graph n_backends=2\n" + split_line, "t:2: the last graph has no 'end'"},
        {"graph n_backends=0\nend\n", "t:1: graph needs n_backends=1..64"},
        {"graph n_backends=2\ngraph n_backends=2\n", "t:2: graph inside a graph"},
        {"graph n_backends=1\nsplit backend=0 async=2 n_inputs=0 input_backends=0 copies_async=1 "
         "buffer_types=1 writes_read_later=0\nend\n", "t:2: field async: 2 is not 0 or 1"},
        {"graph n_backends=1\nsplit backend=0\nend\n", "t:2: split without field async"},
        {"graph n_backends=1\nsplit backend=3 async=1 n_inputs=0 input_backends=0 copies_async=1 "
         "buffer_types=1 writes_read_later=0\nend\n", "t:2: backend 3 of a graph of 1 backends"},
        {"graph n_backends=1\nsplit backend=zero\nend\n", "t:2: field backend: 'zero' is not a number"},
        {"graph n_backends=1\nsplit backend=0 backend=0\nend\n", "t:2: field backend given twice"},
        {"graph n_backends=1\nsplat x=1\nend\n", "t:2: unknown line 'splat'"},
        {"end\n", "t:1: end outside a graph"},
        {"graph n_backends\n", "t:1: expected key=value, got 'n_backends'"},
    };
    for (const auto& c : cases) {
        INFO(c.text);
        auto r = parse_split_trace(c.text, "t");
        REQUIRE_FALSE(r.ok());
        CHECK(r.error().kind == ErrorKind::format);
        CHECK_THAT(r.error().message, Catch::StartsWith(c.says));
    }
}

TEST_CASE("replayed traces: the three-backend shape races under upstream, never with the helper") {
    // three_backends(): the input-less CPU split after CUDA reuses a region Vulkan (two splits
    // back) still uses; upstream syncs only the previous backend. The Vulkan input_embed race
    // (ggml #26040) is the one upstream's rule fixed: it shows without any sync.
    auto three = parse_split_trace(format_split_trace(three_backends()), "three");
    auto race = parse_split_trace(format_split_trace(upstream_vulkan_input_embed()), "race");
    REQUIRE(three.ok());
    REQUIRE(race.ok());
    Graph g3 = three->front(), gr = race->front();
    allocate_regions(g3, 0);
    allocate_regions(gr, 0);
    auto upstream = make_upstream_policy();
    auto helper = make_helper_policy();
    auto none = make_no_sync_policy();
    CHECK(simulate(g3, *upstream).hazards > 0);
    CHECK(simulate(gr, *none).hazards > 0);
    CHECK(simulate(gr, *upstream).hazards == 0);
    for (const Graph* g : {&g3, &gr}) {
        const SimResult h = simulate(*g, *helper);
        CHECK(h.hazards == 0);
        CHECK(h.policy_failure.empty());
    }
}

TEST_CASE("a carried run reads back as one graph: its graph starts and the engine's syncs") {
    for (std::uint64_t seed = 1; seed <= 50; ++seed) {
        const Graph written = carried_run(seed, 4);
        INFO(written.name);
        auto read = parse_split_trace("sync backends=0x3\n" + format_split_trace(written), "t");
        REQUIRE(read.ok());
        REQUIRE(read->size() == 1); // a sync before the first graph applies to nothing
        const Graph& g = read->front();
        CHECK(same_splits(g, written));
        CHECK(g.carried);
        CHECK(g.graph_starts == written.graph_starts);
        for (std::size_t i = 0; i < written.splits.size(); ++i) {
            CHECK(g.engine_synced_before(i) == written.engine_synced_before(i));
        }
        CHECK(g.engine_synced_end == written.engine_synced_end);
    }
    // A graph without carry=1 ends the run: the next block is a graph of its own.
    auto two = parse_split_trace("graph n_backends=1 carry=1\nend\ngraph n_backends=1\nend\n"
                                 "graph n_backends=1\nend\n", "t");
    REQUIRE(two.ok());
    CHECK(two->size() == 2);
    auto bad = parse_split_trace("graph n_backends=1 carry=1\nend\ngraph n_backends=2\nend\n", "t");
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.error().message, Catch::StartsWith("t:3: graph of 2 backends continues one of 1"));
    auto bad_sync = parse_split_trace("graph n_backends=1\nend\nsync mask=1\n", "t");
    REQUIRE_FALSE(bad_sync.ok());
    CHECK_THAT(bad_sync.error().message, Catch::StartsWith("t:3: sync needs backends=MASK"));
}
