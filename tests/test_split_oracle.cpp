// SPDX-License-Identifier: MIT
// The split oracle (testkit/split_oracle.hpp): a write over bytes an unfinished asynchronous
// split of another backend reads is a hazard, and a wait, a sync, the same backend, a synchronous
// reader or disjoint bytes are not; unfinished reads carry across graphs; bad lines are errors
// naming the line. The replay parser reads the same traces and ignores the oracle's lines.
#include <catch2/catch.hpp>

#include <string>

#include "testkit/split_oracle.hpp"
#include "testkit/split_trace.hpp"

using namespace wm;
using namespace wm::testkit;

namespace {

// Vulkan (0, asynchronous) reads x in the CPU's buffer 0xb; then the CPU (1) writes `write`.
std::string trace(const std::string& between, const std::string& write = "write buffer=0xb offset=64 size=16",
                  int reader_async = 1) {
    return "graph n_backends=2 carry=1\n"
           "split backend=0 async=" + std::to_string(reader_async) +
           " n_inputs=0 input_backends=0 copies_async=1 buffer_types=0x3 writes_read_later=0\n"
           "read buffer=0xb offset=0 size=128\n"
           "write buffer=0xa offset=0 size=128\n" +
           between +
           "split backend=1 async=0 n_inputs=0 input_backends=0 copies_async=1 buffer_types=0x2 writes_read_later=0\n" +
           write + "\n"
           "end\n";
}

std::uint64_t hazards(const std::string& text) {
    auto report = check_split_trace(text, "test");
    REQUIRE(report);
    return report.value().hazards;
}

} // namespace

TEST_CASE("a write over bytes an unfinished asynchronous split reads is a hazard") {
    auto report = check_split_trace(trace(""), "race.trace");
    REQUIRE(report);
    CHECK(report.value().hazards == 1);
    CHECK(report.value().splits == 2);
    CHECK(report.value().graphs == 1);
    CHECK(report.value().first_hazard.find("line 6: split 1 (backend 1) writes buffer 0xb [64, 80)") == 0);
    CHECK(report.value().first_hazard.find("read by unfinished split 0 (backend 0)") != std::string::npos);
}

TEST_CASE("a wait or a sync of the reader's backend before the write removes the hazard") {
    CHECK(hazards(trace("wait backends=0x1\n")) == 0);
    CHECK(hazards(trace("sync backends=0x1\n")) == 0);
    CHECK(hazards(trace("wait backends=0x2\n")) == 1); // the writer's own backend is not the reader's
}

TEST_CASE("disjoint bytes, another buffer, a synchronous reader are no hazard") {
    CHECK(hazards(trace("", "write buffer=0xb offset=128 size=64")) == 0); // touches the end only
    CHECK(hazards(trace("", "write buffer=0xc offset=0 size=128")) == 0);
    CHECK(hazards(trace("", "write buffer=0xb offset=64 size=16", 0)) == 0);
}

TEST_CASE("the same backend writing after its own read is in order") {
    const std::string text = "graph n_backends=2 carry=1\n"
                             "split backend=0 async=1 n_inputs=0 input_backends=0 copies_async=1 buffer_types=1 writes_read_later=0\n"
                             "read buffer=0xb offset=0 size=128\n"
                             "split backend=0 async=1 n_inputs=0 input_backends=0 copies_async=1 buffer_types=1 writes_read_later=0\n"
                             "write buffer=0xb offset=0 size=128\n"
                             "end\n";
    CHECK(hazards(text) == 0);
}

TEST_CASE("unfinished reads carry into the next graph until a sync") {
    const std::string first = "graph n_backends=2 carry=1\n"
                              "split backend=0 async=1 n_inputs=0 input_backends=0 copies_async=1 buffer_types=2 writes_read_later=0\n"
                              "read buffer=0xb offset=0 size=128\n"
                              "end\n";
    const std::string second = "graph n_backends=2 carry=1\n"
                               "split backend=1 async=0 n_inputs=0 input_backends=0 copies_async=1 buffer_types=2 writes_read_later=0\n"
                               "write buffer=0xb offset=0 size=4\n"
                               "end\n";
    CHECK(hazards(first + second) == 1);
    CHECK(hazards(first + "sync backends=0x3\n" + second) == 0);
}

TEST_CASE("a malformed trace is an error naming the line") {
    auto outside = check_split_trace("graph n_backends=2 carry=1\nread buffer=1 offset=0 size=1\n", "bad.trace");
    REQUIRE_FALSE(outside);
    CHECK(outside.error().message.find("bad.trace:2") != std::string::npos);
    auto unknown = check_split_trace("launch rockets=1\n", "bad.trace");
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().message.find("unknown line 'launch'") != std::string::npos);
    REQUIRE_FALSE(check_split_trace(trace("", "write buffer=0xb offset=64"), "x"));
}

TEST_CASE("the replay reads a trace with the oracle's lines as one without them") {
    auto with = testkit::sim::parse_split_trace(trace("wait backends=0x1\n"), "with");
    REQUIRE(with);
    REQUIRE(with.value().size() == 1);
    CHECK(with.value()[0].splits.size() == 2);
}
