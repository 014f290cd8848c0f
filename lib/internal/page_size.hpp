// SPDX-License-Identifier: MIT
// The host page size, for the layers below the planner (mapping, populate, the importers): they
// include this leaf, not weightmap/planner.hpp, to find it. The same exported function that
// weightmap/planner.hpp declares for engines; defined in lib/page_size.cpp.
#pragma once

#include <cstdint>

#include "weightmap/export.h"

namespace wm {

/// The host page size (sysconf), cached.
WM_API std::uint64_t host_page_size() noexcept;

} // namespace wm
