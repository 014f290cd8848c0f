/* SPDX-License-Identifier: MIT */
/* weightmap.h - the C API of libweightmap (C99; also usable from C++ and from FFI bindings).
 *
 * A thin layer over the C++ API (planner.hpp, executor.hpp, mapping.hpp, memstat.hpp,
 * split_sync.hpp): the same planner, executor and rules, with opaque handles, fixed-width
 * integers and no C++ types. An engine describes its files, targets and tensors (wm_model),
 * plans (wm_plan: pure, nothing opened), executes the plan against its own mappings through
 * importers (wm_placement), then asks where each tensor lives and iterates the imports to wrap
 * one device buffer around each. An engine plugs in its own importer with a table of function
 * pointers (wm_importer_vtable), e.g. one that calls its backend's buffer_from_host_ptr.
 *
 * This is the core every importer shares. A backend's own C entry points (params, a factory
 * with options, backend-only calls) are in backends/<name>.h: backends/cuda.h for wm_cuda_*.
 *
 * Conventions, for every function below (and in backends/<name>.h):
 *  - Fallible calls return wm_status. On failure the out-parameters are left untouched (a handle
 *    out-parameter is not written) and wm_last_error() returns the reason, naming the function,
 *    the argument or field and the numbers involved. No call aborts on a caller's mistake: NULL
 *    handles, out-of-range indices and bad sizes are WM_ERROR_INVALID_ARGUMENT.
 *  - A handle made by wm_X_create/open is owned by the caller and freed with wm_X_destroy
 *    (NULL is accepted and ignored). Strings and arrays returned by the library are owned by the
 *    handle they came from and valid until it is destroyed, unless said otherwise; strings passed
 *    in are copied.
 *  - Structs that cross the API start with `struct_size`. The caller sets it to sizeof(the
 *    struct) as its header declares it: the *_init functions do, in C so does
 *    `wm_plan_totals totals = {.struct_size = sizeof totals};`, in C++ `wm_plan_totals totals{};
 *    totals.struct_size = sizeof totals;`. That lets a newer library accept an older caller: fields past struct_size keep their defaults
 *    on input and are not written on output. A struct_size smaller than the first version of the
 *    struct is WM_ERROR_INVALID_ARGUMENT. Structs without struct_size (wm_mapped_file,
 *    wm_imported_buffer) are frozen for this soversion.
 *  - Thread-safety: distinct handles are independent. A wm_plan, wm_placement, wm_mapped_model
 *    or wm_importer may be read (get/locate/iterate/import) from several threads at once;
 *    destroying, releasing or adding to a handle must not overlap any other use of it.
 *    wm_split_sync is not thread-safe: one scheduler thread drives it.
 */
#ifndef WEIGHTMAP_H
#define WEIGHTMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "weightmap/export.h"
#include "weightmap/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- status, errors, version, log ------------------------------------------------------------ */

typedef enum wm_status {
    WM_OK = 0,
    WM_ERROR_INVALID_ARGUMENT = 1, /* the caller passed something the contract forbids */
    WM_ERROR_IO = 2,               /* a system call on a file failed (open, mmap, mlock, ...) */
    WM_ERROR_FORMAT = 3,           /* a model file is malformed */
    WM_ERROR_UNSUPPORTED = 4,      /* valid, but this build or machine cannot do it */
    WM_ERROR_IMPORT_FAILED = 5,    /* an importer refused a range */
    WM_ERROR_LIMIT = 6,            /* a size, count or budget limit was exceeded */
    WM_ERROR_ABORTED = 7,          /* the caller's callback asked to stop */
    WM_ERROR_INTERNAL = 8,         /* a bug in libweightmap; please report it */
    WM_ERROR_OUT_OF_MEMORY = 9     /* an allocation failed; nothing was changed */
} wm_status;

/* "ok", "invalid_argument", ...; never NULL ("unknown" for a value not listed above). */
WM_API const char* wm_status_name(wm_status status);

/* The message of the last call that failed on the calling thread ("" if none did). Thread-local,
 * so it cannot race with other threads; valid until the next failing call on this thread. */
WM_API const char* wm_last_error(void);

/* The library's version as WM_VERSION_NUMBER (MAJOR << 16 | MINOR << 8 | PATCH) and as
 * "MAJOR.MINOR.PATCH": what is loaded at run time, to compare with the WM_VERSION_* macros. */
WM_API uint32_t wm_version(void);
WM_API const char* wm_version_string(void);

typedef enum wm_log_level {
    WM_LOG_DEBUG = 0,
    WM_LOG_INFO = 1,
    WM_LOG_WARNING = 2,
    WM_LOG_ERROR = 3
} wm_log_level;

