// SPDX-License-Identifier: MIT
// FileGuard: read leases where the kernel allows them, inotify everywhere, one thread.
// docs/file_guard.md explains what the kernel does and why each choice below was made.
#include "weightmap/file_guard.hpp"

#include <linux/magic.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "internal/file_fingerprint.hpp"
#include "internal/file_guard_access.hpp"
#include "internal/nothrow.hpp"

namespace wm {

const char* to_string(FileGuardEventKind kind) noexcept {
    switch (kind) {
    case FileGuardEventKind::lease_breaking: return "lease_breaking";
    case FileGuardEventKind::lease_broken_by_timeout: return "lease_broken_by_timeout";
    case FileGuardEventKind::changed: return "changed";
    case FileGuardEventKind::path_moved: return "path_moved";
    case FileGuardEventKind::metadata_changed: return "metadata_changed";
    }
    return "?";
}

const char* to_string(FileLeaseState state) noexcept {
    switch (state) {
    case FileLeaseState::none: return "none";
    case FileLeaseState::held: return "held";
    case FileLeaseState::breaking: return "breaking";
    case FileLeaseState::released: return "released";
    case FileLeaseState::broken_by_timeout: return "broken_by_timeout";
    }
    return "?";
}

namespace {

constexpr std::uint32_t watch_mask =
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF;

std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

const char* errno_name(int e) {
    switch (e) {
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EAGAIN: return "EAGAIN";
    case EINVAL: return "EINVAL";
    case EBADF: return "EBADF";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
    case ENOSPC: return "ENOSPC";
    case ENOMEM: return "ENOMEM";
    case ENOLCK: return "ENOLCK";
    case ENOENT: return "ENOENT";
    case ENXIO: return "ENXIO";
    }
    return "errno";
}

std::string errno_text(int e) { return fmt::format("{} ({})", errno_name(e), std::strerror(e)); }

// Why the kernel refused a read lease, for the refusals that are not errors.
const char* refusal_reason(int e) {
    switch (e) {
    case EACCES:
    case EPERM: return "not the file's owner and no CAP_LEASE";
    case EAGAIN: return "the file is open for writing elsewhere";
    case EINVAL: return "the filesystem has no leases (or fs.leases-enable is 0)";
    }
    return nullptr;
}

bool is_lease_event(FileGuardEventKind kind) {
    return kind == FileGuardEventKind::lease_breaking ||
           kind == FileGuardEventKind::lease_broken_by_timeout;
}

// A lease the kernel still lists on the descriptor (/proc/self/fdinfo shows "LEASE  BREAKING"
// while a break is pending). F_GETLEASE cannot tell: it answers F_UNLCK both while a break is
// pending and once the kernel dropped the lease after lease-break-time. Unreadable fdinfo (no
// /proc): assume it is still there, so a timeout is never reported falsely.
bool kernel_lists_lease(int fd) {
    const std::string path = fmt::format("/proc/self/fdinfo/{}", fd);
    const int info = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (info < 0) return true;
    char text[4096];
    const ssize_t n = ::read(info, text, sizeof text - 1);
    ::close(info);
    if (n < 0) return true;
    text[n] = '\0';
    return std::strstr(text, "LEASE") != nullptr;
}

void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
}

// /proc/sys/fs/lease-break-time, in ns: how long the kernel waits for release() before it drops
// a breaking lease itself (45 s by default; the documented default where it cannot be read).
std::int64_t lease_break_time_ns() {
    long seconds = 45;
    if (FILE* f = std::fopen("/proc/sys/fs/lease-break-time", "re")) {
        if (std::fscanf(f, "%ld", &seconds) != 1 || seconds < 0) seconds = 45;
        std::fclose(f);
    }
    return static_cast<std::int64_t>(seconds) * 1000000000LL;
}

} // namespace

// Hidden: a nested class takes the visibility of the exported FileGuard otherwise.
struct __attribute__((visibility("hidden"))) FileGuard::Impl {
    struct File {
        // The guard's own open file description of the file: the lease, its owner and F_UNLCK
        // act on a description, so one shared with the caller or another guard would let
        // either drop this guard's lease (issue 44).
        int fd = -1;
        int caller_fd = -1; // for messages only
        std::string path;
        int watch = -1;
        FileLeaseState lease = FileLeaseState::none;
        std::string reason;
        int lease_errno = 0;
        struct stat last{}; // the guard thread's only
        internal::FileFingerprint fingerprint; // of the bytes at create
        std::int64_t last_held_ns = 0;         // the last poll that saw the lease held
    };

