// SPDX-License-Identifier: MIT
// Overflow-safe alignment and addition helpers shared by the planner, mapping and importers.
#pragma once

#include <cstdint>
#include <limits>

namespace wm {

constexpr bool is_power_of_two(std::uint64_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

/// a + b, or UINT64_MAX when that would wrap.
constexpr std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t sum = 0;
    return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::uint64_t>::max() : sum;
}

/// v rounded down to a multiple of the power of two `align`.
constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t align) noexcept {
    return v & ~(align - 1);
}

/// v rounded up to a multiple of the power of two `align`; the largest multiple of `align`
/// representable when rounding up would wrap (callers bound it by the mapped length anyway).
constexpr std::uint64_t align_up_saturating(std::uint64_t v, std::uint64_t align) noexcept {
    std::uint64_t up = 0;
    if (__builtin_add_overflow(v, align - 1, &up)) return align_down(std::numeric_limits<std::uint64_t>::max(), align);
    return align_down(up, align);
}

} // namespace wm