/* One line, no trailing newline; `message` is valid during the call only. Called from whichever
 * thread triggered the event: it must be thread-safe if the engine loads from several threads. */
typedef void (*wm_log_fn)(void* user, wm_log_level level, const char* message);

/* The process-wide default log sink, used where wm_execute_options carry none. NULL restores the
 * default (warnings and errors to stderr, prefixed "weightmap: "). Thread-safe. */
WM_API void wm_set_log_callback(wm_log_fn log, void* user);

/* --- importers ------------------------------------------------------------------------------- */

typedef struct wm_importer wm_importer;

/* How the device an importer serves reaches imported memory (import_policy.hpp). */
typedef enum wm_device_memory {
    /* The importer cannot tell: under WM_IMPORT_POLICY_UNIFIED_ONLY its regions fall back. */
    WM_DEVICE_MEMORY_UNKNOWN = 0,
    /* The device's memory is host memory (an APU, GB10, Jetson; lavapipe; the CPU). */
    WM_DEVICE_MEMORY_UNIFIED = 1,
    /* Own memory behind a bus: an imported weight is read over PCIe on every use. */
    WM_DEVICE_MEMORY_DISCRETE = 2,
    /* Own memory (HBM) and coherent access to host memory over a CPU link (GH200, GB200,
     * GB300: NVLink-C2C): an import works, but its reads cross the link, several times slower
     * than the device's own memory; WM_IMPORT_POLICY_UNIFIED_ONLY copies. */
    WM_DEVICE_MEMORY_COHERENT = 3
} wm_device_memory;

/* When a non-CPU target imports. */
typedef enum wm_import_policy {
    /* wm_model_set_target_import_policy only: the plan options' policy decides. */
    WM_IMPORT_POLICY_FROM_OPTIONS = -1,
    /* The default: import only on a device that reports WM_DEVICE_MEMORY_UNIFIED. */
    WM_IMPORT_POLICY_UNIFIED_ONLY = 0,
    /* Import wherever the importer accepts, a discrete card included. */
    WM_IMPORT_POLICY_ALWAYS = 1,
    /* Never import: every region falls back. */
    WM_IMPORT_POLICY_NEVER = 2
} wm_import_policy;

/* "unknown", "unified", "discrete", "coherent"; "?" for any other value. Static strings. */
WM_API const char* wm_device_memory_name(wm_device_memory memory);
/* "unified_only", "always", "never", "from_options"; "?" for any other value. */
WM_API const char* wm_import_policy_name(wm_import_policy policy);

/* What an importer needs and can do (importer.hpp's ImporterCaps). */
typedef struct wm_importer_caps {
    uint32_t struct_size;
    /* Imports need PROT_WRITE pages (HSA locks read-write); makes the mapping policy open the
     * weight files O_RDWR. Only non-CPU importers may set it. */
    bool needs_writable_mapping;
    /* Alignment of both the start and the size of an import, a power of two (default 1). */
    uint64_t alignment;
    /* Largest single import in bytes; 0: no limit. */
    uint64_t max_import_size;
    /* This is the CPU: imports are passthrough and pin nothing. */
    bool is_cpu;
    /* An import stays valid after the mapping is re-protected PROT_READ. */
    bool survives_read_only_reprotect;
    /* The device cannot import pages of a file mapping (its driver refuses them; docs/vulkan.md,
     * "Drivers"): every region of the importer falls back with file_pages_note as the reason.
     * Default false. */
    bool refuses_file_pages;
    /* Why refuses_file_pages is set; "" or NULL otherwise. Copied when passed in (a custom
     * importer's caps callback: once, at wm_importer_create_custom); from wm_importer_get_caps
     * never NULL, owned by the importer and valid until it is destroyed (any thread may call
     * get_caps meanwhile). */
    const char* file_pages_note;
    /* How the device reaches imported memory; default WM_DEVICE_MEMORY_UNKNOWN, which the
     * default policy does not import: an engine importer says UNIFIED for an integrated GPU
     * (ggml: GGML_BACKEND_DEVICE_TYPE_IGPU). Added after the first version: a struct_size that
     * ends before it keeps the default. */
    wm_device_memory device_memory;
    /* What device_memory was read from, for messages; "" or NULL. Owned like file_pages_note. */
    const char* device_memory_note;
    /* The alignment every tensor's offset inside its import must meet (the engine's buffer-type
     * alignment: ggml-vulkan's minStorageBufferOffsetAlignment, up to 256, while GGUF aligns
     * tensor data to 32 by default); 0 or 1: none, else a power of two (wm_plan_create fails
     * otherwise, naming the target). A device tensor whose file offset is not a multiple falls
     * back alone with the numbers; extents are aligned to it as well. Default 1. Added after
     * device_memory: a struct_size that ends before it keeps the default. */
    uint64_t tensor_alignment;
} wm_importer_caps;