    std::vector<File> files;
    FileGuardCallback on_event;
    LogCallback log;
    std::uint32_t period_ms = 20;
    std::int64_t lease_break_ns = lease_break_time_ns();
    int inotify_fd = -1;
    int wake_fd = -1;  // written by stop() and publish()
    int event_fd = -1; // readable while `queue` is not empty
    pthread_t thread{};
    bool thread_started = false; // `thread` is ours to join or detach
    std::thread::id thread_id;   // published by thread_tid
    std::promise<pid_t> thread_tid;
    // The thread's own reference: a guard destroyed from inside its callback lives on until the
    // callback returns. A member, not a capture, so that a fork()ed child (where the thread does
    // not exist) can drop it: see abandon().
    std::shared_ptr<Impl> thread_ref;
    const pid_t creator = ::getpid(); // leases and the thread are this process's only
    std::atomic<bool> published{false}; // events may be delivered (set once create returned)
    std::atomic<bool> stopping{false};
    mutable std::mutex mutex;  // files[].lease/reason, queue
    std::mutex delivery;       // held by the guard thread around each callback
    std::deque<FileGuardEvent> queue;

    ~Impl();
    Status open_files(const std::vector<GuardedFile>& given, const std::vector<GuardedRegion>& regions);
    Status open_file(std::uint32_t i, const GuardedFile& given,
                     const std::vector<internal::FileFingerprint::Range>& ranges);
    Status take_lease(std::uint32_t i, pid_t tid);
    void drop_lease(File& f);
    Status release(std::uint32_t i);
    void abandon() noexcept;
    void run();
    void wait_until_published();
    bool lease_to_poll() const;
    void wait_for_activity();
    void wake();
    void read_inotify(std::vector<FileGuardEvent>& events);
    void classify(std::uint32_t i, std::uint32_t mask, std::vector<FileGuardEvent>& events);
    bool bytes_as_created(const File& f);
    void close_in_child() noexcept;
    void poll_leases(std::vector<FileGuardEvent>& events);
    void deliver(const std::vector<FileGuardEvent>& events);
    void call(const FileGuardEvent& event);
    void enqueue(const FileGuardEvent& event);
    void reset_event_fd();
    bool on_guard_thread() const { return std::this_thread::get_id() == thread_id; }
    bool forked() const { return ::getpid() != creator; }
};

// --- fork(): the child closes its copies of every guard's descriptors ------------------------

namespace {

// Every live guard of the process, for the fork handler. Never destroyed: a guard may outlive
// static destruction in a thread that exits late.
struct LiveGuards {
    std::mutex mutex;
    std::vector<FileGuard::Impl*> guards;
};
LiveGuards& live_guards() {
    static auto* live = new LiveGuards;
    return *live;
}

// The lock is taken across fork(), so the child's copy of the list is consistent; in the child
// only the forking thread exists, and it closes the descriptors without any other lock.
void before_fork() { live_guards().mutex.lock(); }
void after_fork_in_parent() { live_guards().mutex.unlock(); }
void after_fork_in_child() {
    for (FileGuard::Impl* g : live_guards().guards) g->close_in_child();
    live_guards().mutex.unlock();
}

void remember_guard(FileGuard::Impl* g) {
    static std::once_flag handlers;
    std::call_once(handlers, [] { ::pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); });
    std::lock_guard lock(live_guards().mutex);
    live_guards().guards.push_back(g);
}

void forget_guard(FileGuard::Impl* g) {
    std::lock_guard lock(live_guards().mutex);
    auto& all = live_guards().guards;
    all.erase(std::remove(all.begin(), all.end(), g), all.end());
}

} // namespace

// A child that kept its copies would hold the parent's open file descriptions, and with them the
// leases, after the parent exited: a writer then waited for the child (issue 45). Closing a copy
// never drops the parent's lease (a lease ends with the description's last close).
void FileGuard::Impl::close_in_child() noexcept {
    for (File& f : files) close_fd(f.fd);
    close_fd(inotify_fd);
    close_fd(wake_fd);
    close_fd(event_fd);
}

