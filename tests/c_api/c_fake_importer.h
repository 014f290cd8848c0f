/* SPDX-License-Identifier: MIT */
/* c_fake_importer.h - an engine importer written in C through wm_importer_vtable, recording
 * every call: the imports and releases (with their order), the caps it was asked for, read-backs
 * and destroy. It can refuse the N-th import with a reason, hand back a wrong address for the
 * N-th, say it is unavailable, and fail its read-back. Include after c_check.h. */
#ifndef WM_TESTS_C_FAKE_IMPORTER_H
#define WM_TESTS_C_FAKE_IMPORTER_H

#include "c_check.h"

#define C_FAKE_MAX 64
#define C_FAKE_NATIVE_MEMORY(k) (UINT64_C(0x1000) + (uint64_t)(k))
#define C_FAKE_NATIVE_BUFFER(k) (UINT64_C(0x2000) + (uint64_t)(k))

typedef struct c_fake_record {
    void* host;
    uint64_t size;
    uint64_t native_memory;
    int releases; /* how often release() was called for it */
} c_fake_record;

typedef struct c_fake {
    /* configuration */
    uint64_t alignment;          /* caps.alignment; 1 leaves the default */
    uint64_t max_import_size;
    uint64_t tensor_alignment;   /* caps.tensor_alignment; 0 leaves the default (1) */
    bool needs_writable_mapping;
    bool survives_read_only_reprotect;
    bool is_cpu;
    wm_device_memory device_memory; /* default WM_DEVICE_MEMORY_UNIFIED (the policy imports) */
    const char* device_memory_note;
    int refuse_at;               /* refuse the N-th import call (1-based); 0: never */
    wm_status refuse_status;     /* default WM_ERROR_IMPORT_FAILED */
    const char* refuse_reason;
    int lie_at;                  /* the N-th import hands back host_address + alignment */
    bool unavailable;
    const char* unavailable_reason;
    bool device_is_host;         /* device_address = host_address (else NULL) */
    bool read_back_fails;
    wm_status read_back_status;  /* what a failing read_back returns (default WM_ERROR_IO) */
    /* observations */
    int caps_calls;
    int caps_not_default;        /* caps arrived with something other than the defaults */
    uint32_t caps_struct_size;   /* the struct_size caps last arrived with */
    int available_calls;
    int import_calls;
    int bad_import_args;         /* unaligned, zero, over the limit, no reason buffer */
    int release_calls;
    int bad_releases;            /* unknown buffer, or released twice */
    int read_back_calls;
    uint64_t read_back_offset, read_back_size;
    void* read_back_host;
    int destroy_calls;
    int calls_after_destroy;
    c_fake_record records[C_FAKE_MAX];
    int record_count;
    uint64_t release_order[C_FAKE_MAX]; /* native_memory of each release, in order */
    int release_order_count;
} c_fake;

static inline void c_fake_init(c_fake* f) {
    memset(f, 0, sizeof *f);
    f->alignment = 1;
    f->device_memory = WM_DEVICE_MEMORY_UNIFIED;
    f->refuse_status = WM_ERROR_IMPORT_FAILED;
    f->refuse_reason = "fake importer refuses";
    f->read_back_status = WM_ERROR_IO;
    f->unavailable_reason = "fake importer unavailable";
}

/* Imports recorded and not released. */
static inline int c_fake_live(const c_fake* f) {
    int live = 0;
    for (int i = 0; i < f->record_count; ++i) live += f->records[i].releases == 0;
    return live;
}

static inline c_fake_record* c_fake_find(c_fake* f, const wm_imported_buffer* b) {
    for (int i = 0; i < f->record_count; ++i)
        if (f->records[i].native_memory == b->native_memory && f->records[i].host == b->host_address &&
            f->records[i].size == b->size)
            return &f->records[i];
    return NULL;
}

static inline void c_fake_caps(void* user, wm_importer_caps* caps) {
    c_fake* f = (c_fake*)user;
    f->calls_after_destroy += f->destroy_calls;
    ++f->caps_calls;
    f->caps_struct_size = caps->struct_size;
    if (caps->alignment != 1 || caps->max_import_size != 0 || caps->needs_writable_mapping ||
        caps->is_cpu || caps->survives_read_only_reprotect ||
        caps->device_memory != WM_DEVICE_MEMORY_UNKNOWN || caps->tensor_alignment != 1)
        ++f->caps_not_default;
    if (f->tensor_alignment != 0) caps->tensor_alignment = f->tensor_alignment;
    caps->alignment = f->alignment;
    caps->max_import_size = f->max_import_size;
    caps->needs_writable_mapping = f->needs_writable_mapping;
    caps->survives_read_only_reprotect = f->survives_read_only_reprotect;
    caps->is_cpu = f->is_cpu;
    caps->device_memory = f->device_memory;
    caps->device_memory_note = f->device_memory_note;
}

static inline bool c_fake_available(void* user, char* reason, size_t reason_size) {
    c_fake* f = (c_fake*)user;
    f->calls_after_destroy += f->destroy_calls;
    ++f->available_calls;
    if (!f->unavailable) return true;
    if (reason != NULL && reason_size > 0) snprintf(reason, reason_size, "%s", f->unavailable_reason);
    return false;
}