/* One imported range (importer.hpp's ImportedBuffer). Frozen layout. An engine importer may keep
 * its own handle (a ggml_backend_buffer_t, say) in native_buffer or native_memory as an
 * integer. */
typedef struct wm_imported_buffer {
    void* host_address;     /* the aligned host address that was imported */
    uint64_t size;          /* bytes imported from host_address */
    void* device_address;   /* what the device uses (HSA agent pointer; CPU: host); may be NULL */
    uint64_t native_memory; /* backend object, e.g. VkDeviceMemory; 0 if none */
    uint64_t native_buffer; /* backend object, e.g. VkBuffer; 0 if none */
    bool imported;          /* true: wraps memory the device did not allocate (never pool it) */
} wm_imported_buffer;

/* An importer the engine supplies. `user` is passed to every callback. The callbacks may be
 * called concurrently from several threads (like wm::Importer's) and must not call back into
 * the same wm_importer. `reason` buffers are NUL-terminated by the library when the callback
 * leaves them empty; a callback writes at most reason_size bytes including the NUL.
 * A callback should not throw, but one that does (a C++ engine's function in this table) is
 * caught, never let through the library: creation fails when caps throws then; later, the call
 * that reached the callback fails with WM_ERROR_INTERNAL and a message naming the callback and
 * what() (wm_importer_get_caps, wm_importer_import, wm_importer_release, wm_importer_read_back;
 * in wm_execute the run falls back with that reason; the planner and executor keep the caps
 * given at creation); a throwing available makes the importer unavailable with that reason; a
 * throwing destroy is logged. The library checks every buffer handed to release and read_back
 * is a live import of this importer (else WM_ERROR_INVALID_ARGUMENT, the callback not called),
 * and that every import result is the range asked for (else the import is released and
 * refused, WM_ERROR_IMPORT_FAILED). */
typedef struct wm_importer_vtable {
    uint32_t struct_size;
    /* Short stable name ("ggml-vulkan"): copied at creation. Required. It is also the importer
     * key: targets sharing an importer never get imports that share a page. */
    const char* name;
    /* Fills `caps`, which arrives holding the defaults (and the library's struct_size): set the
     * fields you know. Required; called whenever the planner or executor needs the caps, and
     * once by wm_importer_create_custom, which copies the two notes and keeps them for the
     * importer's lifetime (later calls' notes are not read: the notes are fixed). */
    void (*caps)(void* user, wm_importer_caps* caps);
    /* Optional (NULL: always available). Returns false with a reason when it cannot import. */
    bool (*available)(void* user, char* reason, size_t reason_size);
    /* Imports [host_address, host_address + size): both are multiples of caps.alignment, size > 0
     * and <= max_import_size when that is set. On success fills `out` (host_address must be the
     * one given, size >= the size asked) and returns WM_OK; otherwise returns an error status,
     * writes the backend's reason, and nothing stays imported. Required. */
    wm_status (*import)(void* user, void* host_address, uint64_t size, wm_imported_buffer* out,
                        char* reason, size_t reason_size);
    /* Releases a buffer its import returned, exactly once. A failure is logged. Required. */
    wm_status (*release)(void* user, const wm_imported_buffer* buffer);
    /* Optional (NULL: memcpy from device_address when set, else WM_ERROR_UNSUPPORTED): copies
     * `size` bytes at `offset` of `buffer` as the device sees them into `dst`. */
    wm_status (*read_back)(void* user, const wm_imported_buffer* buffer, uint64_t offset,
                           uint64_t size, void* dst, char* reason, size_t reason_size);
    /* Optional: called once by wm_importer_destroy, after which `user` is not used again. */
    void (*destroy)(void* user);
} wm_importer_vtable;

/* Wraps an engine importer. The vtable is copied; `user` is borrowed until destroy. Fails when a
 * required entry or the name is missing. */
WM_API wm_status wm_importer_create_custom(const wm_importer_vtable* vtable, void* user,
                                           wm_importer** out);

/* One entry of the build's importer table (registry.hpp), in preference order, CPU last. */
typedef struct wm_registry_entry {
    uint32_t struct_size;
    const char* name;       /* what wm_importer_create takes, e.g. "cpu"; static storage */
    bool built;             /* compiled into this build */
    const char* build_note; /* when !built: which option or package was missing; static; "" */
} wm_registry_entry;

WM_API uint32_t wm_registry_count(void);
WM_API wm_status wm_registry_get(uint32_t index, wm_registry_entry* out);

/* Creates a registry importer with its default configuration by name, or with "auto" the first
 * one built and available. Fails with WM_ERROR_UNSUPPORTED naming the missing build option or
 * the importer's own reason for not being available; WM_ERROR_INVALID_ARGUMENT for an unknown
 * name. */
