/* SPDX-License-Identifier: MIT */
/* backends/hsa.h - the HSA importer's C entry points (C99), beside backends/hsa.hpp, its C++
 * side: hsa_amd_memory_lock of the weight mapping's page-cache pages (AMD APUs), read-only
 * first, populated before each lock. A wm_importer made here is used through weightmap.h like
 * any other; a runtime that refuses read-only pages says "refused a read-only lock" in the
 * import's reason, and wm_map_file_writable_shared (weightmap.h) makes the writable shared
 * mapping such a runtime needs, under its owner + mode + same-inode rules.
 *
 * Needs no HSA header: an agent is its 64-bit hsa_agent_t::handle. Every convention of
 * weightmap.h holds (wm_status, wm_last_error, struct_size, ownership). In a build without the
 * HSA importer (meson -Dhsa=disabled, or no HSA headers) every function still links; those that
 * make or use an importer fail with WM_ERROR_UNSUPPORTED. */
#ifndef WEIGHTMAP_BACKENDS_HSA_H
#define WEIGHTMAP_BACKENDS_HSA_H

#include "weightmap/weightmap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wm_hsa_importer_params {
    uint32_t struct_size;
    /* The runtime to dlopen; NULL or "": $WEIGHTMAP_HSA_LIBRARY when set and non-empty, else
     * "libhsa-runtime64.so.1". Copied. An engine that already uses HSA leaves it NULL: dlopen
     * of the same library shares the engine's runtime, agents and locks. */
    const char* library_path;
    /* agent_count hsa_agent_t::handle values from the same runtime that must see the locked
     * memory; each non-zero, none repeated, each one of the runtime's agents (checked by
     * enumeration). Copied; NULL with agent_count 0 (the default): every GPU agent. */
    const uint64_t* agents;
    uint32_t agent_count;
    /* Most bytes held locked at once; an import past it falls back. 0 (default): no budget. */
    uint64_t lock_budget_bytes;
    /* WM_DEVICE_MEMORY_UNKNOWN (default): read from the runtime (ROCm 5.2 cannot tell an APU
     * from a discrete card; say WM_DEVICE_MEMORY_UNIFIED when the engine knows). */
    wm_device_memory device_memory;
} wm_hsa_importer_params;

/* Fills the defaults and struct_size. */
WM_API void wm_hsa_importer_params_init(wm_hsa_importer_params* params);
/* Makes an HSA importer (params may be NULL: the defaults). A missing runtime, /dev/kfd or GPU
 * agent is not a failure: the importer says why in wm_importer_available. Fails with
 * WM_ERROR_INVALID_ARGUMENT for unusable params (agents NULL with a count, a zero, repeated or
 * unknown agent handle), WM_ERROR_UNSUPPORTED in a build without the HSA importer. The caller
 * destroys *out with wm_importer_destroy after every buffer it imported is released. */
WM_API wm_status wm_importer_create_hsa(const wm_hsa_importer_params* params, wm_importer** out);
/* *out = how many agents `hsa` (from wm_importer_create_hsa or the registry's "hsa") locks for:
 * the params' agents, or every GPU agent of the runtime. WM_ERROR_INVALID_ARGUMENT for another
 * kind of importer or a NULL argument, WM_ERROR_UNSUPPORTED when it is not available (or HSA is
 * not built); *out is untouched on failure. Thread-safe. */
WM_API wm_status wm_hsa_gpu_agent_count(wm_importer* hsa, uint32_t* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTMAP_BACKENDS_HSA_H */