static inline wm_status c_fake_import(void* user, void* host, uint64_t size,
                                      wm_imported_buffer* out, char* reason, size_t reason_size) {
    c_fake* f = (c_fake*)user;
    f->calls_after_destroy += f->destroy_calls;
    const int call = ++f->import_calls;
    if (host == NULL || size == 0 || (uintptr_t)host % f->alignment != 0 ||
        size % f->alignment != 0 || (f->max_import_size != 0 && size > f->max_import_size) ||
        out == NULL || reason == NULL || reason_size == 0)
        ++f->bad_import_args;
    if (call == f->refuse_at) {
        if (reason != NULL && reason_size > 0) snprintf(reason, reason_size, "%s", f->refuse_reason);
        return f->refuse_status;
    }
    if (f->record_count == C_FAKE_MAX) {
        if (reason != NULL && reason_size > 0) snprintf(reason, reason_size, "fake: full");
        return WM_ERROR_LIMIT;
    }
    const int k = f->record_count++;
    char* given = (char*)host;
    c_fake_record* r = &f->records[k];
    r->host = call == f->lie_at ? (void*)(given + f->alignment) : host;
    r->size = size;
    r->native_memory = C_FAKE_NATIVE_MEMORY(k);
    r->releases = 0;
    out->host_address = r->host;
    out->size = size;
    out->device_address = f->device_is_host ? r->host : NULL;
    out->native_memory = C_FAKE_NATIVE_MEMORY(k);
    out->native_buffer = C_FAKE_NATIVE_BUFFER(k);
    out->imported = true;
    return WM_OK;
}

static inline wm_status c_fake_release(void* user, const wm_imported_buffer* buffer) {
    c_fake* f = (c_fake*)user;
    f->calls_after_destroy += f->destroy_calls;
    ++f->release_calls;
    c_fake_record* r = buffer != NULL ? c_fake_find(f, buffer) : NULL;
    if (r == NULL || r->releases != 0) {
        ++f->bad_releases;
        if (r != NULL) ++r->releases;
        return WM_ERROR_INVALID_ARGUMENT;
    }
    ++r->releases;
    if (f->release_order_count < C_FAKE_MAX)
        f->release_order[f->release_order_count++] = buffer->native_memory;
    return WM_OK;
}

static inline wm_status c_fake_read_back(void* user, const wm_imported_buffer* buffer,
                                         uint64_t offset, uint64_t size, void* dst, char* reason,
                                         size_t reason_size) {
    c_fake* f = (c_fake*)user;
    f->calls_after_destroy += f->destroy_calls;
    ++f->read_back_calls;
    f->read_back_offset = offset;
    f->read_back_size = size;
    f->read_back_host = buffer != NULL ? buffer->host_address : NULL;
    if (f->read_back_fails) {
        snprintf(reason, reason_size, "fake read_back failed on purpose");
        return f->read_back_status;
    }
    c_fake_record* r = buffer != NULL ? c_fake_find(f, buffer) : NULL;
    if (r == NULL || r->releases != 0 || offset > r->size || size > r->size - offset) {
        snprintf(reason, reason_size, "fake read_back: not a live import, or out of range");
        return WM_ERROR_INVALID_ARGUMENT;
    }
    memcpy(dst, (const char*)r->host + offset, (size_t)size);
    return WM_OK;
}

static inline void c_fake_destroy(void* user) {
    c_fake* f = (c_fake*)user;
    ++f->destroy_calls;
}

/* The vtable, every entry set; clear the optional ones to test their defaults. */
static inline wm_importer_vtable c_fake_vtable(const char* name) {
    wm_importer_vtable v;
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    v.name = name;
    v.caps = c_fake_caps;
    v.available = c_fake_available;
    v.import = c_fake_import;
    v.release = c_fake_release;
    v.read_back = c_fake_read_back;
    v.destroy = c_fake_destroy;
    return v;
}

/* --- log capture ------------------------------------------------------------------------------ */

#define C_LOG_MAX 64
typedef struct c_log {
    int count;
    int warnings;
    wm_log_level levels[C_LOG_MAX];
    char messages[C_LOG_MAX][1024];
} c_log;

static inline void c_log_fn(void* user, wm_log_level level, const char* message) {
    c_log* log = (c_log*)user;
    if (log->count < C_LOG_MAX) {
        log->levels[log->count] = level;
        snprintf(log->messages[log->count], sizeof log->messages[0], "%s", c_str_(message));
    }
    ++log->count;
    log->warnings += level == WM_LOG_WARNING;
}

/* True when a message at `level` contains `needle`. */
static inline bool c_log_has(const c_log* log, wm_log_level level, const char* needle) {
    for (int i = 0; i < log->count && i < C_LOG_MAX; ++i)
        if (log->levels[i] == level && strstr(log->messages[i], needle) != NULL) return true;
    return false;
}

#endif /* WM_TESTS_C_FAKE_IMPORTER_H */
