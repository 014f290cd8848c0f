// SPDX-License-Identifier: MIT
// backends/hsa.hpp - the HSA importer: hsa_amd_memory_lock of the weight mapping (AMD APUs).
//
// On an APU (Strix Halo, gfx1151) the GPU reads system memory, so locking the page-cache pages
// of the model file makes them device memory in place: the device copy and its GTT vanish
// (docs/hsa.md has the measurement).
//
// This header does not include the HSA headers: agents are their 64-bit `hsa_agent_t::handle`.
// The runtime (libhsa-runtime64.so.1) is loaded with dlopen when the importer is made, so one
// build of libweightmap runs on machines without ROCm; there the importer exists and says why it
// is not available.
//
// Declared and defined always. In a build without the HSA importer (meson -Dhsa=disabled, or no
// HSA headers of libhsa-runtime-dev) make_hsa_importer(), hsa_lock_superset() and
// hsa_lock_agent_count() return
// ErrorKind::unsupported, "unavailable: built without HSA support (...)", so an engine links
// against any build. registry.hpp's importer_registry() says whether it is built.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/importer.hpp"
#include "weightmap/result.hpp"

namespace wm {

/// How to make an HSA importer. Plain data; the defaults are what create_importer("hsa") uses.
struct HsaImporterParams {
    /// The HSA runtime to dlopen. Empty: $WEIGHTMAP_HSA_LIBRARY when set and non-empty, else
    /// "libhsa-runtime64.so.1" (the dynamic linker's search path). Tests point it at a fake.
    /// Engines that already use HSA should leave the default: dlopen of the same library returns
    /// the engine's own instance, so agent handles and locks are shared with the engine.
    std::string library_path;
    /// The agents that must see the locked memory, as hsa_agent_t::handle values the engine got
    /// from the same runtime (hsa_iterate_agents). The engine owns its agents; the importer
    /// only passes them to hsa_amd_memory_lock. Every handle must be non-zero, appear once, and
    /// be one of the runtime's agents (checked by enumeration, never by dereferencing it).
    /// Empty: every agent of device type GPU, in the runtime's order.
    std::vector<std::uint64_t> agents;
    /// Most bytes this importer may hold locked at once; 0: no budget. An import that would
    /// take the live locked bytes past it is refused (ErrorKind::limit) before the runtime is
    /// called, so that region falls back: the importer's own backstop against a sparse region
    /// pinning a whole file, behind the planner's tightness gate. Not reported as
    /// caps().max_import_size, on purpose (docs/hsa.md, "Sparse regions").
    std::uint64_t lock_budget_bytes = 0;
    /// How the agents reach host memory, when the engine knows better than the runtime: unknown
    /// (the default) reads it from the runtime. A FULL profile, or AGENT_IS_APU in
    /// HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES (runtimes after ROCm 5.2), is unified; that attribute
    /// without the bit is discrete; ROCm 5.2 on a BASE-profile agent cannot tell an APU from a
    /// discrete card, which is unknown (docs/hsa.md). caps().device_memory is the result.
    DeviceMemory device_memory = DeviceMemory::unknown;
};

/// Makes an HSA importer: loads the runtime, calls hsa_init once (the runtime reference-counts
/// it, so an engine's own hsa_init is unaffected) and settles the agents.
///
/// Caps: needs_writable_mapping = false (read-only first: a runtime that accepts file-backed
/// read-only pages locks them as they are, and a writable mapping would make KFD ask write
/// access of every page), alignment = the host page size (an unaligned address fails with a
/// bare HSA_STATUS_ERROR), max_import_size = 0, is_cpu = false, survives_read_only_reprotect =
/// false (every mprotect of a locked range is an MMU-notifier event: ~10 ms of suspended GPU
/// queues, and with XNACK on a failed restore is a fatal fault; see docs/hsa.md).
///
/// import(address, size) requires both to be page-aligned and refuses anything else with
/// invalid_argument without calling the runtime; use hsa_lock_superset() for an arbitrary range.
/// It locks for exactly the agents settled here, returns device_address = the agent pointer
/// hsa_amd_memory_lock returned and imported = true (never release it to a device pool), and on
/// a refusal returns import_failed whose message carries hsa_status_string; when the runtime
/// refused pages mapped without PROT_WRITE (older runtimes lock read-write only) the message
/// also carries read_only_refusal_marker ("refused a read-only lock"), which load_model answers
/// with a writable shared mapping where map_file_writable_shared's rules allow (mapping.hpp).
/// Before locking it populates the range (MADV_WILLNEED, then MADV_POPULATE_READ, or one read
/// per page before Linux 5.14), so the pin does not fault file pages in one at a time; a failure
/// to populate is not one to lock. While locked, the range is recorded so the mapping layer
/// neither mprotects nor munmaps it (MappedModel::make_read_only refuses; a MappedModel
/// destroyed first leaves that mapping in place). release() calls
/// hsa_amd_memory_unlock; a buffer this importer did not lock is refused without calling the
/// runtime. read_back() copies from host_address: the lock pins the mapping's own pages, so the
/// host sees what the device reads (the agent pointer need not be host-addressable).
///
/// Fails (invalid_argument) only for unusable params: a zero or repeated agent handle, or, once
/// the runtime is loaded, a handle that is not one of its agents. An absent or failing runtime
/// is not a failure: the importer is returned with available() false and the reason (dlerror(),
/// or hsa_init's hsa_status_string, or "no GPU agent").
///
/// Ownership and lifetime: the caller owns the importer; every buffer must be released before
/// it is destroyed. The destructor unlocks whatever is still locked (with a warning through the
/// log callback), then calls hsa_shut_down, then dlclose - in that order.
/// Thread-safety: import(), release() and read_back() may be called concurrently.
WM_API Result<std::unique_ptr<Importer>> make_hsa_importer(const HsaImporterParams& params = {});

/// An arbitrary host range locked through an HSA importer as its page-aligned superset - the
/// form an engine needs when it locks `mapping + tensor offset` directly, outside a plan.
/// Move-only; destruction unlocks (release() does it earlier and reports a failure).
/// The importer must outlive it. Not thread-safe itself; different objects are independent.
class WM_API HsaLockedRange {
public:
    HsaLockedRange() = default;
    HsaLockedRange(HsaLockedRange&& other) noexcept;
    HsaLockedRange& operator=(HsaLockedRange&& other) noexcept;
    HsaLockedRange(const HsaLockedRange&) = delete;
    HsaLockedRange& operator=(const HsaLockedRange&) = delete;
    ~HsaLockedRange();

