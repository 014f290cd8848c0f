// SPDX-License-Identifier: MIT
// importer.hpp - the one small interface every importer implements.
//
// An importer makes a host range (a piece of the weight file's mapping) usable by one device in
// place, without copying it. Capabilities are data, declared by the importer; the planner and the
// mapping policy read them and never guess from a name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "weightmap/export.h"
#include "weightmap/import_policy.hpp"
#include "weightmap/result.hpp"

namespace wm {

/// The phrase an import() refusal carries (ErrorKind::import_failed) when the runtime refused the
/// range only because its pages are not writable, so the same file mapped writable shared would
/// import: an HSA runtime that locks read-write. load_model looks for it in the fallback reasons
/// and retries on a writable mapping where map_file_writable_shared's rules allow (mapping.hpp);
/// an engine's own loader and its logs can do the same.
inline constexpr std::string_view read_only_refusal_marker = "refused a read-only lock";

/// What an importer needs and can do. Plain data (trivially copyable; the notes that explain it
/// are ImporterNotes); copy freely.
struct ImporterCaps {
    /// The import always needs PROT_WRITE pages. Only non-CPU importers may set it; it is what
    /// makes the mapping policy map weight files writable from the start. An importer that only
    /// sometimes needs them (HSA: it depends on the runtime) leaves it false and refuses with
    /// read_only_refusal_marker instead, so read-only is tried first.
    bool needs_writable_mapping = false;
    /// Required alignment of both the start address and the size of an import, in bytes; a power
    /// of two. The planner aligns every extent to max(page size, alignment).
    std::uint64_t alignment = 1;
    /// Largest single import in bytes; 0 means no limit (Vulkan: maxMemoryAllocationSize).
    std::uint64_t max_import_size = 0;
    /// The alignment every tensor's offset inside its import must meet, in bytes: an engine's
    /// buffer-type alignment (ggml-vulkan's is minStorageBufferOffsetAlignment, up to 256 on
    /// real drivers, while GGUF aligns tensor data to only 32 by default). 0 or 1: none;
    /// otherwise a power of two. The planner aligns every extent to max(page size, alignment,
    /// tensor_alignment), so a tensor's offset in its import is a multiple of it exactly when its
    /// file offset is; a device tensor whose file offset is not falls back alone, with the
    /// numbers, and the rest of its region is planned around it. Ignored for the CPU.
    std::uint64_t tensor_alignment = 1;
    /// This is the CPU: imports are passthrough, pin nothing and never need a writable mapping.
    bool is_cpu = false;
    /// An import stays valid after the mapping is re-protected PROT_READ, so the mapping layer
    /// may drop write access once importing is done and a stray store faults instead of
    /// corrupting the model file.
    bool survives_read_only_reprotect = false;
    /// The device cannot import pages of a file mapping (the weights' page cache), as the
    /// importer's own probe found. The planner then makes every region of such an importer a
    /// fallback, with ImporterNotes::file_pages as the reason (docs/vulkan.md, "Drivers": RADV).
    /// False by default, so that a zeroed C struct means the defaults.
    bool refuses_file_pages = false;
    /// How the device reaches imported memory (import_policy.hpp): what decides, under the
    /// default ImportPolicy::unified_only, whether the target imports at all. Unknown by
    /// default, which falls back: an importer must say unified for its imports to be planned.
    DeviceMemory device_memory = DeviceMemory::unknown;
};

/// The explanations behind some caps, for messages. Views of NUL-terminated strings the importer
/// owns, valid for the importer's lifetime (never longer: copy them to keep them). A later call may
/// return another note (the CUDA importer's method can switch), never change one handed out.
/// Why apart from ImporterCaps: caps are plain data read on every import, and reading them must
/// neither allocate nor race with another thread's read (the C API hands out these pointers).
struct ImporterNotes {
    /// Why refuses_file_pages is set: the driver and what its probe returned. Empty otherwise.
    std::string_view file_pages{};
    /// What device_memory was read from: "VkPhysicalDeviceType INTEGRATED_GPU",
    /// "HSA_AGENT_INFO_PROFILE BASE, SVM_DIRECT_HOST_ACCESS false". May be empty.
    std::string_view device_memory{};
    /// Where alignment comes from ("max of minImportedHostPointerAlignment 4096 and the page
    /// size 4096"); import() adds it to a refusal. May be empty.
    std::string_view alignment{};
    /// Where max_import_size comes from ("the device's maxMemoryAllocationSize on 'llvmpipe'");
    /// import() adds it to a refusal. May be empty.
    std::string_view max_import_size{};
};

/// Whether an importer can be used on this machine, and why not.
struct Availability {
    bool available = false;
    std::string reason; ///< empty when available; otherwise names what is missing
};

/// One imported range. Owned by whoever called import(); hand it back to the same importer's
/// release() exactly once.
struct ImportedBuffer {
    void* host_address = nullptr;   ///< the aligned host address that was imported
    std::uint64_t size = 0;         ///< bytes imported from host_address (aligned)
    void* device_address = nullptr; ///< address the device uses (HSA agent pointer; CPU: host)
    std::uint64_t native_memory = 0; ///< backend object, e.g. VkDeviceMemory; 0 if none
    std::uint64_t native_buffer = 0; ///< backend object, e.g. VkBuffer; 0 if none
    /// Always true for a buffer returned by import(): it wraps memory the device did not
    /// allocate, so an engine must never return it to a device pool (upstream flags the buffer
    /// context the same way; releasing an imported range to the pool corrupts its accounting).
    bool imported = true;
};

/// The importer interface. Implementations must make import() and release() safe to call
/// concurrently from several threads (engines load several models at once).
class WM_API Importer {
public:
    /// Forgets its live imports (they must have been released: see release()).
    virtual ~Importer();

