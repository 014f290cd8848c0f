// SPDX-License-Identifier: MIT
// The one Catch2 main every test executable links (Debian's Catch2 2.13 has no catch2-with-main).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
