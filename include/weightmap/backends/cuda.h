/* SPDX-License-Identifier: MIT */
/* backends/cuda.h - the CUDA importer's C entry points (C99), beside backends/cuda.hpp, its C++
 * side: cuMemHostRegister of the weight mapping, read-only where the device supports it, or the
 * mapping used directly by a device that reads pageable memory; and page-locked fallback ranges
 * for the engine's own copies on a discrete GPU. weightmap.h is the core every importer shares
 * (a wm_importer made here is used through it); each backend's own entry points live in
 * backends/<name>.h, so the core header does not grow with each backend.
 *
 * Needs no CUDA header: a context is its CUcontext pointer value. Every convention of weightmap.h
 * holds (wm_status, wm_last_error, struct_size, ownership). In a build without the CUDA importer
 * (meson -Dcuda=disabled) every function still links; the two that make or use an importer fail
 * with WM_ERROR_UNSUPPORTED. */
#ifndef WEIGHTMAP_BACKENDS_CUDA_H
#define WEIGHTMAP_BACKENDS_CUDA_H

#include "weightmap/weightmap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wm_cuda_importer_params {
    uint32_t struct_size;
    /* The driver to dlopen; NULL or "": $WEIGHTMAP_CUDA_LIBRARY, else "libcuda.so.1". Copied. */
    const char* library_path;
    /* The engine's CUcontext (kept alive by the engine for the importer's lifetime); 0: the
     * primary context of device_ordinal, retained on first use. */
    uint64_t context;
    int32_t device_ordinal;        /* default 0; must be >= 0 */
    /* A discrete device is unavailable unless true (every kernel read of an import crosses the
     * bus); default false. */
    bool allow_discrete;
    /* WM_DEVICE_MEMORY_UNKNOWN (default): from the device's attributes. */
    wm_device_memory device_memory;
} wm_cuda_importer_params;

/* Fills the defaults and struct_size. */
WM_API void wm_cuda_importer_params_init(wm_cuda_importer_params* params);
/* Makes a CUDA importer (params may be NULL: the defaults). A missing driver or device is not a
 * failure: the importer says why in wm_importer_available. Fails with WM_ERROR_INVALID_ARGUMENT
 * for unusable params (a negative ordinal, a context the driver refuses), WM_ERROR_UNSUPPORTED in
 * a build without the CUDA importer. */
WM_API wm_status wm_importer_create_cuda(const wm_cuda_importer_params* params,
                                         wm_importer** out);

typedef struct wm_cuda_pin_report {
    uint32_t struct_size;
    uint64_t ranges;          /* registrations made */
    uint64_t bytes;           /* bytes page-locked */
    uint64_t tensors;         /* fallback tensors considered */
    uint64_t refused_ranges;  /* ranges the driver refused (they stay pageable) */
    char first_refusal[512];  /* the first refusal's reason, truncated; "" when none */
} wm_cuda_pin_report;

/* For a discrete device: page-locks the fallback tensors of `placement` on `target`
 * (WM_NO_INDEX: every non-CPU target) so the engine's own host-to-device copies from the
 * mapping are DMA transfers (backends/cuda.hpp, cuda_pin_fallbacks). The pins belong to the
 * placement: wm_placement_release_all / wm_placement_destroy unregister them before its imports.
 * `cuda` must come from wm_importer_create_cuda (or the registry's "cuda") and outlive the
 * placement; `model` and `files` are the ones the placement was executed with. `out` may be
 * NULL. */
WM_API wm_status wm_cuda_pin_fallbacks(wm_importer* cuda, wm_placement* placement,
                                       const wm_model* model, const wm_mapped_file* files,
                                       uint32_t file_count, uint32_t target,
                                       wm_cuda_pin_report* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTMAP_BACKENDS_CUDA_H */
