// SPDX-License-Identifier: MIT
// backends/cuda.hpp - the CUDA importer: the weight mapping used directly by a device that reads
// pageable memory through the host's page tables (GH200, GB200/GB300, GB10), or registered with
// cuMemHostRegister, read-only, where the device maps registered memory (Jetson Orin); and
// page-locked fallback ranges for the engine's own copies on a discrete GPU.
//
// Either way the page-cache pages of the model file become device memory in place: no second
// copy (CudaImportMethod says which method a device gets). On a discrete GPU every kernel read
// of such a weight crosses the bus, so there the importer is unavailable unless the engine opts
// in, and cuda_pin_fallbacks() offers the other use: page-locked sources make the engine's
// host-to-device copies DMA transfers. docs/cuda.md has the devices, the reasons and the sources.
//
// No CUDA type or header is needed to include this: a context is its CUcontext pointer value.
// The driver (libcuda.so.1) is loaded with dlopen when the importer is made, so one build runs
// on machines without an NVIDIA driver; there the importer exists and says why it is not
// available. In a build without the CUDA importer (meson -Dcuda=disabled) make_cuda_importer()
// and cuda_pin_fallbacks() return ErrorKind::unsupported, "unavailable: built without CUDA
// support (...)"; registry.hpp's importer_registry() says whether it is built.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "weightmap/executor.hpp"
#include "weightmap/export.h"
#include "weightmap/import_policy.hpp"
#include "weightmap/importer.hpp"
#include "weightmap/mapped_file.hpp"
#include "weightmap/model.hpp"
#include "weightmap/result.hpp"
#include "weightmap/span.hpp"

