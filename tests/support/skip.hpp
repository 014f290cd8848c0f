// SPDX-License-Identifier: MIT
// Skips that meson sees: a test case that cannot run here calls skip() and returns; when every
// case of the run passed, the Catch2 main (catch_main.cpp) exits 77, which meson reports as SKIP
// with the reason on stderr, instead of a PASS for a test that never ran. Cases that may skip
// run apart from the others (meson.build runs them with their own tag), so a skip never hides a
// case that did run.
#pragma once

#include <string>

namespace wm::test {

/// Marks this run skipped for `reason`; the caller then returns from its test case.
void skip(const std::string& reason);

} // namespace wm::test