WM_API wm_status wm_importer_create(const char* name, wm_importer** out);

/* The CPU passthrough: device address = host address, pins nothing. Never fails but for memory. */
WM_API wm_status wm_importer_create_cpu(wm_importer** out);

/* Frees the importer (a custom one's destroy callback runs). Every placement that used it must
 * be destroyed first. */
WM_API void wm_importer_destroy(wm_importer* importer);

/* The importer's name; NULL for a NULL importer. */
WM_API const char* wm_importer_name(const wm_importer* importer);
WM_API wm_status wm_importer_get_caps(wm_importer* importer, wm_importer_caps* out);
/* Whether it can import now. `reason` (may be NULL) receives "" or why not; the string is owned
 * by the importer and valid until its destruction (other threads' calls do not overwrite it). */
WM_API bool wm_importer_available(wm_importer* importer, const char** reason);
/* Copies `size` bytes at `offset` of `buffer` (one of this importer's imports) as the device
 * sees them into `dst`: for verification. WM_ERROR_UNSUPPORTED where the importer cannot;
 * WM_ERROR_INVALID_ARGUMENT, reading nothing, for a buffer that is not a live import of this
 * importer (released, forged, another importer's, any field changed). */
WM_API wm_status wm_importer_read_back(wm_importer* importer, const wm_imported_buffer* buffer,
                                       uint64_t offset, uint64_t size, void* dst);

/* Imports [host_address, host_address + size) through `importer` outside a plan: for an engine
 * importer that composes one of libweightmap's (the llama.cpp glue wraps the CUDA and HSA
 * importers' device addresses in buffers of its backend). The preconditions are the importer's
 * (wm::Importer::import: both multiples of caps.alignment, size > 0, at most max_import_size);
 * on failure nothing stays imported and wm_last_error has the backend's reason. A result that
 * is not the range asked for (another host address, a smaller size) is released again and
 * refused with WM_ERROR_IMPORT_FAILED ("... returned ... for ..."), as wm_execute refuses it. Release `out`
 * exactly once with wm_importer_release, before the importer is destroyed. */
WM_API wm_status wm_importer_import(wm_importer* importer, void* host_address, uint64_t size,
                                    wm_imported_buffer* out);
/* Releases a buffer wm_importer_import returned. A failure is reported, but the buffer must not
 * be released again either way: a buffer that is not a live import of this importer is
 * WM_ERROR_INVALID_ARGUMENT and reaches no callback or driver. */
WM_API wm_status wm_importer_release(wm_importer* importer, const wm_imported_buffer* buffer);

/* --- the model description ------------------------------------------------------------------- */

typedef struct wm_model wm_model;

/* An empty description: add files, targets, then tensors. Index i of each kind is the i-th
 * added. */
WM_API wm_status wm_model_create(wm_model** out);
WM_API void wm_model_destroy(wm_model* model);

/* A file of the model: `path` for messages and the mapping layer (may be ""), its size in bytes
 * (every tensor must end at or before it). `index` (may be NULL) receives its index. */
WM_API wm_status wm_model_add_file(wm_model* model, const char* path, uint64_t size,
                                   uint32_t* index);
/* A target (a buffer type or device the engine chose) served by `importer`: its caps and its
 * name as the importer key are copied now. */
WM_API wm_status wm_model_add_target(wm_model* model, const char* name,
                                     const wm_importer* importer, uint32_t* index);
/* A target described by caps alone (to plan before any importer exists: a what-if). An empty
 * or NULL importer_key means the target's name. */
WM_API wm_status wm_model_add_target_caps(wm_model* model, const char* name,
                                          const char* importer_key, const wm_importer_caps* caps,
                                          uint32_t* index);
/* A weight tensor: `size` bytes at absolute `offset` of file `file`, placed on `target`. The
 * file and target must have been added; the offset and size are checked by wm_plan_create. */
WM_API wm_status wm_model_add_tensor(wm_model* model, const char* name, uint32_t file,
                                     uint64_t offset, uint64_t size, uint32_t target,
                                     uint32_t* index);
/* Sets when target `target` imports: a wm_import_policy, or WM_IMPORT_POLICY_FROM_OPTIONS (the
 * default) to let the plan options decide. */
WM_API wm_status wm_model_set_target_import_policy(wm_model* model, uint32_t target,
                                                   wm_import_policy policy);
WM_API uint32_t wm_model_file_count(const wm_model* model);
WM_API uint32_t wm_model_target_count(const wm_model* model);
WM_API uint32_t wm_model_tensor_count(const wm_model* model);

/* --- planning -------------------------------------------------------------------------------- */

typedef struct wm_plan wm_plan;