FileGuard::Impl::~Impl() {
    forget_guard(this);
    for (File& f : files) {
        drop_lease(f);
        close_fd(f.fd);
    }
    close_fd(inotify_fd);
    close_fd(wake_fd);
    close_fd(event_fd);
}

// Drops a held or breaking lease. Caller holds `mutex`, or is the only user left. Never in a
// fork()ed child: its copy of the descriptor is the parent's open file description, so its
// F_UNLCK would drop the parent's lease. Closing the copy does not: a lease ends only with the
// description's last close (locks_remove_file in __fput), and the parent still holds it.
void FileGuard::Impl::drop_lease(File& f) {
    if (f.lease != FileLeaseState::held && f.lease != FileLeaseState::breaking) return;
    if (forked()) return;
    ::fcntl(f.fd, F_SETLEASE, F_UNLCK);
    f.lease = FileLeaseState::released;
}

// In a fork()ed child: the guard's thread does not exist here, and its mutexes may have been
// held at the fork, so nothing is joined, detached or locked. Dropping the thread's reference
// lets ~Impl free the child's copy and close its descriptors (drop_lease leaves the leases).
void FileGuard::Impl::abandon() noexcept {
    thread_started = false;
    thread_ref.reset();
}

namespace {

struct GeneratedFs {
    decltype(statfs::f_type) magic;
    const char* name;
};

// Filesystems whose files the kernel makes up on each read: no writer opens them, so neither a
// lease nor inotify can tell of a change (/proc/self/status was accepted before, with
// F_SETLEASE answering EINVAL, and guarded nothing).
constexpr GeneratedFs generated_fs[] = {
    {PROC_SUPER_MAGIC, "procfs (/proc)"}, {SYSFS_MAGIC, "sysfs (/sys)"},
    {DEBUGFS_MAGIC, "debugfs"},           {TRACEFS_MAGIC, "tracefs"},
    {SECURITYFS_MAGIC, "securityfs"},     {CGROUP_SUPER_MAGIC, "cgroupfs"},
    {CGROUP2_SUPER_MAGIC, "cgroup2fs"},
};

const char* generated_fs_of(int fd) {
    struct statfs fs {};
    if (::fstatfs(fd, &fs) != 0) return nullptr;
    for (const GeneratedFs& g : generated_fs)
        if (fs.f_type == g.magic) return g.name;
    return nullptr;
}

Error invalid_file(const std::string& where, int fd, const std::string& what) {
    return Error{ErrorKind::invalid_argument, fmt::format("{}: fd {} {}", where, fd, what)};
}

// The descriptor's own flags. O_PATH first: its access bits read as O_RDONLY, but it allows no
// file operation, so every fcntl below would fail later with EBADF.
Status check_open_flags(const GuardedFile& file, const std::string& where) {
    const int flags = ::fcntl(file.fd, F_GETFL);
    if (flags < 0)
        return invalid_file(where, file.fd,
                            "is not an open descriptor: " + errno_text(errno));
    if ((flags & O_PATH) != 0)
        return invalid_file(where, file.fd,
                            "is an O_PATH descriptor, which allows no file operation and no "
                            "lease; open the file O_RDONLY");
    if ((flags & O_ACCMODE) != O_RDONLY)
        return invalid_file(where, file.fd,
                            "is open for writing; a read lease needs a descriptor opened "
                            "O_RDONLY");
    return {};
}

Status check_file(const GuardedFile& file, std::uint32_t i) {
    const std::string where = fmt::format("FileGuard::create: files[{}] ({})", i, file.path);
    if (file.fd < 0) return make_error(ErrorKind::invalid_argument, where + ": fd is " +
                                                                        std::to_string(file.fd));
    if (auto flags = check_open_flags(file, where); !flags) return flags;
    struct stat st {};
    if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode))
        return invalid_file(where, file.fd, "is not a regular file");
    if (const char* fs = generated_fs_of(file.fd))
        return invalid_file(where, file.fd,
                            fmt::format("is a file of {}, whose bytes the kernel makes up on "
                                        "each read: nothing to guard",
                                        fs));
    return {};
}