namespace wm {

/// How to make a CUDA importer. Plain data; the defaults are what create_importer("cuda") uses.
struct CudaImporterParams {
    /// The driver to dlopen. Empty: $WEIGHTMAP_CUDA_LIBRARY when set and non-empty, else
    /// "libcuda.so.1" (the dynamic linker's search path). Tests point it at a fake. An engine
    /// that already uses CUDA keeps the default: dlopen of the same library returns the engine's
    /// instance, so contexts and registrations are shared with it.
    std::string library_path;
    /// The engine's own context (a CUcontext, as an integer), which every driver call is made
    /// in; its device is read with cuCtxGetDevice. The engine owns it and must keep it alive for
    /// the importer's lifetime. 0: the primary context of device_ordinal, retained on the first
    /// import or copy (not when the importer is made, so asking for caps costs no context) and
    /// released by the destructor. ggml-cuda works in primary contexts, so the default shares
    /// the engine's context.
    std::uint64_t context = 0;
    /// The device (cuDeviceGet ordinal) when context is 0. Must be >= 0.
    int device_ordinal = 0;
    /// A discrete device (neither CU_DEVICE_ATTRIBUTE_INTEGRATED nor
    /// CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES) makes available() false
    /// with that reason unless this is true: every kernel read of an import would cross the bus.
    /// Even then caps().device_memory says discrete, so a plan imports only under
    /// ImportPolicy::always. cuda_pin_fallbacks() needs no opt-in.
    bool allow_discrete = false;
    /// How the device reaches host memory, when the engine knows better than the attributes:
    /// unknown (the default) reads it from the driver.
    DeviceMemory device_memory = DeviceMemory::unknown;
};

/// Makes a CUDA importer: loads the driver, calls cuInit(0), settles the device (the engine's
/// context's, or device_ordinal's), reads its attributes and picks the import method from them
/// (CudaImportMethod; cuda_importer_state() reports it). docs/cuda.md, "The three methods", has
/// the attributes behind each method, the caps each declares and the driver calls each entry makes.
///
/// Caps: alignment = the host page size, max_import_size = 0, is_cpu = false,
/// survives_read_only_reprotect = false. needs_writable_mapping is true only where the device
/// can map read-only pages neither through the host's page tables nor with
/// CU_MEMHOSTREGISTER_READ_ONLY (then the mapping policy maps the files writable).
/// device_memory: unified for an integrated device or one that reads through the host's page
/// tables, discrete otherwise; its note names the attributes and ends "; import method <method>".
///
/// import(address, size): both page-aligned, else invalid_argument without a driver call; a
/// direct import overlapping a live one is invalid_argument. device_address is the host address
/// (direct) or the driver's device pointer (register). A refusal is import_failed with the
/// driver's error name and string, and nothing stays registered. release() refuses a buffer
/// this importer did not import, without calling the driver. read_back() returns the bytes as
/// the device reads them; allocate_copy()/free_copy() are the control arm's device copy.
///
/// Fails (invalid_argument) only for unusable params: a negative device_ordinal, or a context
/// the driver refuses to make current. An absent or failing driver is not a failure: the
/// importer is returned with available() false and the reason (dlerror(), a missing entry point,
/// cuInit's error, no such device, neither host registration nor pageable access through the
/// host's page tables, or a discrete device without allow_discrete).
///
/// Ownership and lifetime: the caller owns the importer; every buffer, copy and pin must be
/// released first (destroy placements before their importers). The destructor unregisters and
/// frees whatever is left (with a warning through the log callback), releases the primary
/// context it retained, then dlcloses the driver. The calling thread's current context is left
/// as it was. Thread-safety: import(), release(), read_back(), allocate_copy(), free_copy() may
/// be called concurrently.
WM_API Result<std::unique_ptr<Importer>> make_cuda_importer(const CudaImporterParams& params = {});

/// How a CUDA importer makes a range of the mapping device memory (docs/cuda.md has the table of
/// devices and the sources). Chosen once per importer from the device's attributes.
enum class CudaImportMethod : std::uint8_t {
    /// Neither of the two below: available() is false and says why (no host registration and no
    /// pageable access, e.g. a Jetson Nano; or a discrete device without allow_discrete).
    unavailable = 0,
    /// The device reads pageable memory through the host's page tables
    /// (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS and ..._USES_HOST_PAGE_TABLES both 1: GH200,
    /// GB200/GB300, GB10): an import is the host pointer itself. Nothing is registered, pinned
    /// or copied; the driver is not called at import or release.
    direct = 1,
    /// cuMemHostRegister(DEVICEMAP [| READ_ONLY]) and cuMemHostGetDevicePointer (an integrated
    /// Jetson, or a discrete card under ImportPolicy::always). A registration the driver refuses
    /// with CUDA_ERROR_NOT_SUPPORTED on a device with PAGEABLE_MEMORY_ACCESS (which reads plain
    /// pageable memory coherently) switches the importer to direct; on any other device that
    /// run falls back, with the driver's reason.
    register_host = 2,
};
/// "unavailable", "direct", "register".
WM_API const char* to_string(CudaImportMethod method) noexcept;

/// What a CUDA importer does now. Plain data, a snapshot.
struct CudaImporterState {
    CudaImportMethod method = CudaImportMethod::unavailable; ///< the current method
    std::uint64_t registrations = 0;   ///< live cuMemHostRegister imports (not pins)
    std::uint64_t direct_imports = 0;  ///< live direct imports
    /// The device reads pageable memory itself (PAGEABLE_MEMORY_ACCESS 1). There an engine should
    /// copy its fallback tensors with copy_fallback_tensors() (preads into its own staging), not
    /// out of the mapping: copies from file-backed pages are reported pathologically slow
    /// (docs/cuda.md, "The fallback copy on coherent machines").
    bool pageable_access = false;
    std::string method_note;           ///< the attributes the method was chosen from
};

/// The state of `cuda_importer`, which must have been made by make_cuda_importer (else
/// invalid_argument). Thread-safe; may be called while imports run.
WM_API Result<CudaImporterState> cuda_importer_state(const Importer& cuda_importer);

/// What cuda_pin_fallbacks() did.
struct CudaPinReport {
    std::uint64_t ranges = 0;        ///< registrations made (page-aligned, merged fallback ranges)
    std::uint64_t bytes = 0;         ///< bytes page-locked by them
    std::uint64_t tensors = 0;       ///< fallback tensors whose bytes were considered
    std::uint64_t refused_ranges = 0; ///< ranges the driver refused; they stay pageable
    std::string first_refusal;       ///< the first refusal's reason; empty when none
};

/// The DMA use, for a discrete device: page-locks the fallback tensors of
/// `placement` (the ones the engine copies to device memory itself) on `target`, or on every
/// non-CPU target when target is no_index, so that cuMemcpyHtoD from the mapping runs as a DMA
/// transfer instead of through the driver's bounce buffer. Each tensor's range is aligned out
/// to pages, touching ranges of a file are merged, and pages that an import of the placement
/// already holds are left out (the driver refuses to register a page twice). Registered with
/// CU_MEMHOSTREGISTER_READ_ONLY where supported, so read-only mappings stay read-only.
///
/// The pins belong to the placement from then on: Placement::release_all() (or its destruction)
/// unregisters them first, before its imports. `cuda_importer` must be one made by
/// make_cuda_importer whose driver loaded (it need not be available() for imports: a discrete
/// device without allow_discrete pins), and must outlive the placement. A range the driver
/// refuses is not an error (that copy stays a pageable copy, as without this call): it is
/// counted in the report. Fails with invalid_argument for another kind of importer, a model or
/// file list that does not match the placement, or a target out of range; with unsupported when
/// the driver did not load. Call it once per placement and target (a second call finds the
/// pages registered and refuses them).
WM_API Result<CudaPinReport> cuda_pin_fallbacks(Importer& cuda_importer, Placement& placement,
                                                const ModelDesc& model,
                                                Span<const MappedFile> files,
                                                std::uint32_t target = no_index);

} // namespace wm
