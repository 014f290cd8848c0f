/* SPDX-License-Identifier: MIT */
/* attack_engine.h - what an integrator writes around libweightmap, and nothing of ours: an engine
 * importer in C (wm_importer_vtable) for a unified-memory device whose device address is the
 * host address, which can be told to misbehave (hand back a bogus import result); and a model of
 * one file with device tensors. Include after c_check.h. */
#ifndef WM_TESTS_ATTACK_ENGINE_H
#define WM_TESTS_ATTACK_ENGINE_H

#include "c_check.h"

#define ATTACK_MiB (UINT64_C(1024) * 1024)

typedef enum engine_result {
    ENGINE_HONEST = 0,
    ENGINE_NULL_HOST,  /* out->host_address = NULL */
    ENGINE_ZERO_SIZE,  /* out->size = 0 */
    ENGINE_HALF_SIZE,  /* out->size = size / 2 */
    ENGINE_MOVED       /* out->host_address = host + one page */
} engine_result;

typedef struct engine_importer {
    engine_result result;
    bool needs_writable_mapping;
    bool has_read_back;   /* the vtable gets read_back (else NULL: the library's default) */
    int imports, releases;
} engine_importer;

static inline void engine_caps(void* user, wm_importer_caps* caps) {
    const engine_importer* e = (const engine_importer*)user;
    caps->needs_writable_mapping = e->needs_writable_mapping;
    caps->device_memory = WM_DEVICE_MEMORY_UNIFIED;
}

static inline wm_status engine_import(void* user, void* host, uint64_t size,
                                      wm_imported_buffer* out, char* reason, size_t reason_size) {
    engine_importer* e = (engine_importer*)user;
    (void)reason;
    (void)reason_size;
    ++e->imports;
    out->host_address = host;
    out->size = size;
    out->device_address = host;
    out->imported = true;
    switch (e->result) {
    case ENGINE_HONEST: break;
    case ENGINE_NULL_HOST: out->host_address = NULL; break;
    case ENGINE_ZERO_SIZE: out->size = 0; break;
    case ENGINE_HALF_SIZE: out->size = size / 2; break;
    case ENGINE_MOVED: out->host_address = (char*)host + c_page_size(); break;
    }
    return WM_OK;
}

static inline wm_status engine_release(void* user, const wm_imported_buffer* buffer) {
    (void)buffer;
    ++((engine_importer*)user)->releases;
    return WM_OK;
}

static inline wm_status engine_read_back(void* user, const wm_imported_buffer* buffer,
                                         uint64_t offset, uint64_t size, void* dst, char* reason,
                                         size_t reason_size) {
    (void)user;
    (void)reason;
    (void)reason_size;
    memcpy(dst, (const char*)buffer->device_address + offset, (size_t)size);
    return WM_OK;
}

static inline bool engine_create(engine_importer* e, wm_importer** out) {
    wm_importer_vtable vt;
    memset(&vt, 0, sizeof vt);
    vt.struct_size = sizeof vt;
    vt.name = "attack-engine";
    vt.caps = engine_caps;
    vt.import = engine_import;
    vt.release = engine_release;
    vt.read_back = e->has_read_back ? engine_read_back : NULL;
    return wm_importer_create_custom(&vt, e, out) == WM_OK;
}

/* A model of the file at `path` (`file_size` bytes) with one tensor of `size` bytes at `offset`
 * on `importer`'s target. */
static inline bool engine_model(const char* path, uint64_t file_size, uint64_t offset,
                                uint64_t size, wm_importer* importer, wm_model** out) {
    uint32_t target = 0;
    *out = NULL;
    if (wm_model_create(out) != WM_OK) return false;
    return wm_model_add_file(*out, path, file_size, NULL) == WM_OK &&
           wm_model_add_target(*out, "device", importer, &target) == WM_OK &&
           wm_model_add_tensor(*out, "w", 0, offset, size, target, NULL) == WM_OK;
}

#endif
