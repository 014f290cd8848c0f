// SPDX-License-Identifier: MIT
// The verifiable byte pattern of generated models (wm-gen-model, the tests' writers): the byte at
// absolute file offset `o` of a data section is model_pattern_byte(o), padding included, so a
// reader of any tensor can check that it got the bytes of the right place in the right file.
#pragma once

#include <cstddef>
#include <cstdint>
#include "weightmap/span.hpp"

namespace wm::testkit {

/// Top byte of o times the 64-bit golden-ratio constant: every bit of the offset moves it, so
/// a read displaced by a page, a MiB or a GiB shows up (a plain `o * k` byte would repeat every
/// 256 bytes).
constexpr std::uint8_t model_pattern_byte(std::uint64_t offset) noexcept {
    return static_cast<std::uint8_t>((offset * 0x9E3779B97F4A7C15ull) >> 56);
}

/// Fills `out` with the pattern of the bytes at [offset, offset + out.size()).
inline void fill_model_pattern(std::uint64_t offset, Span<std::byte> out) noexcept {
    std::uint64_t x = offset * 0x9E3779B97F4A7C15ull;
    for (std::byte& b : out) {
        b = static_cast<std::byte>(x >> 56);
        x += 0x9E3779B97F4A7C15ull;
    }
}

/// Index of the first byte of `bytes` (read from absolute offset `offset`) that differs from the
/// pattern, or bytes.size() when all match.
inline std::size_t find_pattern_mismatch(std::uint64_t offset,
                                         Span<const std::byte> bytes) noexcept {
    std::uint64_t x = offset * 0x9E3779B97F4A7C15ull;
    for (std::size_t i = 0; i < bytes.size(); ++i, x += 0x9E3779B97F4A7C15ull)
        if (bytes[i] != static_cast<std::byte>(x >> 56)) return i;
    return bytes.size();
}

} // namespace wm::testkit