// One entry per file: two entries of one inode would share an inotify watch, and a writer
// would break two leases of which the engine may release only one.
Status check_distinct(const std::vector<GuardedFile>& files) {
    std::vector<struct stat> seen(files.size());
    for (std::uint32_t i = 0; i < files.size(); ++i) {
        ::fstat(files[i].fd, &seen[i]);
        for (std::uint32_t j = 0; j < i; ++j)
            if (seen[j].st_dev == seen[i].st_dev && seen[j].st_ino == seen[i].st_ino)
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("FileGuard::create: files[{}] ({}): fd {} is the "
                                              "same file as files[{}] ({})",
                                              i, files[i].path, files[i].fd, j, files[j].path));
    }
    return {};
}

Status check_params(const FileGuardParams& params) {
    if (params.files.empty())
        return make_error(ErrorKind::invalid_argument, "FileGuard::create: params.files is empty");
    if (params.poll_period_ms < 1 || params.poll_period_ms > 1000)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("FileGuard::create: params.poll_period_ms is {}; 1..1000",
                                      params.poll_period_ms));
    for (std::uint32_t i = 0; i < params.files.size(); ++i)
        if (auto checked = check_file(params.files[i], i); !checked) return checked;
    for (std::size_t r = 0; r < params.regions.size(); ++r)
        if (params.regions[r].file >= params.files.size())
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("FileGuard::create: params.regions[{}].file is {}; "
                                          "there are {} files",
                                          r, params.regions[r].file, params.files.size()));
    return check_distinct(params.files);
}

} // namespace

Status FileGuard::Impl::open_files(const std::vector<GuardedFile>& given,
                                   const std::vector<GuardedRegion>& regions) {
    remember_guard(this);
    inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    wake_fd = ::eventfd(0, EFD_CLOEXEC);
    event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (inotify_fd < 0 || wake_fd < 0 || event_fd < 0)
        return make_error(ErrorKind::io, "FileGuard::create: inotify_init1/eventfd: " +
                                             errno_text(errno));
    for (std::uint32_t i = 0; i < given.size(); ++i) {
        std::vector<internal::FileFingerprint::Range> ranges;
        for (const GuardedRegion& r : regions)
            if (r.file == i) ranges.push_back({r.offset, r.size});
        if (auto opened = open_file(i, given[i], ranges); !opened) return opened;
    }
    return {};
}

