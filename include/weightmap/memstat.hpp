// SPDX-License-Identifier: MIT
// memstat.hpp - the process's own memory, to prove (or disprove) a saving.
//
// Upstream measured the import's effect as the peak of the process's drm-total-gtt and its
// RssFile/RssAnon: the copy shows up as GTT and anonymous memory, an import as neither. Fields a
// kernel does not report are std::nullopt ("unknown"), never 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "weightmap/export.h"

namespace wm {

/// DRM memory of one region ("gtt", "vram", "system", "cpu", ...), summed over the process's
/// DRM clients (deduplicated by drm-client-id).
struct DrmMemory {
    /// Sum of drm-total-<region>; a client without that line counts drm-memory-<region>, what
    /// older amdgpu printed (never both: kernels that print both mean the same bytes).
    std::optional<std::uint64_t> total;
    std::optional<std::uint64_t> resident; ///< sum of drm-resident-<region>
};

/// One reading, in bytes.
struct MemStat {
    std::optional<std::uint64_t> rss_file;
    std::optional<std::uint64_t> rss_anon;
    std::optional<std::uint64_t> rss_shmem;
    std::optional<std::uint64_t> vm_lck;
    std::optional<std::uint64_t> vm_pin;
    std::map<std::string, DrmMemory> drm; ///< empty when the process has no DRM client
};

/// Parses the text of /proc/<pid>/status (fields in "kB"). Missing fields stay unknown.
WM_API MemStat parse_proc_status(std::string_view status_text);
/// Adds one DRM fdinfo file's memory lines to `into` (no-op for a non-DRM fd). Returns the
/// drm-client-id, or nullopt when there is none.
WM_API std::optional<std::uint64_t> parse_drm_fdinfo(std::string_view fdinfo_text,
                                              std::map<std::string, DrmMemory>& into);

/// Reads /proc/self/status and every /proc/self/fdinfo/* (each DRM client counted once).
WM_API MemStat read_memstat();

/// Field-wise peak (max of known values; unknown stays unknown only if never known).
WM_API MemStat peak_of(const MemStat& a, const MemStat& b);
/// after - before, where both are known (as a signed difference), else nullopt.
WM_API std::optional<std::int64_t> delta(const std::optional<std::uint64_t>& before,
                                  const std::optional<std::uint64_t>& after);

/// Samples read_memstat() on a background thread and keeps the peak of each field, so a load's
/// transient copy is seen even if it is freed before the load returns. start() takes a first
/// sample synchronously; stop() takes a last one and joins. Not copyable; one thread may drive it.
class WM_API MemSampler {
public:
    explicit MemSampler(std::chrono::milliseconds interval = std::chrono::milliseconds(10));
    ~MemSampler(); ///< stops if running
    MemSampler(const MemSampler&) = delete;
    MemSampler& operator=(const MemSampler&) = delete;

    void start();
    MemStat stop();           ///< the peaks over the sampling period
    MemStat first() const;    ///< the first sample of the last start()
    std::uint64_t samples() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace wm
