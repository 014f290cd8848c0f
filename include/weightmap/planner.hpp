// SPDX-License-Identifier: MIT
// planner.hpp - which mapped ranges each target may import in place, and which must fall back.
//
// The planner is a pure function: a ModelDesc in, a Plan out. It opens no file and calls no
// importer, so an engine (or wm-plan) can see the whole plan of a 19 GB model before a byte of
// it is read. It is O(n log n) in the number of tensors (docs/planner.md has the measurements)
// and safe to call from several threads at once. The environment is read only at the edge:
// make_plan resolves WEIGHTMAP_IMPORT (with getenv, once, and only when
// PlanOptions::import_enabled is unset) before planning; the planning itself reads none, so the
// same model, options and switch always give the same plan.
//
// What every plan guarantees (tests/test_planner*.cpp check each over randomised layouts):
//  * every tensor resolves: an imported tensor lies wholly inside one run's extent, and
//    extent_offset + offset_in_run == its file offset, so buffer base + offset_in_run ==
//    mapping base + file offset;
//  * extents are aligned to max(page size, importer alignment, importer tensor_alignment) and
//    end within the mapped length (the file size rounded up to whole pages);
//  * every imported tensor's offset_in_run is a multiple of its importer's tensor_alignment (a
//    device tensor whose file offset is not falls back alone);
//  * no two extents of one importer (same importer_key, same file) overlap, in every mode;
//  * mode runs: every import passes the tightness gate on its own;
//  * no import is larger than the importer's max_import_size, and no region has more than
//    max_imports_per_region imports;
//  * every tensor that falls back has a reason with the numbers.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/model.hpp"
#include "weightmap/result.hpp"

