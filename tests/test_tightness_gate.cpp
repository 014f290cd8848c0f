// SPDX-License-Identifier: MIT
// The gate: last - first <= ctx + ctx/8 + 1 MiB, exact at the boundary, overflow-proof, and not
// the precedence bug upstream first shipped.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

#include "weightmap/planner.hpp"

using wm::passes_tightness_gate;
using wm::tightness_limit;

namespace {
constexpr std::uint64_t MiB = 1ull << 20;
constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

// What `ctx/8 + (size_t)1 << 20` really computes: ((ctx/8) + 1) << 20.
std::uint64_t buggy_limit(std::uint64_t ctx) { return ctx + (ctx / 8 + (std::uint64_t)1 << 20); }
} // namespace

TEST_CASE("gate limit is ctx + ctx/8 + 1 MiB with integer division", "[gate]") {
    CHECK(tightness_limit(0) == MiB);
    CHECK(tightness_limit(7) == 7 + 0 + MiB);   // 7/8 == 0
    CHECK(tightness_limit(8) == 8 + 1 + MiB);
    CHECK(tightness_limit(800) == 800 + 100 + MiB);
    CHECK(tightness_limit(2376 * MiB) == 2376 * MiB + 297 * MiB + MiB);
}

TEST_CASE("gate boundary: the limit passes, limit + 1 fails", "[gate]") {
    for (std::uint64_t ctx : {0ull, 1ull, 8ull, 4095ull, 1536ull * MiB, 18600ull * MiB}) {
        std::uint64_t limit = tightness_limit(ctx);
        std::uint64_t first = 12345;
        CHECK(passes_tightness_gate(first, first + limit, ctx));
        CHECK_FALSE(passes_tightness_gate(first, first + limit + 1, ctx));
    }
}

TEST_CASE("gate saturates instead of wrapping for ctx near 2^64", "[gate]") {
    CHECK(tightness_limit(u64_max) == u64_max);
    CHECK(tightness_limit(u64_max - MiB) == u64_max);
    // ctx + ctx/8 alone overflows here; a wrapping sum would be tiny and reject everything.
    std::uint64_t ctx = (u64_max / 9) * 8 + 64;
    CHECK(tightness_limit(ctx) == u64_max);
    CHECK(passes_tightness_gate(0, u64_max, ctx));
    // Just below saturation the arithmetic is exact.
    std::uint64_t exact = (u64_max - MiB) / 9 * 8;
    CHECK(tightness_limit(exact) == exact + exact / 8 + MiB);
    CHECK(tightness_limit(exact) < u64_max);
}

TEST_CASE("gate is not the precedence bug ((ctx/8)+1) << 20", "[gate]") {
    // 8 MiB of tensors spread over 11 MiB: correct limit 10 MiB rejects it; the buggy
    // expression gives ~1 TiB of slack and would accept it.
    std::uint64_t ctx = 8 * MiB;
    std::uint64_t span = 11 * MiB;
    REQUIRE(buggy_limit(ctx) >= span);
    CHECK(tightness_limit(ctx) == 10 * MiB);
    CHECK_FALSE(passes_tightness_gate(0, span, ctx));
    // The 30B-A3B shape: ~1.5 GB of device tensors spread over the whole 18.6 GB file.
    CHECK_FALSE(passes_tightness_gate(0, 18600 * MiB, 1536 * MiB));
}

TEST_CASE("empty region: a zero-byte span always passes", "[gate]") {
    CHECK(passes_tightness_gate(0, 0, 0));
    CHECK(passes_tightness_gate(u64_max, u64_max, 0));
    CHECK(passes_tightness_gate(0, MiB, 0));
    CHECK_FALSE(passes_tightness_gate(0, MiB + 1, 0));
}
