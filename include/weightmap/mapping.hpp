// SPDX-License-Identifier: MIT
// mapping.hpp - mapping weight files safely: shared read-only by default, writable shared only
// when an importer needs it, never private-writable, never left writable longer than needed.
//
// Why these rules (measured upstream, docs/mapping.md has the measurements):
// * Some runtimes lock only writable pages (older ROCm: hsa_amd_memory_lock of a PROT_READ
//   mapping fails). The loader maps read-only first and goes writable only for such a refusal,
//   and only under the rules of map_file_writable_shared (owner, owner-write bit, same inode).
// * It must be MAP_SHARED. MAP_POPULATE and mlock fault pages in with write intent, which breaks
//   copy-on-write on a private writable mapping and copies the whole file into anonymous memory
//   (+1024 MiB RssAnon for a 1 GiB file). A shared mapping keeps every page in the page cache.
// * A writable shared mapping of a user's model file is a loaded gun: one stray store corrupts
//   the file on disk. So it is used only when needed and dropped to PROT_READ after importing
//   wherever the importers allow it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/import_policy.hpp"
#include "weightmap/importer.hpp"
#include "weightmap/mapped_file.hpp"
#include "weightmap/result.hpp"
#include "weightmap/span.hpp"

namespace wm {

/// The only two ways libweightmap maps a weight file. Both are MAP_SHARED; there is no way to ask
/// for a private writable mapping.
enum class MappingAccess {
    read_only, ///< O_RDONLY, PROT_READ, MAP_SHARED (the default)
    /// PROT_READ|PROT_WRITE, MAP_SHARED (only when an importer needs it), opened O_RDONLY and
    /// reopened O_RDWR under map_file_writable_shared's rules
    writable,
};
WM_API const char* to_string(MappingAccess access) noexcept;

/// The once-per-model decision and why.
struct MappingDecision {
    MappingAccess access = MappingAccess::read_only;
    /// One line: which importer asked for writable pages and whether every file allowed it.
    std::string reason;
    /// Set when an importer needed a writable mapping but this file's rules refused it;
    /// the regions of such importers fall back with "weight file not writable: PATH".
    std::string unwritable_path;
};

/// Decides the mapping of a model of `paths` (all shards: the rule is all-or-nothing) for
/// `importers`. Writable only when at least one available, non-CPU importer has
/// caps().needs_writable_mapping and every file passes map_file_writable_shared's rules: owned by
/// the effective uid with the owner-write bit (not open(O_RDWR), which root passes on a 0444
/// file), then reopened O_RDWR through /proc/self/fd (which also sees read-only mounts). An empty `importers` means the
/// registry's defaults (upstream's first version only walked the explicit list and so never saw
/// the capability). An importer whose caps `policy` refuses (a discrete or unknown device under
/// unified_only: it will not import) does not count. Never fails: an unreadable file is the
/// mapping's error, not the decision's.
WM_API MappingDecision decide_mapping(Span<const std::string> paths,
                                      Span<Importer* const> importers,
                                      ImportPolicy policy = ImportPolicy::unified_only);

/// Makes a writable MAP_SHARED mapping of the file open read-only at `fd`, for an importer whose
/// runtime refused to lock read-only pages. `fd` stays the caller's. Reopens the file through
/// /proc/self/fd/N with O_RDWR|O_CLOEXEC only when (a) the process's effective uid owns it AND
/// its mode has the owner-write bit (root's override of mode bits is not taken: a 0444 file
/// owned by root stays read-only for root), and (b) the reopened descriptor is the same inode
/// (st_dev, st_ino) as `fd`; then maps [0, length) PROT_READ|PROT_WRITE, MAP_SHARED, at a
/// page-aligned address, and closes the reopened descriptor (the mapping keeps the file).
/// `length` 0: the whole file; more than the file's size is refused (past the end a shared
/// mapping raises SIGBUS). The result's length is `length` rounded up to pages; the caller
/// unmaps it with munmap(base, length). Never throws: a rule's refusal is invalid_argument
/// naming the file and the rule, a failing system call is io (EROFS: a read-only mount).
/// Thread-safe.
WM_API Result<MappedFile> map_file_writable_shared(int fd, std::uint64_t length = 0) noexcept;

enum class AccessHint { normal, random, sequential };

struct MappingOptions {
    bool populate = false;  ///< MAP_POPULATE: fault every page in while mapping
    bool will_need = false; ///< madvise(MADV_WILLNEED): start read-ahead, do not wait
    bool lock = false;      ///< mlock the whole mapping (needs RLIMIT_MEMLOCK or CAP_IPC_LOCK)
    AccessHint hint = AccessHint::normal; ///< madvise MADV_RANDOM / MADV_SEQUENTIAL
    /// Base address alignment of each mapping, a power of two (one below the page size, and 0,
    /// mean the page size; anything else is invalid_argument). Set it to the largest importer
    /// alignment when that exceeds the page, so an extent aligned in file offsets is aligned in
    /// memory too.
    std::uint64_t base_alignment = 0;
};

/// The mappings of one model's files. Owns them: destruction unlocks and unmaps in reverse
/// order; a mapping an importer still holds locked (an HSA lock: the device may read it) is
/// left mapped instead, with an error through the log callback - release the placement first. Move-only. Not thread-safe to mutate (make_read_only) while another thread reads
/// files(); reading the mapped bytes from any thread is fine.
class WM_API MappedModel {
public:
    MappedModel();
    MappedModel(MappedModel&&) noexcept;
    MappedModel& operator=(MappedModel&&) noexcept;
    ~MappedModel();

    /// Maps every file in `paths` with `access`. Errors name the file and the system call:
    /// missing file, a directory, an empty file, permission denied, mmap/mlock failure. If file
    /// k fails, files 0..k-1 are unmapped before returning.
    static Result<MappedModel> open(Span<const std::string> paths, MappingAccess access,
                                    const MappingOptions& options = {});

    /// One entry per path, in order: base and mapped length (file size rounded up to pages).
    Span<const MappedFile> files() const noexcept;
    /// Real file sizes, parallel to files().
    Span<const std::uint64_t> file_sizes() const noexcept;
    const std::vector<std::string>& paths() const noexcept;
    MappingAccess access() const noexcept;
    /// True once make_read_only() succeeded (or the mapping was read-only from the start).
    bool is_read_only() const noexcept;

    /// Drops a writable mapping to PROT_READ (mprotect) so a stray store faults instead of
    /// corrupting the file. Call it only when every importer that imported from the mapping
    /// declares survives_read_only_reprotect. Idempotent; on failure the mapping stays writable
    /// and the error names the file. Refused (invalid_argument, nothing mprotected) while any
    /// byte of the mapping is locked by an importer that must not see an mprotect (HSA).
    Status make_read_only();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace wm