namespace wm {

/// How a (target, file) region whose tensors are interleaved with other targets' is imported.
/// All three modes then apply the size limit, the import budget and the shared-page rule.
enum class PlanMode {
    span, ///< import [first, last] of the region always (the naive upstream behaviour: a MoE
          ///< with CPU experts pins its whole file)
    gate, ///< import the span only if it passes the tightness gate, else fall back whole (the
          ///< upstream gate: that MoE imports nothing)
    runs, ///< the default. A region that passes the gate is one import, as in `gate`. One that
          ///< fails is imported as runs of its own tensors: clusters of tensors whose aligned
          ///< extents overlap (they share a page, so no import may cut inside one) are merged
          ///< where they touch and across gaps below merge_gap, smallest gaps first, each merge
          ///< only if the merged run still passes the gate. Every run is its own import and
          ///< passes the gate on its own; a cluster that cannot falls back, with the reason.
};
WM_API const char* to_string(PlanMode mode) noexcept;

/// Slack of the tightness gate: 1 MiB.
inline constexpr std::uint64_t tightness_gate_slack = std::uint64_t{1} << 20;

/// The gate's limit for a region holding `ctx_bytes` of tensor data:
/// ctx_bytes + ctx_bytes/8 + 1 MiB, saturating at UINT64_MAX instead of wrapping.
/// (Upstream's first version was written `ctx/8 + (size_t)1 << 20`, which parses as
/// `((ctx/8) + 1) << 20`: megabytes of slack that made every region look tight.)
WM_API std::uint64_t tightness_limit(std::uint64_t ctx_bytes) noexcept;

/// True when a region spanning [first, last) is tight against its ctx_bytes of tensors:
/// last - first <= tightness_limit(ctx_bytes). Requires first <= last.
WM_API bool passes_tightness_gate(std::uint64_t first, std::uint64_t last,
                           std::uint64_t ctx_bytes) noexcept;

/// Plain data; copy freely.
struct PlanOptions {
    PlanMode mode = PlanMode::runs;
    /// Host page size, a power of two; 0 asks the OS (the only OS query the planner makes).
    std::uint64_t page_size = 0;
    /// Mode runs: clusters whose aligned extents are fewer than this many bytes apart are merged
    /// into one import (extents that touch always are), as long as the merged run passes the
    /// gate. Default 1 MiB, the gate's own slack: two tensors less than that apart always pass
    /// it together. 0 merges only touching extents.
    std::uint64_t merge_gap = std::uint64_t{1} << 20;
    /// Most imports per region, every mode (HSA and Vulkan have per-allocation costs and limits);
    /// 0 counts as 1. Over it, runs are merged across the smallest gaps first (for a fixed number
    /// of imports that pins the fewest bytes when the gate and the size limit allow those
    /// merges), skipping a merge that would fail the gate (mode runs) or pass the size limit; if
    /// runs are still over the budget, those with the fewest tensor bytes fall back, each tensor
    /// saying so.
    std::uint32_t max_imports_per_region = 256;
    /// A/B switch. nullopt: make_plan (and load_model, once per load) reads WEIGHTMAP_IMPORT
    /// from the environment ("0" disables).
    /// false: every non-CPU region falls back, so one engine build measures both arms.
    std::optional<bool> import_enabled;
    /// When non-CPU targets import (a target's own TargetDesc::import_policy overrides it). The
    /// default imports only where the importer reports DeviceMemory::unified; a region of any
    /// other target falls back whole, saying why and how to import anyway.
    ImportPolicy import_policy = ImportPolicy::unified_only;
};

/// The policy that decides for `target`: its own, else the options'.
WM_API ImportPolicy effective_import_policy(const TargetDesc& target,
                                            const PlanOptions& options) noexcept;

/// Why a target served by an importer of `caps` may not import under `policy` (empty when it
/// may): the reason its regions fall back with, quoting `device_memory_note` (ImporterNotes,
/// TargetDesc) when it is not empty. CPU targets always may.
WM_API std::string import_policy_refusal(const ImporterCaps& caps, ImportPolicy policy,
                                         std::string_view device_memory_note = {});

enum class Decision { import, fallback };
WM_API const char* to_string(Decision decision) noexcept;

inline constexpr std::uint32_t no_index = std::numeric_limits<std::uint32_t>::max();

/// One import: an aligned extent of a file and the tensors it serves. The tensors of a run are
/// consecutive in the region's offset order, leaving out only tensors that fall back for the
/// importer's tensor_alignment (which lie between imported ones like another target's); runs of
/// a region are in file order and disjoint.
struct PlanRun {
    std::uint64_t first = 0;  ///< lowest tensor offset in the run
    std::uint64_t last = 0;   ///< highest tensor end in the run
    std::uint64_t extent_offset = 0; ///< first aligned down to max(page, importer alignment,
                                     ///< importer tensor_alignment)
    std::uint64_t extent_size = 0;   ///< aligned size to import; > 0, never past the mapped
                                     ///< length, never over the importer's max_import_size
    std::vector<std::uint32_t> tensors; ///< indices into ModelDesc::tensors, by offset
    std::uint64_t ctx_bytes = 0;     ///< sum of the sizes of `tensors` (what the import serves)
};

/// All tensors of one target in one file.
struct PlanRegion {
    std::uint32_t target = 0;
    std::uint32_t file = 0;
    std::uint64_t first = 0;     ///< lowest tensor offset
    std::uint64_t last = 0;      ///< highest tensor end (offset + size)
    std::uint64_t ctx_bytes = 0; ///< sum of the region's tensor sizes
    bool gate = false;           ///< the whole region passes the tightness gate
    Decision decision = Decision::fallback; ///< import: at least one run
    /// Why it falls back (numbers included), or how it imports: the mode's decision, then what
    /// changed it (runs merged across small gaps, cuts for the gate or the size limit, budget
    /// merges, tensors left out for shared pages or for any other reason, with counts).
    std::string reason;
    std::vector<std::uint32_t> tensors; ///< sorted by offset
    std::vector<PlanRun> runs;   ///< the imports; empty when decision is fallback
};

/// Where one tensor ends up.
struct TensorPlacement {
    std::uint32_t region = no_index;
    std::uint32_t run = no_index;     ///< no_index: the tensor falls back (device copy)
    std::uint64_t offset_in_run = 0;  ///< tensor offset - run extent_offset
    /// Empty when imported. Otherwise why: the region's reason when the whole region falls back,
    /// or this tensor's own (a cluster that fails the gate, a tensor over the size limit, an
    /// extent past the mapped length, the import budget, a page shared with another import, an
    /// offset that is not a multiple of the importer's tensor_alignment, an import the importer
    /// refused when the plan was executed).
    std::string reason;
};

/// Totals over the non-CPU targets (CPU passthrough pins nothing and is not counted).
struct PlanTotals {
    std::uint64_t device_bytes = 0;   ///< tensor bytes on non-CPU targets
    std::uint64_t imported_bytes = 0; ///< of those, tensor bytes served by an import
    std::uint64_t pinned_bytes = 0;   ///< sum of non-CPU extents (what imports pin)
    std::uint64_t fallback_bytes = 0; ///< device bytes that are copied instead
    std::uint64_t imports = 0;        ///< number of non-CPU imports
};

struct Plan {
    PlanMode mode = PlanMode::runs;
    /// PlanOptions::import_policy, which the executor applies again to the caps the importers
    /// report when it runs (a plan made from what-if caps never imports on a discrete device).
    ImportPolicy import_policy = ImportPolicy::unified_only;
    std::uint64_t page_size = 0;
    std::vector<PlanRegion> regions;       ///< ordered by (target, file)
    std::vector<TensorPlacement> tensors;  ///< parallel to ModelDesc::tensors
    PlanTotals totals;
};

/// Plans `model`. Fails (invalid_argument) only for an inconsistent description: a file or target
/// index out of range, a tensor whose offset + size overflows or passes its file's size, a
/// tensor whose end rounded up to its target's extent alignment (the page; for a device also
/// the importer's alignment and tensor_alignment) passes 2^64, tensor sizes that sum past 2^64, 2^32 - 1 tensors or more, a page size, an alignment or a
/// tensor_alignment (other than 0) that is not a power of two. Import refusals are not errors:
/// they are fallbacks with reasons.
/// Tensors may overlap and come in any order; the plan does not depend on their order.
WM_API Result<Plan> make_plan(const ModelDesc& model, const PlanOptions& options = {});

/// Recomputes plan.totals from its regions and placements (after the executor turned some
/// imports into fallbacks, say). Defined for any input: a tensor, region or target index out of
/// range (an edited plan, a plan of another model) counts as not imported, a target out of
/// range as the CPU (not counted); plan.tensors shorter than model.tensors leaves the rest
/// counted as fallbacks.
WM_API PlanTotals compute_totals(const ModelDesc& model, const Plan& plan);

/// The host page size (sysconf), cached.
WM_API std::uint64_t host_page_size() noexcept;

} // namespace wm