// Reopens the caller's file through /proc/self/fd/N: a new open file description, where
// F_DUPFD would share the caller's (see File::fd). The inode must be the descriptor's: the
// number could have been reused since check_file. O_NONBLOCK: the open then neither hangs on a
// FIFO nor waits out another process's write lease; the guard never reads from it. The watch
// goes through the new descriptor too: the caller's path may already name another file.
Status FileGuard::Impl::open_file(std::uint32_t i, const GuardedFile& given,
                                  const std::vector<internal::FileFingerprint::Range>& ranges) {
    File& f = files.emplace_back(); // from here ~Impl closes what was opened
    f.path = given.path;
    f.caller_fd = given.fd;
    const std::string where =
        fmt::format("FileGuard::create: files[{}] ({}): fd {}", i, f.path, given.fd);
    const std::string theirs = fmt::format("/proc/self/fd/{}", given.fd);
    f.fd = ::open(theirs.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (f.fd < 0)
        return make_error(ErrorKind::io, fmt::format("{}: open({}) for an open file description "
                                                     "of the guard's own: {}",
                                                     where, theirs, errno_text(errno)));
    struct stat caller {};
    if (::fstat(f.fd, &f.last) != 0 || ::fstat(given.fd, &caller) != 0)
        return make_error(ErrorKind::io, fmt::format("{}: fstat: {}", where, errno_text(errno)));
    if (f.last.st_dev != caller.st_dev || f.last.st_ino != caller.st_ino)
        return make_error(ErrorKind::io,
                          fmt::format("{}: {} opened another file (device {}, inode {}) than the "
                                      "descriptor's (device {}, inode {})",
                                      where, theirs, f.last.st_dev, f.last.st_ino,
                                      caller.st_dev, caller.st_ino));
    f.fingerprint = internal::FileFingerprint::take(f.fd, ranges);
    const std::string mine = fmt::format("/proc/self/fd/{}", f.fd);
    f.watch = ::inotify_add_watch(inotify_fd, mine.c_str(), watch_mask);
    if (f.watch < 0)
        return make_error(ErrorKind::io,
                          fmt::format("{}: inotify_add_watch: {}", where, errno_text(errno)));
    return {};
}

// The owner goes to the guard's thread *before* F_SETLEASE: the kernel's lease_setup makes the
// calling process the owner only when none is set, and a break signals the owner (SIGIO). Owned
// by a thread that blocks every signal, the signal stays pending on that thread and reaches no
// handler of the engine, with no window between taking the lease and redirecting it. The
// description is the guard's own, so the owner is never given back. The log is called outside
// `mutex`: a slow log callback must not hold up the thread.
Status FileGuard::Impl::take_lease(std::uint32_t i, pid_t tid) {
    File& f = files[i];
    const std::string where = fmt::format("files[{}] ({}): fd {}", i, f.path, f.caller_fd);
    const f_owner_ex guard_thread{F_OWNER_TID, tid};
    if (::fcntl(f.fd, F_SETOWN_EX, &guard_thread) != 0)
        return make_error(ErrorKind::io, fmt::format("FileGuard::create: {}: fcntl(F_SETOWN_EX): "
                                                     "{}",
                                                     where, errno_text(errno)));
    {
        std::lock_guard lock(mutex);
        if (::fcntl(f.fd, F_SETLEASE, F_RDLCK) == 0) {
            f.lease = FileLeaseState::held;
            f.last_held_ns = now_ns();
            return {};
        }
        const int e = errno;
        const std::string what = fmt::format("FileGuard: {}: no lease: fcntl(F_SETLEASE, "
                                             "F_RDLCK): {}",
                                             where, errno_text(e));
        if (refusal_reason(e) == nullptr)
            return make_error(ErrorKind::io, "FileGuard::create: " + what);
        f.reason = what + ": " + refusal_reason(e) + "; watching it with inotify instead";
        f.lease_errno = e;
    }
    log_message(log, LogLevel::warning, f.reason);
    return {};
}

Status FileGuard::Impl::release(std::uint32_t i) {
    if (i >= files.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("FileGuard::release: file {} is out of range ({})", i,
                                      files.size()));
    if (forked()) // before any lock: the thread that may have held one does not exist here
        return make_error(ErrorKind::invalid_argument,
                          "FileGuard::release: called in a fork()ed child; the lease is the "
                          "parent's (only destroying the guard is allowed here)");
    // From another thread, wait for a callback in flight: after release() returns no lease
    // event for this file runs. From inside the callback the lock is already this thread's.
    std::unique_lock<std::mutex> in_flight(delivery, std::defer_lock);
    if (!on_guard_thread()) in_flight.lock();
    std::lock_guard lock(mutex);
    drop_lease(files[i]);
    for (auto it = queue.begin(); it != queue.end();)
        it = it->file == i && is_lease_event(it->kind) ? queue.erase(it) : std::next(it);
    if (queue.empty()) reset_event_fd();
    return {};
}

// --- the guard's thread ----------------------------------------------------------------------

// A pass right after publication: a break that began during create is reported at once.
void FileGuard::Impl::run() {
    wait_until_published();
    while (!stopping.load()) {
        std::vector<FileGuardEvent> events;
        read_inotify(events);
        poll_leases(events);
        deliver(events);
        wait_for_activity();
    }
}

// No event before create's caller has the handle (issue 44): a callback that hears
// lease_breaking must be able to release, and finds the guard only where that caller stored
// it. A break meanwhile stays pending in the kernel and inotify keeps its events.
void FileGuard::Impl::wait_until_published() {
    pollfd fd{wake_fd, POLLIN, 0};
    while (!published.load() && !stopping.load()) {
        while (::poll(&fd, 1, -1) < 0 && errno == EINTR) {
        }
        std::uint64_t count = 0;
        if (!stopping.load())
            [[maybe_unused]] const ssize_t n = ::read(wake_fd, &count, sizeof count);
    }
}

bool FileGuard::Impl::lease_to_poll() const {
    std::lock_guard lock(mutex);
    for (const File& f : files)
        if (f.lease == FileLeaseState::held || f.lease == FileLeaseState::breaking) return true;
    return false;
}

// Sleeps until inotify has events, the wake eventfd is written, or the poll period passes while
// a lease is held: without one there is nothing to poll and the thread sleeps in poll(2).
void FileGuard::Impl::wait_for_activity() {
    pollfd fds[2] = {{wake_fd, POLLIN, 0}, {inotify_fd, POLLIN, 0}};
    const int timeout = lease_to_poll() ? static_cast<int>(period_ms) : -1;
    while (::poll(fds, 2, timeout) < 0 && errno == EINTR) {
    }
    std::uint64_t count = 0;
    if ((fds[0].revents & POLLIN) != 0 && !stopping.load())
        [[maybe_unused]] const ssize_t n = ::read(wake_fd, &count, sizeof count);
}

void FileGuard::Impl::wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
}

