// SPDX-License-Identifier: MIT
// file_guard.hpp - tells the engine when a model file it imported from is about to change.
//
// An import makes the device read the file's page-cache pages for as long as the model is
// loaded: `cp other.gguf model.gguf` over a running server changes the weights the device reads
// in place, and truncating the file makes CPU reads of those pages fault (SIGBUS). A FileGuard
// watches the files an engine imported from, on one thread of its own:
//  - where the process may (it owns the file, or has CAP_LEASE), it holds a read lease
//    (F_SETLEASE F_RDLCK). A writer's open for writing or truncate() then blocks in the kernel
//    until the engine calls release() for that file (or until /proc/sys/fs/lease-break-time,
//    45 s by default, has passed: the kernel then drops the lease itself), and the guard reports
//    lease_breaking, so the engine can move its imports elsewhere before the bytes change;
//  - where it may not, it says why (FileGuardFileStatus::reason, and once through the log) and
//    reports `changed` after the fact, from inotify.
// No signal handler is installed and no signal reaches the engine's threads: the kernel signals
// a lease break to the file's owner, which the guard sets to its own thread, which blocks every
// signal (docs/file_guard.md, "Why no SIGIO reaches the engine").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/log.hpp"
#include "weightmap/result.hpp"

namespace wm {

namespace internal {
struct FileGuardAccess; // the C API's create-then-publish (lib/internal/file_guard_access.hpp)
}

/// A byte range of files[file] that the engine reads (an import's extent).
struct GuardedRegion {
    std::uint32_t file = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
};

/// One file to guard: a descriptor the caller opened O_RDONLY (not O_PATH; a descriptor open for
/// writing would itself forbid a read lease: the call fails) and its path, for messages only.
/// The guard opens the file again for itself, through /proc/self/fd/N (so /proc must be mounted
/// and the process still allowed to read the file), and holds the lease on that open file
/// description of its own: the caller's descriptor is never changed (no lease, owner, signal or
/// flag), the caller may close it once create() returned, and two guards of one descriptor (or
/// of dup()s of it) each hold their own lease.
struct GuardedFile {
    int fd = -1;
    std::string path;
};

enum class FileGuardEventKind {
    /// A writer opened the file for writing or truncated it and is blocked until release() (or
    /// the kernel's lease-break-time). Stop serving from the imports of this file, move them,
    /// then call release(). Only for a file whose lease was held.
    lease_breaking,
    /// The kernel dropped a breaking lease itself because the engine did not call release() within
    /// lease-break-time: the writer has proceeded, the bytes may be changing now.
    lease_broken_by_timeout,
    /// The file's bytes may have changed: a write or a truncation (inotify IN_MODIFY), or an
    /// attribute change or a close after an open for writing (IN_ATTRIB, IN_CLOSE_WRITE) after
    /// which the size or a sampled page differs from create()'s (FileGuardParams::regions). After the
    /// fact; for a file without a lease, or after release().
    changed,
    /// The path was renamed or unlinked (IN_MOVE_SELF, IN_DELETE_SELF, IN_ATTRIB with fewer
    /// links). Harmless for the imports: they hold the inode, whose bytes do not change; only the
    /// path now names another file (or none).
    path_moved,
    /// An attribute changed (touch, chmod, rsync -t) or a writer closed the file, and its bytes
    /// did not: with a lease held no writer can exist; without one the size and every sampled
    /// page are as at create(). Nothing to do. (A write through a writable shared mapping raises
    /// no IN_MODIFY: only the sampled pages would show it; see docs/file_guard.md.)
    metadata_changed,
};

/// "lease_breaking", "lease_broken_by_timeout", "changed", "path_moved", "metadata_changed";
/// never null.
WM_API const char* to_string(FileGuardEventKind kind) noexcept;

struct FileGuardEvent {
    std::uint32_t file = 0; ///< index into FileGuardParams::files
    FileGuardEventKind kind = FileGuardEventKind::changed;
    /// When the guard's thread noticed it: CLOCK_MONOTONIC (std::chrono::steady_clock) in ns.
    std::int64_t monotonic_ns = 0;
    /// lease_breaking: the earliest the kernel may drop the lease by itself (the last poll
    /// that saw it held, plus /proc/sys/fs/lease-break-time), same clock: a move must finish,
    /// and be confirmed by status(), before it. 0 for other events.
    std::int64_t deadline_ns = 0;
};

/// Where a file's lease stands.
enum class FileLeaseState {
    none,              ///< never taken: FileGuardFileStatus::reason says why; inotify only
    held,              ///< held, no writer waiting
    breaking,          ///< a writer is blocked until release() (lease_breaking was reported)
    released,          ///< the engine called release(): writers proceed; inotify still reports
    broken_by_timeout, ///< the kernel dropped it after lease-break-time; inotify still reports
};

/// "none", "held", "breaking", "released", "broken_by_timeout"; never null.
WM_API const char* to_string(FileLeaseState state) noexcept;

struct FileGuardFileStatus {
    FileLeaseState lease = FileLeaseState::none;
    /// Why no lease was taken (lease == none), e.g. "fcntl(F_SETLEASE, F_RDLCK) on
    /// /models/a.gguf: EAGAIN: the file is open for writing elsewhere"; "" otherwise.
    std::string reason;
    /// The errno of the refused F_SETLEASE (EACCES, EPERM, EAGAIN, EINVAL); 0 otherwise.
    int lease_errno = 0;
};

/// The callback's rules.
///  - Thread: the guard's own thread delivers every event, one at a time, never concurrently
///    with itself; never the thread that called create(), never a signal handler.
///  - When: never before create() has returned. The callback reaches the guard only where the
///    caller stores what create() returned, so it must find it there under a lock the caller
///    also holds while storing it (docs/file_guard.md, "The callback"); a break that begins
///    during create() is delivered right after it returned.
///  - Calls back: release() (any file), status() and destroying the guard are allowed (after
///    destroying it the callback must not touch it; the thread ends when the callback returns).
///    It must not wait for a thread that may be calling release() or destroying the guard: that
///    thread waits for the callback.
///  - Exceptions: one thrown from the callback is caught and logged (LogLevel::error, through
///    FileGuardParams::log); the event counts as delivered and the thread goes on. A
///    lease_breaking whose callback threw before release() keeps the writer blocked until
///    release() or lease-break-time.
using FileGuardCallback = std::function<void(const FileGuardEvent& event)>;

struct FileGuardParams {
    /// The files to guard, at least one, each once (two descriptors of one inode are refused).
    /// Each descriptor must be a regular file open O_RDONLY.
    std::vector<GuardedFile> files;
    /// Receives every event on the guard's thread (FileGuardCallback says when, and what it may
    /// do). Empty: events queue instead, for next_event()/take_events(), and event_fd() becomes
    /// readable while any is queued.
    FileGuardCallback on_event;
    /// How often the guard asks the kernel whether a held lease is breaking (F_GETLEASE), in
    /// milliseconds, 1..1000. The writer is blocked until release() anyway: the period only
    /// delays the engine's notice (by half of it on average). 20 ms measured 0.2% of one core
    /// with 1 file, 0.3% with 16 (docs/file_guard.md, "The polling period"). Only polled while
    /// a lease is held or breaking.
    std::uint32_t poll_period_ms = 20;
    /// The ranges the engine reads; none for a file: the whole of it. The guard hashes pages
    /// sampled over each file's ranges at create() and compares them after an event that says
    /// nothing of the bytes (metadata_changed, else changed). A `file` out of range is
    /// invalid_argument.
    std::vector<GuardedRegion> regions;
    /// Where "no lease" warnings and a callback's exceptions go; empty: the process-wide sink.
    LogCallback log;
};

/// The guard: one thread for all its files. Movable, not copyable.
///
/// Thread-safety and the guarantee between events and release():
///  - release(), status(), next_event(), take_events() and event_fd() may be called from any
///    thread at any time, concurrently, and release() also from inside the callback; like every
///    object, the guard must not be destroyed (or moved) while another thread calls it;
///  - once release(i) has returned, no lease_breaking or lease_broken_by_timeout event for file
///    i is delivered (none is running either, unless release() was called from inside that very
///    callback: release() from another thread waits for a callback in flight), and none stays
///    queued. `changed` and `path_moved` keep coming: the writer now proceeds;
///  - destroying the guard stops and joins its thread (a callback in flight completes first),
///    then drops every lease: no callback runs after the destructor returns. Destroying it from
///    inside its own callback is allowed: the thread then stops when the callback returns, and
///    the callback must not touch the guard afterwards.
///
/// fork(): a child inherits a copy of the guard without its thread: no event reaches the child.
/// The child's copies of the guard's descriptors are closed as it starts (a pthread_atfork
/// handler): the leases belong to open file descriptions shared with the parent, and a lease
/// ends only with a description's last close, so a child that kept them would hold the parent's
/// leases after the parent exited, and a writer would wait for the child. The one thing the
/// child may do with the copy is destroy it, which frees it and leaves the leases alone.
/// release() in a child fails with invalid_argument; any other call there may deadlock on a
/// lock the guard's thread held at the fork.
class WM_API FileGuard {
public:
    /// Opens each file again for the guard (GuardedFile), takes a lease on each where the
    /// kernel allows it (a refusal is not an error: the file is watched with inotify, its status
    /// says why, and a warning goes to the log once, on the calling thread), watches every file
    /// with inotify and starts the thread; events start once create() returned. Fails with
    /// invalid_argument (naming files[i], its path, the descriptor and the field) for no files,
    /// a negative, closed or O_PATH descriptor, one not open O_RDONLY, not a regular file, or a
    /// file of /proc, /sys or another filesystem whose bytes the kernel makes up, two entries of
    /// one file, a poll_period_ms out of range; with io (naming the file, the descriptor and the
    /// call) when the file cannot be reopened through /proc/self/fd, inotify cannot watch it, or
    /// F_SETLEASE fails for another reason than a refusal; with limit where the thread cannot
    /// start. On failure nothing is left held, open or running.
    static Result<FileGuard> create(FileGuardParams params);

