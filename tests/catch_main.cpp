// SPDX-License-Identifier: MIT
// The one Catch2 main every test executable links (Debian's Catch2 2.13 has no catch2-with-main
// and no SKIP): it maps a run whose cases all passed but one skipped (support/skip.hpp) to exit
// status 77, meson's SKIP.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <mutex>
#include <string>

#include "support/skip.hpp"

namespace {
std::mutex skip_mutex;
std::string skip_reasons; // "; "-separated; empty: nothing skipped
} // namespace

void wm::test::skip(const std::string& reason) {
    std::lock_guard lock(skip_mutex);
    skip_reasons += (skip_reasons.empty() ? "" : "; ") + reason;
    std::fprintf(stderr, "SKIP: %s\n", reason.c_str());
}

int main(int argc, char* argv[]) {
    const int failed = Catch::Session().run(argc, argv);
    std::lock_guard lock(skip_mutex);
    if (failed != 0 || skip_reasons.empty()) return failed;
    std::fprintf(stderr, "exit 77 (SKIP): %s\n", skip_reasons.c_str());
    return 77;
}