#define WM_NO_INDEX UINT32_MAX

typedef enum wm_plan_mode {
    WM_PLAN_SPAN = 0, /* import [first, last] of every region (the naive upstream behaviour) */
    WM_PLAN_GATE = 1, /* import a region only if it passes the tightness gate */
    WM_PLAN_RUNS = 2  /* the default: tight runs of the region's own tensors */
} wm_plan_mode;

typedef struct wm_plan_options {
    uint32_t struct_size;
    wm_plan_mode mode;               /* default WM_PLAN_RUNS */
    uint64_t page_size;              /* a power of two; 0 (default): the host's */
    uint64_t merge_gap;              /* default 1 MiB */
    uint32_t max_imports_per_region; /* default 256; 0 counts as 1 */
    /* The A/B switch: -1 (default): wm_plan_create reads WEIGHTMAP_IMPORT ("0" disables);
     * 0: every non-CPU region falls back; 1: import. */
    int32_t import_enabled;
    /* When non-CPU targets import (a target's own policy, wm_model_set_target_import_policy,
     * overrides it); default WM_IMPORT_POLICY_UNIFIED_ONLY. Added after the first version. */
    wm_import_policy import_policy;
} wm_plan_options;

/* Fills the defaults and struct_size. */
WM_API void wm_plan_options_init(wm_plan_options* options);

/* Plans `model` (options may be NULL: the defaults). Pure: opens nothing, calls no importer.
 * Fails (WM_ERROR_INVALID_ARGUMENT) only for an inconsistent description, naming the tensor,
 * file or field. The plan does not refer to the model afterwards. */
WM_API wm_status wm_plan_create(const wm_model* model, const wm_plan_options* options,
                                wm_plan** out);
WM_API void wm_plan_destroy(wm_plan* plan);

/* Totals over the non-CPU targets. */
typedef struct wm_plan_totals {
    uint32_t struct_size;
    uint64_t device_bytes;   /* tensor bytes on non-CPU targets */
    uint64_t imported_bytes; /* of those, served by an import */
    uint64_t pinned_bytes;   /* sum of the non-CPU extents */
    uint64_t fallback_bytes; /* device bytes copied instead */
    uint64_t imports;        /* number of non-CPU imports */
} wm_plan_totals;
WM_API wm_status wm_plan_get_totals(const wm_plan* plan, wm_plan_totals* out);

typedef enum wm_decision { WM_DECISION_IMPORT = 0, WM_DECISION_FALLBACK = 1 } wm_decision;

/* All tensors of one target in one file. */
typedef struct wm_plan_region {
    uint32_t struct_size;
    uint32_t target;
    uint32_t file;
    uint64_t first;          /* lowest tensor offset */
    uint64_t last;           /* highest tensor end */
    uint64_t ctx_bytes;      /* sum of the region's tensor sizes */
    bool gate;               /* the whole region passes the tightness gate */
    wm_decision decision;
    const char* reason;      /* why it falls back, or how it imports; owned by the plan */
    uint32_t tensor_count;
    const uint32_t* tensors; /* tensor indices, by offset; owned by the plan */
    uint32_t run_count;      /* imports; 0 when it falls back */
} wm_plan_region;
WM_API uint32_t wm_plan_region_count(const wm_plan* plan);
WM_API wm_status wm_plan_get_region(const wm_plan* plan, uint32_t region, wm_plan_region* out);

/* One planned import: an aligned extent of a file and the tensors it serves. */
typedef struct wm_plan_run {
    uint32_t struct_size;
    uint64_t first;          /* lowest tensor offset in the run */
    uint64_t last;           /* highest tensor end in the run */
    uint64_t extent_offset;  /* first, aligned down to max(page, importer alignment) */
    uint64_t extent_size;    /* aligned bytes to import */
    uint64_t ctx_bytes;      /* tensor bytes it serves */
    uint32_t tensor_count;
    const uint32_t* tensors; /* tensor indices, by offset; owned by the plan */
} wm_plan_run;
WM_API wm_status wm_plan_get_run(const wm_plan* plan, uint32_t region, uint32_t run,
                                 wm_plan_run* out);

/* Where one tensor ends up in the plan. */
typedef struct wm_tensor_placement {
    uint32_t struct_size;
    uint32_t region;        /* WM_NO_INDEX only for a tensor the planner never placed */
    uint32_t run;           /* WM_NO_INDEX: it falls back (the engine copies it) */
    uint64_t offset_in_run; /* tensor offset - run extent_offset */
    const char* reason;     /* "" when imported, else why not; owned by the plan */
} wm_tensor_placement;
WM_API wm_status wm_plan_get_tensor(const wm_plan* plan, uint32_t tensor,
                                    wm_tensor_placement* out);

