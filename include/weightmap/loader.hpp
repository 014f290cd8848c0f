// SPDX-License-Identifier: MIT
// loader.hpp - the whole load in one call: decide the mapping, map, plan, import, re-protect.
//
// An engine that already maps its files itself can use planner.hpp + executor.hpp directly;
// load_model is the safe default that applies every rule of the mapping policy for it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "weightmap/export.h"
#include "weightmap/executor.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/model.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/result.hpp"
#include "weightmap/populate.hpp"
#include "weightmap/span.hpp"

namespace wm {

struct LoadOptions {
    MappingOptions mapping;   ///< base_alignment 0: the largest importer alignment above a page
    PlanOptions plan;
    ExecuteOptions execute;
    /// After importing, drop a writable mapping to PROT_READ when every importer that holds an
    /// import declares survives_read_only_reprotect, so a stray store faults instead of
    /// corrupting the model file. Leave it on unless measuring.
    bool reprotect_read_only = true;
    /// Where a runtime refused read-only pages (read_only_refusal_marker), execute again on a
    /// writable shared mapping when every file passes the writable rules. Off by default: the HSA
    /// lock asks write access of every page it locks (KFD's userptr path), so on a writable
    /// MAP_SHARED mapping each page is write-faulted: the model file is dirtied, its mtime moves
    /// and writeback rewrites it (docs/hsa.md). Those regions are copied instead, as upstream
    /// does. On only where the file is scratch and that is acceptable.
    bool writable_retry = false;
    /// Before importing, bring the planned import extents into the page cache with large
    /// sequential reads (populate.hpp): a pin otherwise faults a cold file in as the kernel sees
    /// fit. Off: the A/B (wm-load --no-populate). Its error (a file truncated since it was
    /// mapped, a read error: file and offset named) fails the load, before anything is imported.
    bool populate = true;
    /// Chunk size, threads and progress of that populate step.
    ReadOptions populate_options;
};

/// A loaded model: its mappings and its imports. Destruction releases the imports first, then
/// unmaps (reverse order of acquisition). Move-only. The importers must outlive it.
class WM_API LoadedModel {
public:
    LoadedModel();
    LoadedModel(LoadedModel&&) noexcept;
    LoadedModel& operator=(LoadedModel&&) noexcept;
    ~LoadedModel();

    const ModelDesc& model() const noexcept;       ///< with file sizes filled in
    const MappingDecision& mapping_decision() const noexcept;
    const MappedModel& mapping() const noexcept;
    const Placement& placement() const noexcept;
    /// Where tensor `index` lives (see Placement::locate).
    TensorLocation locate(std::uint32_t index) const;
    /// Whether the mapping ended up PROT_READ, and if a writable one stayed writable, why.
    bool read_only() const noexcept;
    const std::string& reprotect_note() const noexcept;
    /// What the populate step read, and how long it took (zero when it did not run).
    const ReadReport& populate_report() const noexcept;

    /// Releases imports, then unmaps. Idempotent; the destructor calls it.
    void unload() noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    friend Result<LoadedModel> load_model(ModelDesc, Span<Importer* const>,
                                          const LoadOptions&);
};

/// Loads `model` (its files by path; a size of 0 is filled from the file) with one importer per
/// target (`importers[target]`, null: that target falls back). Errors name the file and the
/// system call (missing, directory, empty, permission, mmap/mlock), or the tensor that ends past
/// its file's real end. Import refusals are fallbacks, not errors. Nothing stays mapped, locked
/// or imported when it fails.
/// Read-only first: the files are mapped writable up front only for an importer whose caps need
/// it. When an import on the read-only mapping is refused with read_only_refusal_marker (an HSA
/// runtime that locks read-write only), the whole execution is released and redone on a
/// writable shared mapping, if every file passes map_file_writable_shared's rules (the caller
/// owns it, owner-write bit, same inode); otherwise the read-only placement stays, those
/// regions are copies, and mapping_decision() names the file and the rule.
WM_API Result<LoadedModel> load_model(ModelDesc model, Span<Importer* const> importers,
                               const LoadOptions& options = {});

} // namespace wm
