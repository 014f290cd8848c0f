// SPDX-License-Identifier: MIT
// Host ranges a device may read at any moment (an HSA lock), recorded process-wide so the
// mapping layer never mprotects or munmaps them: every MMU-notifier event on a registered range
// suspends all of the process's GPU queues (~10 ms each), and with XNACK on a failed restore is
// a fatal VM_L2_PROTECTION_FAULT (docs/hsa.md). Internal only; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace wm::internal {

/// Records [address, address + size) as held by `holder` (a static string, e.g. "hsa").
/// May throw bad_alloc, with nothing recorded.
void hold_range(const void* address, std::uint64_t size, const char* holder);
/// Forgets one record made by hold_range with the same address and size. noexcept.
void drop_range(const void* address, std::uint64_t size) noexcept;
/// Empty when no held range overlaps [address, address + size); otherwise one line naming the
/// first overlapping range and its holder. noexcept: "held range" when formatting fails.
std::string held_overlap(const void* address, std::uint64_t size) noexcept;

} // namespace wm::internal