    /// Short stable name: "cpu", "vulkan", "hsa", "cuda", or a test's own.
    virtual std::string_view name() const noexcept = 0;
    /// Plain data: allocates nothing, and may be read from several threads at once.
    virtual ImporterCaps caps() const noexcept = 0;
    /// Why the caps are what they are. Owned by the importer, fixed for its lifetime. Default:
    /// both empty.
    virtual ImporterNotes notes() const noexcept;
    /// Cheap after the first call. When false, reason says what is missing.
    virtual Availability available() const = 0;

    /// Imports [host_address, host_address + size). Checks the preconditions here, once, for
    /// every backend: host_address not null, size > 0, both multiples of caps().alignment, the
    /// range not wrapping the address space (ErrorKind::invalid_argument), size <=
    /// max_import_size when that is set (ErrorKind::limit); then calls import_checked(), and
    /// checks its result: a buffer whose host_address is not the one asked for or whose size is
    /// smaller is released again and refused (ErrorKind::import_failed, "returned ... for ...").
    /// Out of memory is ErrorKind::out_of_memory, with nothing imported. On failure the
    /// error's message is the backend's own reason (status string, VkResult name); nothing
    /// stays imported. A buffer it returns is a live import of this importer until release().
    Result<ImportedBuffer> import(void* host_address, std::uint64_t size);

    /// Releases a live import (a buffer import() returned, not yet released) through
    /// release_checked(). Anything else - released already, never imported, another importer's,
    /// a copy with any field changed - is ErrorKind::invalid_argument and reaches no backend.
    /// A backend's failure is reported (for the log) but the buffer is no longer live either
    /// way: never release it twice.
    Status release(const ImportedBuffer& buffer) noexcept;

    // --- optional entries, with documented defaults -------------------------------------------
    // Used by verification (wm-load) and by the copy control arm; an engine needs none of them.

    /// Copies `size` bytes at `offset` of `buffer` *as the device sees them* into `dst`
    /// (Vulkan: through a transfer into a host-visible buffer), through read_back_checked().
    /// `buffer` is a live import of this importer (else ErrorKind::invalid_argument: a released
    /// or forged buffer's address may be unmapped), or one of its allocate_copy() buffers
    /// (imported = false, which the backend checks itself); [offset, +size) lies inside it.
    Status read_back(const ImportedBuffer& buffer, std::uint64_t offset, std::uint64_t size,
                     void* dst);

    /// The control arm: allocates a buffer on this importer's device and copies `size` bytes
    /// from `src` into it, as an engine without imports would. The result has imported = false
    /// and is freed with free_copy(). Default: `unsupported`.
    virtual Result<ImportedBuffer> allocate_copy(const void* src, std::uint64_t size);

    /// Frees a buffer from allocate_copy(). Default: `unsupported`.
    virtual Status free_copy(const ImportedBuffer& buffer) noexcept;

protected:
    /// import() after its precondition checks passed: the backend's own work. It may throw
    /// std::bad_alloc (import() reports out_of_memory) only with nothing left imported.
    virtual Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) = 0;

    /// release() of a buffer it checked is a live import of this importer.
    virtual Status release_checked(const ImportedBuffer& buffer) noexcept = 0;

    /// read_back() of a live import or an allocate_copy() buffer, the range checked to lie
    /// inside it. Default: for an import, memcpy from buffer.device_address when it is set (CPU,
    /// and HSA where the agent pointer is host-accessible), otherwise `unsupported`; for a copy,
    /// `unsupported` (the default allocate_copy() makes none).
    virtual Status read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                                     std::uint64_t size, void* dst);
};

} // namespace wm
