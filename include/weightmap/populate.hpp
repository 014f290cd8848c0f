// SPDX-License-Identifier: MIT
// populate.hpp - cold loads at disk speed: bring the planned import extents into the page cache
// with large sequential reads before they are pinned, and copy the tensors a plan leaves to the
// engine with large preads instead of through the mapping page by page.
//
// Why: a pin (HSA lock, CUDA register, mlock) or a copy through the mapping faults pages in as
// the kernel sees fit; upstream measured a cold llama.cpp load at 236 MB/s in 4 KiB requests
// where large reads of the same file ran at 1,222 MB/s (llama.cpp PR #28223: 512 s -> 168 s).
// The plan already names every byte that will be pinned or copied. docs/cold_load.md has the
// measurements (bench/bench_cold_load).
//
// Both functions only read: files are opened O_RDONLY and never written, a read-only shared
// mapping stays read-only, and RssAnon grows by read buffers alone (chunk_size per thread, only
// where one is needed: a copy to a sink, populate on a kernel before 5.14; unmapped on return).
// Every extent is checked against the caller's mapping first; a file truncated after planning is
// an error naming the file, where it now ends and the extent, never a SIGBUS.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/mapped_file.hpp"
#include "weightmap/model.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/result.hpp"
#include "weightmap/span.hpp"

namespace wm {

/// A byte range of one file of a model.
struct FileExtent {
    std::uint32_t file = 0;   ///< index into ModelDesc::files
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
};

/// The extents `plan` imports on non-CPU targets (its runs' aligned extents), overlapping and
/// touching ones merged, by file then offset.
WM_API std::vector<FileExtent> import_extents(const ModelDesc& model, const Plan& plan);

/// Shared by populate() and copy_fallback_tensors().
struct ReadOptions {
    /// Bytes per request (one madvise or pread). A thread that needs a buffer holds one of this
    /// size. 64 MiB: populate measured 1,947 MB/s at 64 MiB chunks and 1,879 at 8 MiB on one
    /// cold file (docs/cold_load.md).
    std::uint64_t chunk_size = std::uint64_t{64} << 20;
    /// Reading threads, the caller's included; 0: one per file read, at most 4 and the hardware
    /// threads (two streams on one file measured slower than one, docs/cold_load.md). Chunks are
    /// taken round-robin across files, so each file tends to be one sequential stream.
    std::uint32_t threads = 0;
    /// Called on the calling thread with the bytes done so far and the total, after each chunk
    /// the caller's thread reads (so roughly every chunk_size * threads bytes), and once more
    /// with done == total when every read succeeded and that was not the last report. Return
    /// false to cancel: the other threads stop at their next chunk and the call fails with
    /// ErrorKind::aborted (the final report's answer is ignored: nothing is left to cancel).
    /// Nothing is left locked or allocated either way.
    std::function<bool(std::uint64_t done, std::uint64_t total)> progress;
};

struct ReadReport {
    std::uint64_t bytes = 0;   ///< bytes read from the files
    double seconds = 0;        ///< wall time of the call
    /// How pages were read: "MADV_POPULATE_READ", "pread + page touch" (populate on a kernel
    /// before 5.14), "pread" (copy_fallback_tensors).
    std::string method;
};

/// Brings `extents` of the model's files into the page cache and into `files` (the model's
/// mappings) with MADV_POPULATE_READ in chunk_size pieces, in parallel, so the importer finds
/// every page present: the kernel reads a cold file sequentially this way, with no buffer and no
/// copy. The extents are advised MADV_HUGEPAGE first (advice only; it splits the caller's VMA at
/// their page-aligned edges): a cold file is then cached in PMD-sized folios where the kernel
/// and file system can, so up to 2 MiB around an extent's edges may be read too. The paths are
/// not opened then: the mappings are what is read, and a path may by now name another file.
/// On a kernel without it (EINVAL, before 5.14): the files are opened by path
/// (ModelDesc::files[i].path), checked against the extents, and chunk_size preads of them fill
/// the cache, then one load per page maps it. Errors: ErrorKind::invalid_argument for an extent
/// outside its mapping; ErrorKind::io, naming the file, for a file that cannot be opened, an
/// extent past the file's end (truncated after planning: where the file now ends, to a page on
/// 5.14 and later, and the extent), a failed read.
WM_API Result<ReadReport> populate(const ModelDesc& model, Span<const MappedFile> files,
                                   Span<const FileExtent> extents, const ReadOptions& options = {});

/// populate() of import_extents(model, plan).
WM_API Result<ReadReport> populate_imports(const ModelDesc& model, const Plan& plan,
                                           Span<const MappedFile> files,
                                           const ReadOptions& options = {});

/// Where a copied tensor goes. Exactly one of the two is set.
struct CopyDestination {
    /// Host memory of at least the tensor's size (an engine's staging or host-visible device
    /// buffer): the file is read straight into it. Null: use `sink`.
    std::function<void*(std::uint32_t tensor)> address;
    /// Receives the tensor's bytes in chunks (offset within the tensor, data valid during the
    /// call only), for memory the host cannot address (ggml_backend_tensor_set). May be called
    /// from several threads at once, for different chunks. A failed Status stops the copy.
    std::function<Status(std::uint32_t tensor, std::uint64_t offset, const void* data,
                         std::uint64_t size)>
        sink;
};

/// Copies every tensor `plan` leaves to the engine (placement run == no_index on a non-CPU
/// target) from the files with chunk_size preads, in parallel, into `destination`. Errors name
/// the file and offset (ErrorKind::io), or are the sink's own.
WM_API Result<ReadReport> copy_fallback_tensors(const ModelDesc& model, const Plan& plan,
                                                const CopyDestination& destination,
                                                const ReadOptions& options = {});

} // namespace wm