/* --- executing a plan ------------------------------------------------------------------------ */

typedef struct wm_placement wm_placement;

/* One file's mapping as the engine made it: the page-aligned start of the mapping of file
 * offset 0 and the mapped length (the file size rounded up to pages). Frozen layout. */
typedef struct wm_mapped_file {
    void* base;
    uint64_t length;
} wm_mapped_file;

/* Makes a writable MAP_SHARED mapping of the file open read-only at `fd` (which stays the
 * caller's), for a runtime that refused to lock read-only pages (backends/hsa.h). Reopens it
 * through /proc/self/fd/N with O_RDWR|O_CLOEXEC only when (a) the process's effective uid owns
 * the file AND its mode has the owner-write bit (root's override of mode bits is not taken: a
 * 0444 file owned by root stays read-only for root), and (b) the reopened descriptor is the same
 * inode as `fd`; then maps [0, length) PROT_READ|PROT_WRITE at a page-aligned address. `length`
 * 0: the whole file; more than its size is WM_ERROR_INVALID_ARGUMENT. On success out->base is
 * the mapping and out->length `length` rounded up to pages: the caller unmaps it with
 * munmap(out->base, out->length). On failure *out is zeroed and wm_last_error names the file and
 * the rule that refused (WM_ERROR_INVALID_ARGUMENT) or the failing system call (WM_ERROR_IO;
 * EROFS: a read-only mount). Thread-safe. */
WM_API wm_status wm_map_file_writable_shared(int fd, uint64_t length, wm_mapped_file* out);

/* After each import: bytes imported so far and in total. Return false to abort. */
typedef bool (*wm_progress_fn)(void* user, uint64_t done, uint64_t total);

typedef struct wm_execute_options {
    uint32_t struct_size;
    wm_log_fn log;        /* NULL: the process-wide sink (wm_set_log_callback) */
    void* log_user;
    wm_progress_fn progress; /* NULL: none */
    void* progress_user;
} wm_execute_options;
WM_API void wm_execute_options_init(wm_execute_options* options);

/* Imports every planned run of `plan` (made from `model`; it is copied, so both may be destroyed
 * afterwards) over `files` (one per model file) through importers[target] (one per target; NULL
 * entries make that target's regions fall back). A refused import is not an error: that run
 * alone falls back, its tensors with the importer's reason, and a warning goes through the log;
 * the region's other runs stay imported (a region is a fallback only when none of its runs is,
 * or when its importer is unavailable or its policy refuses it). Fails, with nothing left
 * imported, for a wrong call (counts, a plan of another model, a tensor that does not lie
 * inside its file's entry of `files`: a mapping shorter than the file) or an abort from `progress`
 * (WM_ERROR_ABORTED). The importers and the mappings must outlive the placement. */
WM_API wm_status wm_execute(const wm_model* model, const wm_plan* plan,
                            const wm_mapped_file* files, uint32_t file_count,
                            wm_importer* const* importers, uint32_t importer_count,
                            const wm_execute_options* options, wm_placement** out);

/* Releases every import (in reverse order of import) and frees the placement. */
WM_API void wm_placement_destroy(wm_placement* placement);
/* Releases every import now; the placement stays readable with no imports. Idempotent. */
WM_API void wm_placement_release_all(wm_placement* placement);

/* The plan as executed (refused imports are fallbacks, totals recomputed); owned by the
 * placement. Query it with the wm_plan_get_* functions. */
WM_API const wm_plan* wm_placement_plan(const wm_placement* placement);

/* Where one tensor lives. */
typedef struct wm_tensor_location {
    uint32_t struct_size;
    bool imported;             /* false: fallback, the engine copies it as before */
    uint32_t import_index;     /* its import (wm_placement_get_import); WM_NO_INDEX if none */
    uint64_t offset_in_buffer; /* buffer host_address + this == host_address */
    const void* host_address;  /* the tensor's bytes in the mapping (always set) */
    void* device_address;      /* buffer device_address + offset_in_buffer; NULL if none */
    const char* reason;        /* "" when imported; owned by the placement */
} wm_tensor_location;
WM_API wm_status wm_placement_locate(const wm_placement* placement, uint32_t tensor,
                                     wm_tensor_location* out);

/* The live imports, in order of import; 0 after wm_placement_release_all. */
typedef struct wm_placement_import {
    uint32_t struct_size;
    wm_imported_buffer buffer;
    uint32_t target;
    uint32_t file;
    uint32_t region;         /* in wm_placement_plan */
    uint32_t run;            /* in that region */
    uint64_t extent_offset;  /* file offset of buffer.host_address */
    uint32_t tensor_count;
    const uint32_t* tensors; /* the tensors it serves, by offset; owned by the placement */
} wm_placement_import;
WM_API uint32_t wm_placement_import_count(const wm_placement* placement);
WM_API wm_status wm_placement_get_import(const wm_placement* placement, uint32_t index,
                                         wm_placement_import* out);

