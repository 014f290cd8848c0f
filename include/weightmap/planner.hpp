// SPDX-License-Identifier: MIT
// planner.hpp - which mapped ranges each target may import in place, and which must fall back.
//
// The planner is a pure function: a ModelDesc in, a Plan out. It opens no file and calls no
// importer, so an engine (or wm-plan) can see the whole plan of a 19 GB model before a byte of
// it is read.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "weightmap/model.hpp"
#include "weightmap/result.hpp"

namespace wm {

/// How a (target, file) region that holds tensors of several placements is imported.
enum class PlanMode {
    span, ///< import [first, last] of the region always (the naive upstream behaviour)
    gate, ///< import the span only if it passes the tightness gate, else fall back whole
    runs, ///< import tight runs of the region's own tensors (the default)
};
const char* to_string(PlanMode mode) noexcept;

/// Slack of the tightness gate: 1 MiB.
inline constexpr std::uint64_t tightness_gate_slack = std::uint64_t{1} << 20;

/// The gate's limit for a region holding `ctx_bytes` of tensor data:
/// ctx_bytes + ctx_bytes/8 + 1 MiB, saturating at UINT64_MAX instead of wrapping.
/// (Upstream's first version was written `ctx/8 + (size_t)1 << 20`, which parses as
/// `((ctx/8) + 1) << 20`: megabytes of slack that made every region look tight.)
std::uint64_t tightness_limit(std::uint64_t ctx_bytes) noexcept;

/// True when a region spanning [first, last) is tight against its ctx_bytes of tensors:
/// last - first <= tightness_limit(ctx_bytes). Requires first <= last.
bool passes_tightness_gate(std::uint64_t first, std::uint64_t last,
                           std::uint64_t ctx_bytes) noexcept;

struct PlanOptions {
    PlanMode mode = PlanMode::runs;
    /// Host page size; 0 asks the OS (the only OS query the planner makes).
    std::uint64_t page_size = 0;
    /// mode runs: runs closer than this are merged into one import.
    std::uint64_t merge_gap = std::uint64_t{1} << 20;
    /// mode runs: most imports per region; more runs are merged across the smallest gaps.
    std::uint32_t max_imports_per_region = 256;
    /// A/B switch. nullopt: read WEIGHTMAP_IMPORT from the environment ("0" disables).
    /// false: every non-CPU region falls back, so one engine build measures both arms.
    std::optional<bool> import_enabled;
};

enum class Decision { import, fallback };
const char* to_string(Decision decision) noexcept;

inline constexpr std::uint32_t no_index = std::numeric_limits<std::uint32_t>::max();

/// One import: an aligned extent of a file and the tensors it serves.
struct PlanRun {
    std::uint64_t first = 0;  ///< lowest tensor offset in the run
    std::uint64_t last = 0;   ///< highest tensor end in the run
    std::uint64_t extent_offset = 0; ///< first aligned down to the import alignment
    std::uint64_t extent_size = 0;   ///< aligned size to import; never past the mapped length
    std::vector<std::uint32_t> tensors; ///< indices into ModelDesc::tensors
};

/// All tensors of one target in one file.
struct PlanRegion {
    std::uint32_t target = 0;
    std::uint32_t file = 0;
    std::uint64_t first = 0;     ///< lowest tensor offset
    std::uint64_t last = 0;      ///< highest tensor end (offset + size)
    std::uint64_t ctx_bytes = 0; ///< sum of the region's tensor sizes
    bool gate = false;           ///< the whole region passes the tightness gate
    Decision decision = Decision::fallback;
    std::string reason;          ///< why it falls back (numbers included), or how it imports
    std::vector<std::uint32_t> tensors; ///< sorted by offset
    std::vector<PlanRun> runs;   ///< the imports; empty when decision is fallback
};

/// Where one tensor ends up.
struct TensorPlacement {
    std::uint32_t region = no_index;
    std::uint32_t run = no_index;     ///< no_index: the tensor falls back (device copy)
    std::uint64_t offset_in_run = 0;  ///< tensor offset - run extent_offset
    std::string reason;               ///< set when this tensor alone falls back
};

struct PlanTotals {
    std::uint64_t device_bytes = 0;   ///< tensor bytes on non-CPU targets
    std::uint64_t imported_bytes = 0; ///< of those, tensor bytes served by an import
    std::uint64_t pinned_bytes = 0;   ///< sum of non-CPU extents (what imports pin)
    std::uint64_t fallback_bytes = 0; ///< device bytes that are copied instead
    std::uint64_t imports = 0;        ///< number of non-CPU imports
};

struct Plan {
    PlanMode mode = PlanMode::runs;
    std::uint64_t page_size = 0;
    std::vector<PlanRegion> regions;       ///< ordered by (target, file)
    std::vector<TensorPlacement> tensors;  ///< parallel to ModelDesc::tensors
    PlanTotals totals;
};

/// Plans `model`. Fails (invalid_argument) only for an inconsistent description: a file or target
/// index out of range, a tensor whose offset + size overflows or passes its file's size, an
/// alignment that is not a power of two. Import refusals are not errors: they are fallbacks.
Result<Plan> make_plan(const ModelDesc& model, const PlanOptions& options = {});

/// Recomputes plan.totals from its regions and placements (after the executor turned some
/// imports into fallbacks, say).
PlanTotals compute_totals(const ModelDesc& model, const Plan& plan);

/// The host page size (sysconf), cached.
std::uint64_t host_page_size() noexcept;

} // namespace wm