    /// The agent address of the byte the caller asked for: the lock's agent pointer + delta().
    void* agent_address() const noexcept;
    /// Bytes from the locked (aligned) start to the requested address; < the page size.
    std::uint64_t delta() const noexcept { return delta_; }
    /// The aligned superset as locked: host_address, size, device_address (agent pointer).
    const ImportedBuffer& buffer() const noexcept { return buffer_; }
    /// True while the range is locked.
    bool locked() const noexcept { return importer_ != nullptr; }
    /// Unlocks now; afterwards locked() is false whatever the outcome. No-op when not locked.
    Status release() noexcept;

private:
    friend Result<HsaLockedRange> hsa_lock_superset(Importer&, const void*, std::uint64_t);
    Importer* importer_ = nullptr;
    ImportedBuffer buffer_;
    std::uint64_t delta_ = 0;
};

/// Locks the pages covering [address, address + size) through `hsa_importer` (one made by
/// make_hsa_importer): the start is aligned down and the end up to the page size, and the delta
/// is kept so agent_address() points at `address` itself. Read-only pages are tried as they are;
/// a runtime that refuses them says so (read_only_refusal_marker), and then the pages must lie
/// in a writable MAP_SHARED mapping (map_file_writable_shared): never a private writable one,
/// which the lock's write faults copy page by page (+1024 MiB RssAnon per GiB, measured).
/// Fails with invalid_argument for another kind of importer, a null address, a zero size or a
/// range that wraps the address space; otherwise with the importer's own error (its budget,
/// its availability, or the runtime's status string). Nothing stays locked on failure.
WM_API Result<HsaLockedRange> hsa_lock_superset(Importer& hsa_importer, const void* address,
                                         std::uint64_t size);

/// How many agents `hsa_importer` (one made by make_hsa_importer) locks for: the engine's
/// HsaImporterParams::agents, or every GPU agent of the runtime. invalid_argument for another
/// kind of importer; unsupported when it is not available (or HSA is not built). Thread-safe.
WM_API Result<std::uint32_t> hsa_lock_agent_count(const Importer& hsa_importer);

} // namespace wm