/* --- populating the imports before they are pinned (populate.hpp) --------------------------- */

typedef struct wm_populate_report {
    uint32_t struct_size;
    uint64_t bytes;     /* bytes brought into the page cache and the mappings */
    double seconds;     /* wall time of the call */
    /* "MADV_POPULATE_READ", or "pread + page touch" on a kernel before 5.14; static storage */
    const char* method;
} wm_populate_report;

/* Brings every extent `plan` (made from `model`) imports on a non-CPU target into the page cache
 * and into `files` (one per model file, as wm_execute takes them), in large sequential requests
 * and in parallel, before wm_execute pins them: a cold file is then read at disk speed instead
 * of one page per fault (a cold llama.cpp load measured 236 MB/s in 4 KiB requests against
 * 1,222 MB/s in large reads). Only reads: nothing is written, locked or left allocated.
 * `report` may be NULL. Fails with WM_ERROR_IO naming the file for a file that cannot be read
 * or an extent past the file's end (the file was truncated after planning: the message says
 * where it now ends and the extent), WM_ERROR_INVALID_ARGUMENT for a wrong call (counts, NULL
 * arguments, an extent outside its mapping). Opens the model's file paths only on a kernel
 * before 5.14 (to pread them); on 5.14 and later it reads through `files` alone. */
WM_API wm_status wm_populate_imports(const wm_model* model, const wm_plan* plan,
                                     const wm_mapped_file* files, uint32_t file_count,
                                     wm_populate_report* report);

/* --- the mapping policy ---------------------------------------------------------------------- */

typedef enum wm_mapping_access {
    WM_MAPPING_READ_ONLY = 0, /* O_RDONLY, PROT_READ, MAP_SHARED: the default */
    WM_MAPPING_WRITABLE = 1   /* O_RDWR, PROT_READ|PROT_WRITE, MAP_SHARED: only when needed */
} wm_mapping_access;

typedef struct wm_mapping_decision wm_mapping_decision;

/* Decides how to map a model of `paths` (all shards) for `importers` (importer_count 0: the
 * registry's defaults): writable shared only when an available non-CPU importer needs writable
 * pages and every file opens O_RDWR (a real open(2), which sees read-only mounts even as root).
 * Never private-writable. Importers that WM_IMPORT_POLICY_UNIFIED_ONLY will not let import (a
 * discrete or unknown device) do not count. Fails only for bad arguments. */
WM_API wm_status wm_decide_mapping(const char* const* paths, uint32_t path_count,
                                   wm_importer* const* importers, uint32_t importer_count,
                                   wm_mapping_decision** out);
/* wm_decide_mapping under `policy` (not WM_IMPORT_POLICY_FROM_OPTIONS): pass the policy the plan
 * will use, so a discrete card planned with WM_IMPORT_POLICY_ALWAYS gets the writable mapping
 * its importer needs. */
WM_API wm_status wm_decide_mapping_for_policy(const char* const* paths, uint32_t path_count,
                                              wm_importer* const* importers,
                                              uint32_t importer_count, wm_import_policy policy,
                                              wm_mapping_decision** out);
WM_API void wm_mapping_decision_destroy(wm_mapping_decision* decision);
WM_API wm_mapping_access wm_mapping_decision_access(const wm_mapping_decision* decision);
/* One line: which importer asked for writable pages and whether every file allowed it. */
WM_API const char* wm_mapping_decision_reason(const wm_mapping_decision* decision);
/* The file that could not be opened O_RDWR when an importer needed it, else "". */
WM_API const char* wm_mapping_decision_unwritable_path(const wm_mapping_decision* decision);

typedef enum wm_access_hint {
    WM_ACCESS_NORMAL = 0,
    WM_ACCESS_RANDOM = 1,    /* madvise(MADV_RANDOM) */
    WM_ACCESS_SEQUENTIAL = 2 /* madvise(MADV_SEQUENTIAL) */
} wm_access_hint;

typedef struct wm_mapping_options {
    uint32_t struct_size;
    bool populate;           /* MAP_POPULATE */
    bool will_need;          /* madvise(MADV_WILLNEED) */
    bool lock;               /* mlock the whole mapping */
    wm_access_hint hint;
    uint64_t base_alignment; /* a power of two (below the page size, and 0: the page size) */
} wm_mapping_options;
WM_API void wm_mapping_options_init(wm_mapping_options* options);

typedef struct wm_mapped_model wm_mapped_model;

/* Maps every file of `paths` MAP_SHARED with `access` (options may be NULL). Errors name the
 * file and the system call; nothing stays mapped on failure. */
