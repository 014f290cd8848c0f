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
    /* The bytes may have changed, after the fact: a write or truncation (inotify IN_MODIFY), or
     * an attribute change or a close after an open for writing after which the size or a
     * sampled page (params.regions) differs from create's. */
    WM_FILE_GUARD_CHANGED = 2,
    /* The path was renamed or unlinked: harmless for the imports (they hold the inode). */
    WM_FILE_GUARD_PATH_MOVED = 3,
    /* An attribute changed (touch, chmod, rsync -t) or a writer closed the file, and the bytes
     * did not: with a lease held no writer can exist, without one the size and every sampled
     * page are as at create. Nothing to do. */
    WM_FILE_GUARD_METADATA_CHANGED = 4
} wm_file_guard_event_kind;

/* "lease_breaking", "lease_broken_by_timeout", "changed", "path_moved", "metadata_changed";
 * "?" otherwise. */
WM_API const char* wm_file_guard_event_kind_name(wm_file_guard_event_kind kind);

typedef struct wm_file_guard_event {
    uint32_t struct_size;
    uint32_t file; /* index into the files given to wm_file_guard_create */
    wm_file_guard_event_kind kind;
    int64_t monotonic_ns; /* when the guard noticed: CLOCK_MONOTONIC, in nanoseconds */
    /* LEASE_BREAKING: the earliest the kernel may drop the lease itself (the last poll that saw
     * it held + /proc/sys/fs/lease-break-time), same clock; a move must finish, and be confirmed
     * by wm_file_guard_get_file still reading BREAKING, before it. 0 otherwise. */
    int64_t deadline_ns;
} wm_file_guard_event;

/* The callback's rules.
 * - Thread: the guard's own thread delivers every event, one at a time, never concurrently
 *   with itself; never the thread that called wm_file_guard_create, never a signal handler.
 * - When: never before wm_file_guard_create has stored the handle in *out, so a callback may
 *   read the handle from where `out` pointed (a field of `user`, say) without any further
 *   synchronisation, and the first LEASE_BREAKING it hears can already be released. A break
 *   that begins during create is delivered right after it returned.
 * - Calls back: wm_file_guard_release (any file), wm_file_guard_get_file and
 *   wm_file_guard_destroy are allowed (after destroy the callback must not use the guard; the
 *   thread ends when it returns). It must not wait for a thread that may be calling
 *   wm_file_guard_release or wm_file_guard_destroy: that thread waits for the callback.
 * - Return: it must return normally (no longjmp out of it). C++ code behind this pointer
 *   should not throw: an exception that reaches the guard is caught and logged (WM_LOG_ERROR,
 *   params.log), as in the C++ API; one thrown through C frames is undefined behaviour. A
 *   LEASE_BREAKING it returns from without a release keeps the writer blocked until
 *   wm_file_guard_release or lease-break-time.
 * `event` is valid during the call only. */
typedef void (*wm_file_guard_event_fn)(void* user, const wm_file_guard_event* event);

/* One file: a descriptor the caller opened O_RDONLY (not O_PATH) and its path, for messages
 * only (copied). The guard opens the file again for itself, through /proc/self/fd/N (so /proc
 * must be mounted and the process still allowed to read the file), and holds the lease on that
 * open file description of its own: the caller's descriptor is never changed (no lease, owner,
 * signal or flag), the caller may close it once create returned, and two guards of one
 * descriptor (or of dup()s of it) each hold their own lease. Frozen layout. */
typedef struct wm_guarded_file {
    int fd;
    const char* path; /* may be NULL */
} wm_guarded_file;

/* A byte range of files[file] that the engine reads (an import's extent). */
typedef struct wm_guarded_region {
    uint32_t file;
    uint64_t offset;
    uint64_t size;
} wm_guarded_region;

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
    /* The ranges the engine reads, region_count of them (NULL, 0: every file whole). The guard
     * hashes pages sampled over each file's ranges at create and compares them after an event
     * that says nothing of the bytes (METADATA_CHANGED, else CHANGED). Copied. */
    const wm_guarded_region* regions;
    uint32_t region_count;
} wm_file_guard_params;

/* Fills the defaults and struct_size. */
WM_API void wm_file_guard_params_init(wm_file_guard_params* params);

/* Guards `files` (each file once; params may be NULL: the defaults): opens each again for the
 * guard (wm_guarded_file), takes a read lease on each where the kernel allows it (a refusal is
 * not a failure: wm_file_guard_get_file says why, and a warning goes to the log once, on the
 * calling thread), watches each with inotify and starts the guard's thread; events start once
 * *out is stored. Fails with WM_ERROR_INVALID_ARGUMENT naming files[i], its path, the descriptor
 * and the field (no files, a bad or closed descriptor, an O_PATH one, one not open O_RDONLY,
 * not a regular file, or a file of /proc, /sys or another filesystem whose bytes the kernel
 * makes up; two entries of one file; poll_period_ms out of range), with WM_ERROR_IO naming the
 * file, the descriptor and the call (the reopen through /proc/self/fd, inotify, an unexpected
 * F_SETLEASE error); on failure nothing is left held, open or running and *out is not
 * written. */
WM_API wm_status wm_file_guard_create(const wm_guarded_file* files, uint32_t file_count,
                                      const wm_file_guard_params* params, wm_file_guard** out);

/* Stops and joins the thread (a callback in flight completes first), drops every lease and frees
 * the guard: no callback runs after it returns. NULL is ignored. Allowed from inside the
 * callback: the thread then ends when the callback returns, which must not use the guard again.
 *
 * fork(): a child inherits a copy of the guard without its thread: no event reaches the child.
 * Its copies of the guard's descriptors are closed as it starts (pthread_atfork): a lease ends
 * only with its open file description's last close, so a child that kept them would hold the
 * parent's leases after the parent exited. Its one allowed call is wm_file_guard_destroy, which
 * frees the child's copy and leaves the leases alone.
 * wm_file_guard_release in a child fails with WM_ERROR_INVALID_ARGUMENT; any other call there
 * may deadlock on a lock the guard's thread held at the fork. */
WM_API void wm_file_guard_destroy(wm_file_guard* guard);

/* Drops the lease on file `file` (a blocked writer proceeds); call it once that file's imports
 * are no longer used. Idempotent; a no-op WM_OK for a file without a lease. Any thread of the
 * process that created the guard, also the callback. Once it returned, no LEASE_BREAKING or LEASE_BROKEN_BY_TIMEOUT event for the file is
 * delivered or stays queued, and none is in flight unless it was called from that callback;
 * CHANGED and PATH_MOVED events keep coming. */
WM_API wm_status wm_file_guard_release(wm_file_guard* guard, uint32_t file);

/* 0 for a NULL guard. */
WM_API uint32_t wm_file_guard_file_count(const wm_file_guard* guard);

/* Reads `size` bytes at `offset` of file `file` into `destination` through the guard's own
 * descriptor (pread): a file truncated meanwhile is WM_ERROR_IO naming it and the bytes read,
 * never a SIGBUS as through a mapping. WM_ERROR_INVALID_ARGUMENT for a NULL guard or
 * destination (with size > 0) or an index out of range. Any thread. */
WM_API wm_status wm_file_guard_read(const wm_file_guard* guard, uint32_t file, uint64_t offset,
                                    void* destination, size_t size);

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

/* The lease state of file `file`; a breaking lease the kernel no longer lists reads
 * BROKEN_BY_TIMEOUT at once (the event follows). */
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
