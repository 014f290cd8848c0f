// SPDX-License-Identifier: MIT
// What the HSA importer does to a range's pages before and around hsa_amd_memory_lock. Private
// to backends/hsa.
#pragma once

#include <cstdint>

namespace wm::hsa {

/// Brings [address, address + size) (page-aligned) into the page cache and into the mapping in
/// large requests: MADV_WILLNEED, then MADV_POPULATE_READ (Linux 5.14+), else one read per page.
/// Why: pinning faults file pages in one at a time otherwise (rocm-systems#11171), and every
/// fault-driven readahead on a registered range is an MMU-notifier event that stalls the GPU
/// queues. Best effort: false when a step failed, never fatal (the lock faults the rest in).
bool populate_for_lock(void* address, std::uint64_t size) noexcept;

/// Whether every page of [address, address + size) is in a mapping with write permission
/// (/proc/self/maps). False when it cannot tell.
bool range_writable(const void* address, std::uint64_t size) noexcept;

} // namespace wm::hsa