void FileGuard::Impl::read_inotify(std::vector<FileGuardEvent>& events) {
    alignas(inotify_event) char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(inotify_fd, buffer, sizeof buffer);
        if (n <= 0) return;
        for (ssize_t at = 0; at < n;) {
            const auto* e = reinterpret_cast<const inotify_event*>(buffer + at);
            // An overflowed queue lost events: compare every file's size and mtime instead.
            const bool lost = (e->mask & IN_Q_OVERFLOW) != 0;
            for (std::uint32_t i = 0; i < files.size(); ++i)
                if (files[i].watch == e->wd || lost)
                    classify(i, lost ? std::uint32_t{IN_ATTRIB} : e->mask, events);
            at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
        }
    }
}

// IN_MODIFY is a write or a truncation: a change. IN_ATTRIB (touch, chmod, rsync -t) and
// IN_CLOSE_WRITE (a writer that may have written nothing) say nothing of the bytes: with a lease
// held or breaking no writer can exist, else the size and the sampled pages decide (a touch
// used to stop a served model: issue 45). Fewer links is an unlink.
void FileGuard::Impl::classify(std::uint32_t i, std::uint32_t mask,
                               std::vector<FileGuardEvent>& events) {
    File& f = files[i];
    struct stat now {};
    if (::fstat(f.fd, &now) != 0) now = f.last;
    const bool unlinked = now.st_nlink < f.last.st_nlink;
    f.last = now;
    if ((mask & IN_MODIFY) != 0) {
        events.push_back({i, FileGuardEventKind::changed, now_ns()});
    } else if ((mask & (IN_ATTRIB | IN_CLOSE_WRITE)) != 0 && !unlinked) {
        const bool same = bytes_as_created(f);
        events.push_back({i, same ? FileGuardEventKind::metadata_changed : FileGuardEventKind::changed, now_ns()});
    }
    if ((mask & (IN_MOVE_SELF | IN_DELETE_SELF)) != 0 || ((mask & IN_ATTRIB) != 0 && unlinked))
        events.push_back({i, FileGuardEventKind::path_moved, now_ns()});
}

bool FileGuard::Impl::bytes_as_created(const File& f) {
    {
        std::lock_guard lock(mutex);
        if (f.lease == FileLeaseState::held || f.lease == FileLeaseState::breaking) return true;
    }
    return f.fingerprint.matches(f.fd);
}

// Under `mutex`, so that release() cannot drop a lease between F_GETLEASE answering F_UNLCK and
// the state change: a lease the engine dropped itself is never reported as breaking.
void FileGuard::Impl::poll_leases(std::vector<FileGuardEvent>& events) {
    std::lock_guard lock(mutex);
    for (std::uint32_t i = 0; i < files.size(); ++i) {
        File& f = files[i];
        if (f.lease == FileLeaseState::held && ::fcntl(f.fd, F_GETLEASE) == F_UNLCK) {
            f.lease = FileLeaseState::breaking;
            // the break began after the last poll that saw the lease held
            events.push_back({i, FileGuardEventKind::lease_breaking, now_ns(), f.last_held_ns + lease_break_ns});
        } else if (f.lease == FileLeaseState::held) {
            f.last_held_ns = now_ns();
        } else if (f.lease == FileLeaseState::breaking && !kernel_lists_lease(f.fd)) {
            f.lease = FileLeaseState::broken_by_timeout;
            events.push_back({i, FileGuardEventKind::lease_broken_by_timeout, now_ns()});
        }
    }
}

