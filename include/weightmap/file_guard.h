/* SPDX-License-Identifier: MIT */
/* file_guard.h - the file guard's C entry points (C99), beside file_guard.hpp, its C++ side:
 * read leases on the model files an engine imported from, where the kernel allows them, and
 * inotify everywhere, so the engine hears that a file is about to change (a writer is blocked
 * until the engine releases it) or has changed, on a thread of the guard's own, through a
 * callback or an eventfd it polls. No signal handler is installed and no signal reaches the
 * engine's threads. docs/file_guard.md says what the kernel does and what an engine must do on
 * each event.
 *
 * Every convention of weightmap.h holds (wm_status, wm_last_error, struct_size, ownership). */
#ifndef WEIGHTMAP_FILE_GUARD_H
#define WEIGHTMAP_FILE_GUARD_H

#include "weightmap/weightmap.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wm_file_guard wm_file_guard;

typedef enum wm_file_guard_event_kind {
    /* A writer opened the file for writing or truncated it and is blocked in the kernel until
     * wm_file_guard_release (or lease-break-time, 45 s by default): stop using this file's
     * imports, move them, then release. Only for a file whose lease was held. */
    WM_FILE_GUARD_LEASE_BREAKING = 0,
    /* The kernel dropped a breaking lease itself after lease-break-time: the writer proceeded. */
    WM_FILE_GUARD_LEASE_BROKEN_BY_TIMEOUT = 1,
    /* The bytes or the size changed (inotify): after the fact. */
    WM_FILE_GUARD_CHANGED = 2,
    /* The path was renamed or unlinked: harmless for the imports (they hold the inode). */
    WM_FILE_GUARD_PATH_MOVED = 3
} wm_file_guard_event_kind;

/* "lease_breaking", "lease_broken_by_timeout", "changed", "path_moved"; "?" otherwise. */
WM_API const char* wm_file_guard_event_kind_name(wm_file_guard_event_kind kind);

typedef struct wm_file_guard_event {
    uint32_t struct_size;
    uint32_t file; /* index into the files given to wm_file_guard_create */
    wm_file_guard_event_kind kind;
    int64_t monotonic_ns; /* when the guard noticed: CLOCK_MONOTONIC, in nanoseconds */
} wm_file_guard_event;

/* Called on the guard's thread, one event at a time. `event` is valid during the call only. It
 * may call wm_file_guard_release (any file) and wm_file_guard_get_file; it must not wait for a
 * thread that may be calling wm_file_guard_release or wm_file_guard_destroy (that thread waits
 * for the callback). */
typedef void (*wm_file_guard_event_fn)(void* user, const wm_file_guard_event* event);

/* One file: a descriptor the caller opened O_RDONLY (duplicated by the guard: the caller may
 * close its own afterwards, but must not take leases or set F_SETOWN/F_SETSIG/O_ASYNC on it
 * while the guard lives) and its path, for messages only (copied). Frozen layout. */
typedef struct wm_guarded_file {
    int fd;
    const char* path; /* may be NULL */
} wm_guarded_file;

typedef struct wm_file_guard_params {
    uint32_t struct_size;
    /* NULL: events queue for wm_file_guard_next_event and wm_file_guard_event_fd is readable
     * while any is queued. */
    wm_file_guard_event_fn on_event;
    void* on_event_user;
    /* How often a held lease is checked for a pending break, 1..1000 ms; default 20. */
    uint32_t poll_period_ms;
    wm_log_fn log; /* NULL: the process-wide sink; gets the "no lease" warnings */
    void* log_user;
} wm_file_guard_params;

/* Fills the defaults and struct_size. */
WM_API void wm_file_guard_params_init(wm_file_guard_params* params);

/* Guards `files` (each file once; params may be NULL: the defaults): takes a read lease on each where the kernel
 * allows it (a refusal is not a failure: wm_file_guard_get_file says why, and a warning goes to
 * the log once), watches each with inotify and starts the guard's thread. Fails with
 * WM_ERROR_INVALID_ARGUMENT naming files[i], its path and the field (no files, a bad or closed
 * descriptor, one not open O_RDONLY or not a regular file, poll_period_ms out of range), with
 * WM_ERROR_IO naming the file and the call (dup, inotify, an unexpected F_SETLEASE error); on
 * failure nothing is left held, open or running and *out is not written. */
WM_API wm_status wm_file_guard_create(const wm_guarded_file* files, uint32_t file_count,
                                      const wm_file_guard_params* params, wm_file_guard** out);

/* Stops and joins the thread (a callback in flight completes first), drops every lease and frees
 * the guard: no callback runs after it returns. NULL is ignored. Allowed from inside the
 * callback: the thread then ends when the callback returns, which must not use the guard again. */
WM_API void wm_file_guard_destroy(wm_file_guard* guard);

/* Drops the lease on file `file` (a blocked writer proceeds); call it once that file's imports
 * are no longer used. Idempotent; a no-op WM_OK for a file without a lease. Any thread, also the
 * callback. Once it returned, no LEASE_BREAKING or LEASE_BROKEN_BY_TIMEOUT event for the file is
 * delivered or stays queued, and none is in flight unless it was called from that callback;
 * CHANGED and PATH_MOVED events keep coming. */
WM_API wm_status wm_file_guard_release(wm_file_guard* guard, uint32_t file);

/* 0 for a NULL guard. */
WM_API uint32_t wm_file_guard_file_count(const wm_file_guard* guard);

typedef enum wm_file_lease_state {
    WM_FILE_LEASE_NONE = 0,              /* never taken: see reason; inotify only */
    WM_FILE_LEASE_HELD = 1,
    WM_FILE_LEASE_BREAKING = 2,          /* a writer is blocked until release */
    WM_FILE_LEASE_RELEASED = 3,
    WM_FILE_LEASE_BROKEN_BY_TIMEOUT = 4
} wm_file_lease_state;

typedef struct wm_file_guard_file_status {
    uint32_t struct_size;
    wm_file_lease_state lease;
    int32_t lease_errno; /* EACCES, EPERM, EAGAIN or EINVAL when lease is NONE; else 0 */
    /* Why no lease was taken, naming the file; "" otherwise. Owned by the guard, valid until it
     * is destroyed (it never changes once create returned). */
    const char* reason;
} wm_file_guard_file_status;

WM_API wm_status wm_file_guard_get_file(const wm_file_guard* guard, uint32_t file,
                                        wm_file_guard_file_status* out);

/* Without a callback: moves the oldest queued event into *out and sets *has_event true, or sets
 * it false when none is queued. One CHANGED event per file is queued until it is taken. */
WM_API wm_status wm_file_guard_next_event(wm_file_guard* guard, wm_file_guard_event* out,
                                          bool* has_event);

/* An eventfd, readable (POLLIN) while events are queued; owned by the guard (poll it, never read
 * or close it). -1 for a NULL guard. */
WM_API int wm_file_guard_event_fd(const wm_file_guard* guard);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WEIGHTMAP_FILE_GUARD_H */
