// SPDX-License-Identifier: MIT
// executor.hpp - carrying out a plan: import every region through its target's importer.
//
// A refused import is not an error: that run falls back alone (the engine copies its tensors to
// a device buffer as it always did, each tensor carrying the importer's reason) and a warning
// names it; the region's other runs stay imported, and the region is a fallback only when none
// of its runs is. A refusal of the whole target (no importer, an unavailable importer, the import
// policy) makes each of its regions a fallback. Only an unusable call (wrong number of files or
// importers) or the caller's abort fails the execution, and then every import already made is
// released before the call returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "weightmap/export.h"
#include "weightmap/importer.hpp"
#include "weightmap/log.hpp"
#include "weightmap/mapped_file.hpp"
#include "weightmap/model.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/result.hpp"
#include "weightmap/span.hpp"

namespace wm {

namespace internal {
struct PlacementAccess; // lib/executor/placement_access.hpp: what backends attach to a Placement
}

struct ExecuteOptions {
    LogCallback log;             ///< empty: the process-wide default (stderr)
    /// Called after each import with the extent bytes imported so far and the total planned.
    /// Return false to abort: every import made so far is released and the call fails with
    /// ErrorKind::aborted.
    std::function<bool(std::uint64_t done, std::uint64_t total)> progress;
};

/// Where one tensor lives after execution.
struct TensorLocation {
    bool imported = false;                 ///< false: fallback, the engine copies it
    const ImportedBuffer* buffer = nullptr; ///< the import serving it, when imported
    std::uint32_t import_index = no_index; ///< that import's index for Placement::import_at()
    std::uint64_t offset_in_buffer = 0;    ///< buffer->host_address + this == host_address
    const std::byte* host_address = nullptr; ///< the tensor's bytes in the mapping (always set)
    std::string_view reason;               ///< why it falls back; empty when imported
};

/// One live import of a placement and what it serves: an engine wraps one device buffer around
/// each (ggml: one buffer per import, the tensors at buffer base + offset_in_buffer).
struct PlacedImport {
    /// Owned by the Placement; null only for an index out of range (then every index below is
    /// no_index and `tensors` is empty).
    const ImportedBuffer* buffer = nullptr;
    std::uint32_t target = 0;        ///< index into ModelDesc::targets
    std::uint32_t file = 0;          ///< index into ModelDesc::files
    std::uint32_t region = 0;        ///< index into plan().regions
    std::uint32_t run = 0;           ///< index into plan().regions[region].runs
    std::uint64_t extent_offset = 0; ///< file offset of buffer->host_address
    Span<const std::uint32_t> tensors; ///< indices into ModelDesc::tensors served, by offset;
                                       ///< points into plan(), valid as long as the Placement
};

/// The imports of one executed plan. Owns them: destruction (or release_all()) releases every
/// import through its importer, in reverse order of import. Move-only. The importers and the
/// mappings must outlive it; the ModelDesc need not (what locate() needs is copied). Reading
/// from several threads is safe; releasing is not concurrent with reading.
class WM_API Placement {
public:
    Placement();
    Placement(Placement&&) noexcept;
    Placement& operator=(Placement&&) noexcept;
    ~Placement();

    /// The plan as executed: a refused run is gone from its region's runs (the later runs
    /// move down one index; PlacedImport::run and TensorPlacement::run name the runs here), its
    /// tensors fall back with the importer's reason, a region left without runs is a fallback,
    /// and the totals are recomputed.
    const Plan& plan() const noexcept;
    /// Location of tensor `index` of the ModelDesc. An index out of range gets imported =
    /// false, host_address = nullptr and the reason "tensor index out of range".
    TensorLocation locate(std::uint32_t index) const;
    /// Live imports (non-CPU and CPU alike); 0 after release_all().
    std::size_t import_count() const noexcept;
    /// Live import `index` (< import_count()), in order of import: (target, file) region order,
    /// runs in file order. The buffer pointer is the one locate() returns for its tensors. An
    /// index >= import_count() (a caller's mistake, in release builds too) gives a PlacedImport
    /// whose buffer is null and whose indices are no_index.
    PlacedImport import_at(std::size_t index) const noexcept;
    /// Releases everything now; idempotent. Release failures are logged, never retried.
    void release_all() noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    friend struct internal::PlacementAccess;
    friend Result<Placement> execute_plan(const ModelDesc&, Plan, Span<const MappedFile>,
                                          Span<Importer* const>, const ExecuteOptions&);
};

/// Executes `plan` (made from `model`) over `files` (one per ModelDesc::files entry), importing
/// each region through `importers[region.target]` (one per target; null means "no importer": the
/// region falls back). Checks before each import that the extent lies inside the mapped length
/// and that its address meets the importer's alignment; a violation, like an importer's error,
/// makes that run alone a fallback.
/// The plan is checked against the model first: a region, run or placement whose target, file,
/// tensor, region or run index is out of range or inconsistent fails with invalid_argument, and
/// so does a tensor that does not lie inside files[tensor.file] (a mapping shorter than the
/// file): every address the placement hands out, a fallback tensor's included, is inside the
/// mapping it came from.
WM_API Result<Placement> execute_plan(const ModelDesc& model, Plan plan,
                               Span<const MappedFile> files,
                               Span<Importer* const> importers,
                               const ExecuteOptions& options = {});

} // namespace wm