void FileGuard::Impl::deliver(const std::vector<FileGuardEvent>& events) {
    std::vector<FileGuardEvent> unique; // one per file and kind: a truncation raises two
    for (const FileGuardEvent& e : events) {
        bool seen = false;
        for (const FileGuardEvent& u : unique) seen |= u.file == e.file && u.kind == e.kind;
        if (!seen) unique.push_back(e);
    }
    if (!on_event) {
        for (const FileGuardEvent& e : unique) enqueue(e);
        return;
    }
    std::lock_guard in_flight(delivery);
    for (const FileGuardEvent& e : unique) call(e);
}

void FileGuard::Impl::call(const FileGuardEvent& event) {
    if (stopping.load()) return;
    if (is_lease_event(event.kind)) {
        std::lock_guard lock(mutex);
        if (files[event.file].lease == FileLeaseState::released) return;
    }
    try {
        on_event(event);
    } catch (const std::exception& e) {
        log_message(log, LogLevel::error,
                    fmt::format("FileGuard: the event callback threw: {}", e.what()));
    } catch (...) {
        log_message(log, LogLevel::error, "FileGuard: the event callback threw");
    }
}

void FileGuard::Impl::enqueue(const FileGuardEvent& event) {
    std::lock_guard lock(mutex);
    if (is_lease_event(event.kind) && files[event.file].lease == FileLeaseState::released) return;
    for (const FileGuardEvent& q : queue)
        if (q.file == event.file && q.kind == FileGuardEventKind::changed &&
            event.kind == FileGuardEventKind::changed)
            return; // one unread "changed" per file says it all
    queue.push_back(event);
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(event_fd, &one, sizeof one);
}

void FileGuard::Impl::reset_event_fd() {
    std::uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(event_fd, &count, sizeof count);
}

// --- FileGuard -------------------------------------------------------------------------------

namespace {

// The guard's thread. Its reference to Impl is dropped last, which may free it.
void* thread_main(void* arg) {
    auto* impl = static_cast<FileGuard::Impl*>(arg);
    impl->thread_id = std::this_thread::get_id(); // published by set_value
    impl->thread_tid.set_value(static_cast<pid_t>(::syscall(SYS_gettid)));
    impl->run();
    const std::shared_ptr<FileGuard::Impl> last = std::move(impl->thread_ref);
    return nullptr;
}

// Starts the thread with every signal blocked (it inherits the mask): a lease break's SIGIO
// then stays pending on it, and no handler of the engine ever runs on it. A pthread, not a
// std::thread: a fork()ed child can then forget it without leaking its closure (abandon()).
Result<pid_t> start_thread(const std::shared_ptr<FileGuard::Impl>& impl) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    std::future<pid_t> started = impl->thread_tid.get_future();
    impl->thread_ref = impl;
    const int e = ::pthread_create(&impl->thread, nullptr, thread_main, impl.get());
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (e != 0) {
        impl->thread_ref.reset();
        return make_error(ErrorKind::limit,
                          "FileGuard::create: cannot start its thread: pthread_create: " +
                              errno_text(e));
    }
    impl->thread_started = true;
    return started.get();
}

} // namespace

