// SPDX-License-Identifier: MIT
// What a backend may attach to a Placement so that it is released with it (and before its
// imports): cuda_pin_fallbacks' page-locked fallback ranges. Internal: Placement's layout and
// its public API stay as they are.
#pragma once

#include <functional>

#include "weightmap/executor.hpp"

namespace wm::internal {

struct PlacementAccess {
    /// `release` runs once, from Placement::release_all() or the destructor, before the
    /// imports are released; attachments run last attached first. Must not throw.
    static void attach(Placement& placement, std::function<void()> release);
};

} // namespace wm::internal
