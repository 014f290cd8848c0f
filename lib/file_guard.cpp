// SPDX-License-Identifier: MIT
// FileGuard: read leases where the kernel allows them, inotify everywhere, one thread.
// docs/file_guard.md explains what the kernel does and why each choice below was made.
#include "weightmap/file_guard.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
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

#include "internal/nothrow.hpp"

namespace wm {

const char* to_string(FileGuardEventKind kind) noexcept {
    switch (kind) {
    case FileGuardEventKind::lease_breaking: return "lease_breaking";
    case FileGuardEventKind::lease_broken_by_timeout: return "lease_broken_by_timeout";
    case FileGuardEventKind::changed: return "changed";
    case FileGuardEventKind::path_moved: return "path_moved";
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

} // namespace

// Hidden: a nested class takes the visibility of the exported FileGuard otherwise.
struct __attribute__((visibility("hidden"))) FileGuard::Impl {
    struct File {
        int fd = -1; // our duplicate of the caller's descriptor
        std::string path;
        int watch = -1;
        FileLeaseState lease = FileLeaseState::none;
        std::string reason;
        int lease_errno = 0;
        f_owner_ex old_owner{F_OWNER_PID, 0}; // restored when the lease is dropped
        struct stat last{};                   // the guard thread's only
    };

    std::vector<File> files;
    FileGuardCallback on_event;
    LogCallback log;
    std::uint32_t period_ms = 20;
    int inotify_fd = -1;
    int wake_fd = -1;  // written by stop(), and by create() once the leases are taken
    int event_fd = -1; // readable while `queue` is not empty
    std::thread thread;
    std::thread::id thread_id;
    std::atomic<bool> stopping{false};
    mutable std::mutex mutex;  // files[].lease/reason, queue
    std::mutex delivery;       // held by the guard thread around each callback
    std::deque<FileGuardEvent> queue;

    ~Impl();
    Status open_files(const std::vector<GuardedFile>& given);
    Status take_lease(std::uint32_t i, pid_t tid);
    void drop_lease(File& f);
    Status release(std::uint32_t i);
    void run();
    bool lease_to_poll() const;
    void wait_for_activity();
    void wake();
    void read_inotify(std::vector<FileGuardEvent>& events);
    void classify(std::uint32_t i, std::uint32_t mask, std::vector<FileGuardEvent>& events);
    void poll_leases(std::vector<FileGuardEvent>& events);
    void deliver(const std::vector<FileGuardEvent>& events);
    void call(const FileGuardEvent& event);
    void enqueue(const FileGuardEvent& event);
    void reset_event_fd();
    bool on_guard_thread() const { return std::this_thread::get_id() == thread_id; }
};

FileGuard::Impl::~Impl() {
    for (File& f : files) {
        drop_lease(f);
        close_fd(f.fd);
    }
    close_fd(inotify_fd);
    close_fd(wake_fd);
    close_fd(event_fd);
}

// Drops a held or breaking lease and gives the open file description its owner back (the lease
// shares it with the caller's descriptor). Caller holds `mutex`, or is the only user left.
void FileGuard::Impl::drop_lease(File& f) {
    if (f.lease != FileLeaseState::held && f.lease != FileLeaseState::breaking) return;
    ::fcntl(f.fd, F_SETLEASE, F_UNLCK);
    ::fcntl(f.fd, F_SETOWN_EX, &f.old_owner);
    f.lease = FileLeaseState::released;
}

namespace {

Status check_file(const GuardedFile& file, std::uint32_t i) {
    const std::string where = fmt::format("FileGuard::create: files[{}] ({})", i, file.path);
    if (file.fd < 0) return make_error(ErrorKind::invalid_argument, where + ": fd is " +
                                                                        std::to_string(file.fd));
    const int flags = ::fcntl(file.fd, F_GETFL);
    if (flags < 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: fd {} is not an open descriptor: {}", where, file.fd,
                                      errno_text(errno)));
    if ((flags & O_ACCMODE) != O_RDONLY)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: fd {} is open for writing; a read lease needs a "
                                      "descriptor opened O_RDONLY",
                                      where, file.fd));
    struct stat st {};
    if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: fd {} is not a regular file", where, file.fd));
    return {};
}

