// SPDX-License-Identifier: MIT
// The real-runtime smoke tests' reporting (tests/hsa, tests/cuda): one line per check, a count
// of failures, and exit 77 (meson's SKIP) when the hardware part cannot run. Header-only: those
// programs link the public library alone.
#pragma once

#include <cstdio>
#include <string>

namespace wm::test::smoke {

inline constexpr int exit_skip = 77;
inline int failures = 0;

/// Prints "ok: WHAT" or "FAIL: WHAT - DETAIL" and counts a failure.
inline void check(bool ok, const char* what, const std::string& detail = {}) {
    std::printf("%s: %s%s%s\n", ok ? "ok" : "FAIL", what, detail.empty() ? "" : " - ",
                detail.c_str());
    if (!ok) ++failures;
}

} // namespace wm::test::smoke