WM_API wm_status wm_mapped_model_open(const char* const* paths, uint32_t path_count,
                                      wm_mapping_access access, const wm_mapping_options* options,
                                      wm_mapped_model** out);
/* Unlocks and unmaps. Every placement over the mapping must be destroyed first. */
WM_API void wm_mapped_model_destroy(wm_mapped_model* mapped);
WM_API uint32_t wm_mapped_model_file_count(const wm_mapped_model* mapped);
/* wm_mapped_model_file_count entries, in path order, ready for wm_execute; owned by `mapped`. */
WM_API const wm_mapped_file* wm_mapped_model_files(const wm_mapped_model* mapped);
/* The real size of file `index`; 0 for a bad index or handle. */
WM_API uint64_t wm_mapped_model_file_size(const wm_mapped_model* mapped, uint32_t index);
WM_API wm_mapping_access wm_mapped_model_access(const wm_mapped_model* mapped);
WM_API bool wm_mapped_model_is_read_only(const wm_mapped_model* mapped);
/* Drops a writable mapping to PROT_READ once every importer holding an import survives it
 * (wm_importer_caps.survives_read_only_reprotect). Idempotent. */
WM_API wm_status wm_mapped_model_make_read_only(wm_mapped_model* mapped);

/* --- memory statistics ----------------------------------------------------------------------- */

#define WM_MEMSTAT_UNKNOWN (-1)

/* The process's own memory, in bytes; WM_MEMSTAT_UNKNOWN where the kernel does not report it.
 * DRM figures are summed over the process's DRM clients (each counted once). */
typedef struct wm_memstat {
    uint32_t struct_size;
    int64_t rss_file;
    int64_t rss_anon;
    int64_t rss_shmem;
    int64_t vm_lck;
    int64_t vm_pin;
    int64_t drm_gtt_total;     /* drm-total-gtt (older kernels: drm-memory-gtt) */
    int64_t drm_gtt_resident;
    int64_t drm_vram_total;
    int64_t drm_vram_resident;
} wm_memstat;
/* Reads /proc/self/status and /proc/self/fdinfo now. */
WM_API wm_status wm_memstat_read(wm_memstat* out);

/* --- split ordering (split_sync.hpp) --------------------------------------------------------- */

typedef struct wm_split_sync wm_split_sync;

typedef struct wm_split_sync_params {
    uint32_t struct_size;
    uint32_t n_backends;             /* 1..64 */
    bool sync_deferred_before_reuse; /* HIP graph capture; default false */
} wm_split_sync_params;
WM_API void wm_split_sync_params_init(wm_split_sync_params* params);

/* One split as the scheduler knows it before it starts (split_sync.hpp's SplitDesc documents
 * every field's constraint). Bit b of a backend mask is backend b; bit t of a buffer-type mask
 * is the engine's buffer type t. */
typedef struct wm_split_desc {
    uint32_t struct_size;
    uint32_t backend;
    bool backend_async;
    uint32_t n_inputs;
    uint64_t input_backends;
    bool input_copies_async; /* default true: the safe assumption */
    uint64_t buffer_types;
    bool writes_read_later;
} wm_split_desc;
WM_API void wm_split_desc_init(wm_split_desc* split);

typedef struct wm_split_sync_decision {
    uint32_t struct_size;
    uint64_t sync_now; /* backends to synchronize before starting the split */
    uint64_t deferred; /* asynchronous backends whose sync is deferred */
} wm_split_sync_decision;

WM_API wm_status wm_split_sync_create(const wm_split_sync_params* params, wm_split_sync** out);
WM_API void wm_split_sync_destroy(wm_split_sync* sync);
/* The decision for the next split of the current graph. A description that breaks a constraint
 * fails (naming the split, field and numbers) and leaves the state unchanged. */
WM_API wm_status wm_split_sync_next(wm_split_sync* sync, const wm_split_desc* split,
                                    wm_split_sync_decision* out);
/* Ends the graph: the backends to synchronize now; 0 for a NULL handle. */
WM_API uint64_t wm_split_sync_finish(wm_split_sync* sync);
WM_API void wm_split_sync_reset(wm_split_sync* sync);
/* Ends the graph without a drain: work in flight is carried into the next graph (split_sync.hpp,
 * SplitSync::end_graph). No-op for a NULL handle. */
WM_API void wm_split_sync_end_graph(wm_split_sync* sync);
/* The engine synchronized `backends` itself (SplitSync::synchronized). */
WM_API void wm_split_sync_synchronized(wm_split_sync* sync, uint64_t backends);
/* Backends with work the host does not know finished; 0 for a NULL handle. */
WM_API uint64_t wm_split_sync_in_flight(const wm_split_sync* sync);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTMAP_H */