// One entry per file: two entries of one inode would share an inotify watch (and, for one open
// file description, one lease, which releasing either entry would drop under the other).
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
    return check_distinct(params.files);
}

} // namespace

// Duplicates each descriptor and watches its inode. The watch goes through /proc/self/fd, not
// the caller's path: the path may already name another file than the one the engine mapped.
Status FileGuard::Impl::open_files(const std::vector<GuardedFile>& given) {
    inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    wake_fd = ::eventfd(0, EFD_CLOEXEC);
    event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (inotify_fd < 0 || wake_fd < 0 || event_fd < 0)
        return make_error(ErrorKind::io, "FileGuard::create: inotify_init1/eventfd: " +
                                             errno_text(errno));
    for (std::uint32_t i = 0; i < given.size(); ++i) {
        File& f = files.emplace_back();
        f.path = given[i].path;
        f.fd = ::fcntl(given[i].fd, F_DUPFD_CLOEXEC, 0);
        const std::string proc = fmt::format("/proc/self/fd/{}", f.fd);
        if (f.fd >= 0) f.watch = ::inotify_add_watch(inotify_fd, proc.c_str(), watch_mask);
        if (f.fd < 0 || f.watch < 0 || ::fstat(f.fd, &f.last) != 0)
            return make_error(ErrorKind::io,
                              fmt::format("FileGuard::create: files[{}] ({}): {} of fd {}: {}", i,
                                          f.path,
                                          f.fd < 0 ? "F_DUPFD_CLOEXEC" : "inotify_add_watch",
                                          given[i].fd, errno_text(errno)));
    }
    return {};
}

// The owner goes to the guard's thread *before* F_SETLEASE: the kernel's lease_setup makes the
// calling process the owner only when none is set, and a break signals the owner (SIGIO). Owned
// by a thread that blocks every signal, the signal stays pending on that thread and reaches no
// handler of the engine, with no window between taking the lease and redirecting it.
Status FileGuard::Impl::take_lease(std::uint32_t i, pid_t tid) {
    File& f = files[i];
    if (::fcntl(f.fd, F_GETOWN_EX, &f.old_owner) != 0) f.old_owner = {F_OWNER_PID, 0};
    const f_owner_ex guard_thread{F_OWNER_TID, tid};
    if (::fcntl(f.fd, F_SETOWN_EX, &guard_thread) != 0)
        return make_error(ErrorKind::io, fmt::format("FileGuard::create: files[{}] ({}): "
                                                     "fcntl(F_SETOWN_EX): {}",
                                                     i, f.path, errno_text(errno)));
    std::lock_guard lock(mutex);
    if (::fcntl(f.fd, F_SETLEASE, F_RDLCK) == 0) {
        f.lease = FileLeaseState::held;
        return {};
    }
    const int e = errno;
    ::fcntl(f.fd, F_SETOWN_EX, &f.old_owner);
    const std::string what = fmt::format("FileGuard: files[{}] ({}): no lease: fcntl(F_SETLEASE, "
                                         "F_RDLCK): {}",
                                         i, f.path, errno_text(e));
    if (refusal_reason(e) == nullptr)
        return make_error(ErrorKind::io, "FileGuard::create: " + what);
    f.reason = what + ": " + refusal_reason(e) + "; watching it with inotify instead";
    f.lease_errno = e;
    log_message(log, LogLevel::warning, f.reason);
    return {};
}