    FileGuard(FileGuard&& other) noexcept;
    FileGuard& operator=(FileGuard&& other) noexcept;
    FileGuard(const FileGuard&) = delete;
    FileGuard& operator=(const FileGuard&) = delete;
    ~FileGuard();

    /// Drops the lease on file `file` (F_SETLEASE F_UNLCK): a blocked writer proceeds. Call it
    /// once the imports of that file are no longer used. Idempotent, and a no-op success for a
    /// file without a lease. Fails with invalid_argument for an index out of range, or in a
    /// fork()ed child.
    Status release(std::uint32_t file);

    /// The lease state of file `file`; invalid_argument for an index out of range. A breaking
    /// lease the kernel no longer lists reads broken_by_timeout at once (the event follows), so
    /// `lease == breaking` after a move confirms that the writer was still waiting throughout.
    Result<FileGuardFileStatus> status(std::uint32_t file) const;

    /// Reads `size` bytes at `offset` of file `file` through the guard's own descriptor (pread:
    /// a file truncated under the caller is an io error naming it, never a SIGBUS as through a
    /// mapping). invalid_argument for an index out of range.
    Status read(std::uint32_t file, std::uint64_t offset, void* destination, std::size_t size) const;

    std::uint32_t file_count() const noexcept;

    /// Without a callback: the oldest queued event into `out` and true, or false when none is.
    /// A `changed` event is queued once per file until it is taken.
    bool next_event(FileGuardEvent& out);
    /// Without a callback: every queued event, oldest first.
    std::vector<FileGuardEvent> take_events();
    /// An eventfd that is readable (POLLIN) while events are queued. Owned by the guard: poll
    /// it, never read or close it (next_event/take_events reset it). -1 for a moved-from guard.
    int event_fd() const noexcept;

    struct Impl;

private:
    friend struct internal::FileGuardAccess;
    explicit FileGuard(std::shared_ptr<Impl> impl) noexcept;
    void stop() noexcept;
    // Shared with the guard's thread, so that a guard destroyed from inside its own callback
    // outlives the callback's return.
    std::shared_ptr<Impl> impl_;
};

} // namespace wm