FileGuard::FileGuard(std::shared_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
FileGuard::FileGuard(FileGuard&& other) noexcept = default;

FileGuard& FileGuard::operator=(FileGuard&& other) noexcept {
    if (this != &other) {
        stop();
        impl_ = std::move(other.impl_);
    }
    return *this;
}

FileGuard::~FileGuard() { stop(); }

// Joins the thread (a callback in flight completes first), then drops every lease. From inside
// the callback the thread cannot join itself: it is detached and ends when the callback returns,
// keeping Impl alive through its own reference. In a fork()ed child only this process's copy
// goes (abandon()).
void FileGuard::stop() noexcept {
    if (!impl_) return;
    if (impl_->forked()) {
        impl_->abandon();
        impl_.reset();
        return;
    }
    impl_->stopping.store(true);
    if (impl_->thread_started) {
        impl_->thread_started = false;
        impl_->wake();
        if (impl_->on_guard_thread()) ::pthread_detach(impl_->thread);
        else ::pthread_join(impl_->thread, nullptr);
    }
    {
        std::lock_guard lock(impl_->mutex);
        for (Impl::File& f : impl_->files) impl_->drop_lease(f);
    }
    impl_.reset();
}

Result<FileGuard> FileGuard::create(FileGuardParams params) {
    auto created = internal::FileGuardAccess::create_unpublished(std::move(params));
    if (created) internal::FileGuardAccess::publish(*created);
    return created;
}

namespace internal {

Result<FileGuard> FileGuardAccess::create_unpublished(FileGuardParams params) {
    return internal::result_nothrow([&]() -> Result<FileGuard> {
        if (auto checked = check_params(params); !checked) return std::move(checked).error();
        auto impl = std::make_shared<FileGuard::Impl>();
        impl->on_event = std::move(params.on_event);
        impl->log = std::move(params.log);
        impl->period_ms = params.poll_period_ms;
        if (auto opened = impl->open_files(params.files, params.regions); !opened)
            return std::move(opened).error();
        auto tid = start_thread(impl);
        if (!tid) return std::move(tid).error();
        FileGuard guard(std::move(impl)); // from here a failure stops the thread, drops leases
        for (std::uint32_t i = 0; i < guard.impl_->files.size(); ++i)
            if (auto taken = guard.impl_->take_lease(i, *tid); !taken)
                return std::move(taken).error();
        return guard;
    });
}

void FileGuardAccess::publish(FileGuard& guard) noexcept {
    if (!guard.impl_ || guard.impl_->published.exchange(true)) return;
    guard.impl_->wake();
}

} // namespace internal

Status FileGuard::release(std::uint32_t file) {
    if (!impl_) return make_error(ErrorKind::invalid_argument, "FileGuard::release: moved-from");
    return internal::status_nothrow([&] { return impl_->release(file); });
}

Result<FileGuardFileStatus> FileGuard::status(std::uint32_t file) const {
    return internal::result_nothrow([&]() -> Result<FileGuardFileStatus> {
        const std::uint32_t count = file_count();
        if (file >= count)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("FileGuard::status: file {} is out of range ({})", file,
                                          count));
        std::lock_guard lock(impl_->mutex);
        const Impl::File& f = impl_->files[file];
        const bool timed_out = f.lease == FileLeaseState::breaking && !kernel_lists_lease(f.fd);
        return FileGuardFileStatus{timed_out ? FileLeaseState::broken_by_timeout : f.lease, f.reason,
                                   f.lease_errno};
    });
}

Status FileGuard::read(std::uint32_t file, std::uint64_t offset, void* destination,
                       std::size_t size) const {
    return internal::status_nothrow([&]() -> Status {
        if (file >= file_count())
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("FileGuard::read: file {} is out of range ({})", file,
                                          file_count()));
        const Impl::File& f = impl_->files[file];
        int error = 0;
        const std::size_t done = internal::pread_full(f.fd, destination, size, offset, error);
        if (error != 0)
            return make_error(ErrorKind::io, fmt::format("FileGuard::read: {}: pread at {}: {}",
                                                         f.path, offset + done, errno_text(error)));
        if (done < size)
            return make_error(ErrorKind::io,
                              fmt::format("FileGuard::read: {}: {} of {} bytes at offset {}: "
                                          "the file ends there (truncated)",
                                          f.path, done, size, offset));
        return {};
    });
}

std::uint32_t FileGuard::file_count() const noexcept {
    return impl_ ? static_cast<std::uint32_t>(impl_->files.size()) : 0;
}

bool FileGuard::next_event(FileGuardEvent& out) {
    if (!impl_) return false;
    std::lock_guard lock(impl_->mutex);
    if (impl_->queue.empty()) return false;
    out = impl_->queue.front();
    impl_->queue.pop_front();
    if (impl_->queue.empty()) impl_->reset_event_fd();
    return true;
}

std::vector<FileGuardEvent> FileGuard::take_events() {
    std::vector<FileGuardEvent> events;
    if (!impl_) return events;
    std::lock_guard lock(impl_->mutex);
    events.assign(impl_->queue.begin(), impl_->queue.end());
    impl_->queue.clear();
    impl_->reset_event_fd();
    return events;
}

int FileGuard::event_fd() const noexcept { return impl_ ? impl_->event_fd : -1; }

} // namespace wm