Status FileGuard::Impl::release(std::uint32_t i) {
    if (i >= files.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("FileGuard::release: file {} is out of range ({})", i,
                                      files.size()));
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

void FileGuard::Impl::run() {
    while (!stopping.load()) {
        wait_for_activity();
        if (stopping.load()) break;
        std::vector<FileGuardEvent> events;
        read_inotify(events);
        poll_leases(events);
        deliver(events);
    }
}

bool FileGuard::Impl::lease_to_poll() const {
    std::lock_guard lock(mutex);
    for (const File& f : files)
        if (f.lease == FileLeaseState::held || f.lease == FileLeaseState::breaking) return true;
    return false;
}

// Sleeps until inotify has events, the wake eventfd is written, or the poll period passes while
// a lease is held: without one there is nothing to poll and the thread sleeps in poll(2). The
// leases are taken after the thread started, so create() wakes it to look again.
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

// IN_ATTRIB alone is also a chmod or a touch: only a new size or mtime is a change, fewer links
// an unlink. Truncation raises IN_MODIFY as well.
void FileGuard::Impl::classify(std::uint32_t i, std::uint32_t mask,
                               std::vector<FileGuardEvent>& events) {
    File& f = files[i];
    struct stat now {};
    if (::fstat(f.fd, &now) != 0) now = f.last;
    const bool resized = now.st_size != f.last.st_size ||
                         now.st_mtim.tv_sec != f.last.st_mtim.tv_sec ||
                         now.st_mtim.tv_nsec != f.last.st_mtim.tv_nsec;
    const bool unlinked = now.st_nlink < f.last.st_nlink;
    f.last = now;
    if ((mask & (IN_MODIFY | IN_CLOSE_WRITE)) != 0 || ((mask & IN_ATTRIB) != 0 && resized))
        events.push_back({i, FileGuardEventKind::changed, now_ns()});
    if ((mask & (IN_MOVE_SELF | IN_DELETE_SELF)) != 0 || ((mask & IN_ATTRIB) != 0 && unlinked))
        events.push_back({i, FileGuardEventKind::path_moved, now_ns()});
}

// Under `mutex`, so that release() cannot drop a lease between F_GETLEASE answering F_UNLCK and
// the state change: a lease the engine dropped itself is never reported as breaking.
void FileGuard::Impl::poll_leases(std::vector<FileGuardEvent>& events) {
    std::lock_guard lock(mutex);
    for (std::uint32_t i = 0; i < files.size(); ++i) {
        File& f = files[i];
        if (f.lease == FileLeaseState::held && ::fcntl(f.fd, F_GETLEASE) == F_UNLCK) {
            f.lease = FileLeaseState::breaking;
            events.push_back({i, FileGuardEventKind::lease_breaking, now_ns()});
        } else if (f.lease == FileLeaseState::breaking && !kernel_lists_lease(f.fd)) {
            f.lease = FileLeaseState::broken_by_timeout;
            ::fcntl(f.fd, F_SETOWN_EX, &f.old_owner);
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

// Starts the thread with every signal blocked (it inherits the mask): a lease break's SIGIO
// then stays pending on it, and no handler of the engine ever runs on it.
Result<pid_t> start_thread(const std::shared_ptr<FileGuard::Impl>& impl) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    std::promise<pid_t> tid;
    std::future<pid_t> started = tid.get_future();
    try {
        impl->thread = std::thread([impl, tid = std::move(tid)]() mutable {
            impl->thread_id = std::this_thread::get_id(); // published by set_value
            tid.set_value(static_cast<pid_t>(::syscall(SYS_gettid)));
            impl->run();
        });
    } catch (const std::system_error& e) {
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        return make_error(ErrorKind::limit, fmt::format("FileGuard::create: cannot start its "
                                                        "thread: {}",
                                                        e.what()));
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
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
// keeping Impl alive through its own reference.
void FileGuard::stop() noexcept {
    if (!impl_) return;
    impl_->stopping.store(true);
    if (impl_->thread.joinable()) {
        impl_->wake();
        if (impl_->on_guard_thread()) impl_->thread.detach();
        else impl_->thread.join();
    }
    {
        std::lock_guard lock(impl_->mutex);
        for (Impl::File& f : impl_->files) impl_->drop_lease(f);
    }
    impl_.reset();
}

Result<FileGuard> FileGuard::create(FileGuardParams params) {
    return internal::result_nothrow([&]() -> Result<FileGuard> {
        if (auto checked = check_params(params); !checked) return std::move(checked).error();
        auto impl = std::make_shared<Impl>();
        impl->on_event = std::move(params.on_event);
        impl->log = std::move(params.log);
        impl->period_ms = params.poll_period_ms;
        if (auto opened = impl->open_files(params.files); !opened) return std::move(opened).error();
        auto tid = start_thread(impl);
        if (!tid) return std::move(tid).error();
        FileGuard guard(std::move(impl)); // from here a failure stops the thread, drops leases
        for (std::uint32_t i = 0; i < guard.impl_->files.size(); ++i)
            if (auto taken = guard.impl_->take_lease(i, *tid); !taken)
                return std::move(taken).error();
        guard.impl_->wake();
        return guard;
    });
}

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
        return FileGuardFileStatus{f.lease, f.reason, f.lease_errno};
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
