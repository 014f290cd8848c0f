// SPDX-License-Identifier: MIT
// FileGuard (file_guard.hpp, docs/file_guard.md): a read lease makes a writer in another process
// wait in open(O_TRUNC) or truncate(2) until the engine releases, and the engine hears it first;
// without a lease (another owner, a writer already open) inotify reports the change after the
// fact; the callback never races release() or destruction; no SIGIO reaches the process; every
// error names the file and the field. No case waits for the kernel's lease-break-time (45 s).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/child.hpp"
#include "support/skip.hpp"
#include "support/guard_events.hpp"
#include "support/temp_file.hpp"
#include "weightmap/file_guard.hpp"

using namespace wm;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Kind = FileGuardEventKind;

namespace {

constexpr std::uint64_t file_size = 64 * 1024;


int open_read_only(const std::string& path) { return open(path.c_str(), O_RDONLY | O_CLOEXEC); }

// The events a callback received, with a wait for one kind.
using Events = wm::test::GuardEvents;
using wm::test::Fd;

FileGuard make_guard(int fd, const std::string& path, Events& events,
                     std::uint32_t period_ms = 20) {
    FileGuardParams params;
    params.files = {{fd, path}};
    params.poll_period_ms = period_ms;
    params.on_event = [&events](const FileGuardEvent& e) { events.push(e); };
    auto guard = FileGuard::create(std::move(params));
    if (!guard) FAIL(guard.error().message);
    return std::move(guard).value();
}

bool readable(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    int n;
    while ((n = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
    }
    return n == 1 && (p.revents & POLLIN) != 0;
}

// Forks a writer that runs `write_op` on `path` and reports on a pipe the moment it returns:
// the byte is 'o' when it succeeded. Returns the child and the pipe's read end.
std::pair<pid_t, int> fork_writer(const std::string& path, int (*write_op)(const char*)) {
    int p[2];
    REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    const pid_t pid = fork();
    if (pid == 0) {
        const char c = write_op(path.c_str()) == 0 ? 'o' : 'e';
        _exit(write(p[1], &c, 1) == 1 ? 0 : 1);
    }
    close(p[1]);
    REQUIRE(pid > 0);
    return {pid, p[0]};
}

int open_truncating(const char* path) {
    const int fd = open(path, O_WRONLY | O_TRUNC);
    return fd >= 0 ? close(fd) : -1;
}

int truncate_to_zero(const char* path) { return truncate(path, 0); }

int exit_code(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

off_t size_of(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// The writer (another process) is blocked until release(), then returns promptly.
void writer_waits_for_release(int (*write_op)(const char*)) {
    wm::test::TempFile file(file_size);
    Fd fd(open_read_only(file.path()));
    Events events;
    FileGuard guard = make_guard(fd.fd, file.path(), events);
    REQUIRE(guard.status(0)->lease == FileLeaseState::held);

    auto [pid, done] = fork_writer(file.path(), write_op);
    Fd done_fd(done);
    REQUIRE(events.wait_for(Kind::lease_breaking, 5000ms));
    CHECK(guard.status(0)->lease == FileLeaseState::breaking);
    CHECK_FALSE(readable(done, 0));   // still in the kernel when the engine hears
    CHECK_FALSE(readable(done, 200)); // and 200 ms later
    CHECK(size_of(file.path()) == static_cast<off_t>(file_size));

    const auto released = Clock::now();
    REQUIRE(guard.release(0));
    REQUIRE(readable(done, 5000));
    const auto ms = std::chrono::duration<double, std::milli>(Clock::now() - released).count();
    WARN("writer returned " << ms << " ms after release()");
    CHECK(ms < 500); // the kernel wakes it on F_UNLCK; 45 s would mean the timeout
    char c = 0;
    CHECK(read(done, &c, 1) == 1);
    CHECK(c == 'o');
    CHECK(exit_code(pid) == 0);
    CHECK(size_of(file.path()) == 0);
    CHECK(guard.status(0)->lease == FileLeaseState::released);
    CHECK(events.count(Kind::lease_broken_by_timeout) == 0);
}

} // namespace

TEST_CASE("a writer's open(O_TRUNC) in another process waits until release()") {
    writer_waits_for_release(open_truncating);
}

TEST_CASE("a writer's truncate(2) in another process waits until release()") {
    writer_waits_for_release(truncate_to_zero);
}

TEST_CASE("a rename of the guarded path is reported as path_moved; the lease stays held") {
    wm::test::TempDir dir;
    const std::string path = dir.path() + "/model.gguf";
    { std::ofstream(path) << std::string(4096, 'w'); }
    Fd fd(open_read_only(path));
    Events events;
    FileGuard guard = make_guard(fd.fd, path, events);
    REQUIRE(rename(path.c_str(), (dir.path() + "/old.gguf").c_str()) == 0);
    REQUIRE(events.wait_for(Kind::path_moved, 5000ms));
    CHECK(guard.status(0)->lease == FileLeaseState::held);
    CHECK(events.count(Kind::lease_breaking) == 0);
    CHECK(events.count(Kind::changed) == 0);
}

TEST_CASE("an unlink of the guarded path is reported as path_moved; the bytes stay readable") {
    wm::test::TempDir dir;
    const std::string path = dir.path() + "/model.gguf";
    { std::ofstream(path) << std::string(4096, 'u'); }
    Fd fd(open_read_only(path));
    Events events;
    FileGuard guard = make_guard(fd.fd, path, events);
    REQUIRE(unlink(path.c_str()) == 0);
    REQUIRE(events.wait_for(Kind::path_moved, 5000ms));
    CHECK(guard.status(0)->lease == FileLeaseState::held);
    CHECK(events.count(Kind::changed) == 0);
    char c = 0;
    CHECK(pread(fd.fd, &c, 1, 4095) == 1); // the inode the imports hold is intact
    CHECK(c == 'u');
}

namespace {

// What the unprivileged child reports through its exit code.
enum NoLeaseResult {
    ok = 0,
    drop_failed = 10,
    still_capable,
    open_failed,
    create_failed,
    lease_taken,
    wrong_errno,
    reason_unnamed,
    logged_not_once,
    no_append_event,
    no_truncate_event,
    lease_event_seen,
};

bool no_effective_capabilities() {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("CapEff:", 0) == 0)
            return line.find_first_not_of("0\t ", 7) == std::string::npos;
    return false;
}

// The child: as nobody, guard `path` (root's, 0644); tell the parent on `ready`; expect the
// append and then the truncate the parent makes, each seen as `changed` with the new size.
int guard_as_nobody(const std::string& path, int ready) {
    if (!wm::test::drop_privileges_to_nobody()) return drop_failed;
    if (!no_effective_capabilities()) return still_capable;
    Fd fd(open_read_only(path));
    if (fd.fd < 0) return open_failed;
    std::mutex m;
    std::condition_variable cv;
    std::vector<std::pair<Kind, off_t>> seen; // kind and fstat size when it arrived
    int warnings = 0;
    FileGuardParams params;
    params.files = {{fd.fd, path}};
    params.log = [&](LogLevel level, std::string_view) { warnings += level == LogLevel::warning; };
    params.on_event = [&](const FileGuardEvent& e) {
        struct stat st {};
        fstat(fd.fd, &st);
        std::lock_guard lock(m);
        seen.emplace_back(e.kind, st.st_size);
        cv.notify_all();
    };
    auto guard = FileGuard::create(std::move(params));
    if (!guard) return create_failed;
    const auto status = guard->status(0).value();
    if (status.lease != FileLeaseState::none) return lease_taken;
    if (status.lease_errno != EACCES && status.lease_errno != EPERM) return wrong_errno;
    if (status.reason.find(path) == std::string::npos ||
        status.reason.find("CAP_LEASE") == std::string::npos)
        return reason_unnamed;
    if (warnings != 1) return logged_not_once;
    auto saw = [&](off_t size) {
        std::unique_lock lock(m);
        return cv.wait_for(lock, 5s, [&] {
            for (auto& [kind, at] : seen)
                if (kind == Kind::changed && at == size) return true;
            return false;
        });
    };
    char go = 'r';
    if (write(ready, &go, 1) != 1 || !saw(static_cast<off_t>(file_size) + 100))
        return no_append_event;
    if (write(ready, &go, 1) != 1 || !saw(0)) return no_truncate_event;
    for (auto& [kind, at] : seen)
        if (kind == Kind::lease_breaking) return lease_event_seen;
    return ok;
}

} // namespace

TEST_CASE("without CAP_LEASE on another's file: lease none, inotify reports changes",
          "[may_skip]") {
    if (geteuid() != 0) {
        wm::test::skip("needs root: the file must belong to another user than the guarding one");
        return;
    }
    wm::test::TempFile file(file_size);
    REQUIRE(chmod(file.path().c_str(), 0644) == 0);
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    const pid_t pid = fork();
    if (pid == 0) _exit(guard_as_nobody(file.path(), ready[1]));
    close(ready[1]);
    Fd from_child(ready[0]);
    char c = 0;
    if (read(from_child.fd, &c, 1) == 1) { // guarded: append 100 bytes as root
        std::ofstream(file.path(), std::ios::app) << std::string(100, 'a');
        if (read(from_child.fd, &c, 1) == 1) {
            const auto start = Clock::now();
            CHECK(truncate(file.path().c_str(), 0) == 0); // no lease: does not wait
            CHECK(Clock::now() - start < 1s);
        }
    }
    const int code = exit_code(pid);
    CAPTURE(code); // NoLeaseResult: 10 drop, 11 caps, 12 open, 13 create, 14 lease taken,
                   // 15 errno, 16 reason, 17 log, 18 append, 19 truncate, 20 lease event
    CHECK(code == ok);
}

TEST_CASE("a file open for writing elsewhere gets no lease (EAGAIN); a write is `changed`") {
    wm::test::TempFile file(file_size);
    Fd writer(open(file.path().c_str(), O_WRONLY | O_CLOEXEC));
    Fd fd(open_read_only(file.path()));
    REQUIRE(writer.fd >= 0);
    Events events;
    FileGuard guard = make_guard(fd.fd, file.path(), events);
    const auto status = guard.status(0).value();
    CHECK(status.lease == FileLeaseState::none);
    CHECK(status.lease_errno == EAGAIN);
    CHECK_THAT(status.reason, Catch::Contains(file.path()) &&
                                  Catch::Contains("open for writing elsewhere"));
    REQUIRE(pwrite(writer.fd, "x", 1, 0) == 1);
    CHECK(events.wait_for(Kind::changed, 5000ms));
    CHECK(events.count(Kind::lease_breaking) == 0);
    CHECK(guard.release(0)); // no lease: a no-op success
}

namespace {

// A writer thread in this process: its open(O_WRONLY) is another open file description, so it
// breaks the guard's lease like any writer.
std::thread open_for_writing(const std::string& path, std::atomic<bool>& opened) {
    return std::thread([path, &opened] {
        const int w = open(path.c_str(), O_WRONLY | O_CLOEXEC);
        if (w >= 0) close(w);
        opened.store(w >= 0);
    });
}

} // namespace

TEST_CASE("release() from inside the callback, many cycles: one lease event each, none after") {
    wm::test::TempFile file(file_size);
    for (int cycle = 0; cycle < 25; ++cycle) {
        Fd fd(open_read_only(file.path()));
        std::atomic<int> lease_events{0}, after_release{0};
        std::atomic<bool> released{false}, opened{false}, release_failed{false};
        std::mutex guard_mutex; // orders the emplace before the callback's use (for TSan too)
        std::optional<FileGuard> guard;
        FileGuardParams params;
        params.files = {{fd.fd, file.path()}};
        params.poll_period_ms = 1;
        params.on_event = [&](const FileGuardEvent& e) {
            if (e.kind != Kind::lease_breaking && e.kind != Kind::lease_broken_by_timeout) return;
            if (released.load()) ++after_release;
            ++lease_events;
            std::lock_guard lock(guard_mutex);
            if (!guard->release(e.file)) release_failed.store(true);
            released.store(true);
        };
        auto created = FileGuard::create(std::move(params));
        REQUIRE(created);
        {
            std::lock_guard lock(guard_mutex);
            guard.emplace(std::move(created).value());
        }
        std::thread writer = open_for_writing(file.path(), opened);
        writer.join(); // returns only once the callback released
        CHECK(opened.load());
        CHECK(lease_events.load() == 1);
        CHECK(after_release.load() == 0);
        CHECK_FALSE(release_failed.load());
        guard.reset(); // joins: nothing touches `guard` from the callback after a release
    }
}

TEST_CASE("release() from another thread racing the break: no lease callback after it returns") {
    wm::test::TempFile file(file_size);
    std::mt19937 random(37);
    int delivered = 0;
    for (int cycle = 0; cycle < 40; ++cycle) {
        Fd fd(open_read_only(file.path()));
        std::atomic<int> clock{0}, last_end{0}, last_begin{0};
        FileGuardParams params;
        params.files = {{fd.fd, file.path()}};
        params.poll_period_ms = 1;
        params.on_event = [&](const FileGuardEvent& e) {
            if (e.kind != Kind::lease_breaking) return;
            last_begin.store(++clock);
            std::this_thread::sleep_for(2ms); // widens the window release() must wait out
            last_end.store(++clock);
        };
        auto guard = FileGuard::create(std::move(params));
        REQUIRE(guard);
        std::atomic<bool> opened{false};
        std::thread writer = open_for_writing(file.path(), opened);
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 3000));
        REQUIRE(guard->release(0));
        const int returned = ++clock;
        writer.join();
        std::this_thread::sleep_for(5ms); // a late callback would show up here
        CHECK(opened.load());
        CHECK(last_begin.load() < returned);
        CHECK(last_end.load() < returned);
        delivered += last_begin.load() != 0;
    }
    WARN(delivered << " of 40 cycles delivered lease_breaking before the release");
}

TEST_CASE("destroy during a pending event waits for the callback; none runs after") {
    wm::test::TempFile file(file_size);
    Fd fd(open_read_only(file.path()));
    std::atomic<bool> in_callback{false}, callback_done{false};
    std::atomic<int> calls{0};
    FileGuardParams params;
    params.files = {{fd.fd, file.path()}};
    params.on_event = [&](const FileGuardEvent&) {
        ++calls;
        in_callback.store(true);
        std::this_thread::sleep_for(150ms);
        callback_done.store(true);
    };
    auto guard = std::make_unique<FileGuard>(FileGuard::create(std::move(params)).value());
    std::atomic<bool> opened{false};
    std::thread writer = open_for_writing(file.path(), opened);
    while (!in_callback.load()) std::this_thread::sleep_for(1ms);
    guard.reset(); // the lease breaking is pending and its callback in flight
    CHECK(callback_done.load());
    writer.join(); // destroy dropped the lease
    CHECK(opened.load());
    const int after = calls.load();
    std::this_thread::sleep_for(100ms);
    CHECK(calls.load() == after);
}

TEST_CASE("destroy from inside the callback drops the lease; the writer proceeds") {
    wm::test::TempFile file(file_size);
    Fd fd(open_read_only(file.path()));
    // Shared with the callback: the writer proceeds as soon as the lease is dropped, before the
    // callback returns, so the callback must not use anything on this test's stack.
    struct State {
        std::mutex mutex;
        std::unique_ptr<FileGuard> guard;
        std::atomic<bool> destroyed{false};
    };
    auto state = std::make_shared<State>();
    FileGuardParams params;
    params.files = {{fd.fd, file.path()}};
    params.on_event = [state](const FileGuardEvent&) {
        std::lock_guard lock(state->mutex);
        state->guard.reset();
        state->destroyed.store(true);
    };
    {
        std::lock_guard lock(state->mutex);
        state->guard = std::make_unique<FileGuard>(FileGuard::create(std::move(params)).value());
    }
    std::atomic<bool> opened{false};
    std::thread writer = open_for_writing(file.path(), opened);
    writer.join();
    CHECK(opened.load());
    const auto deadline = Clock::now() + 5s;
    while (!state->destroyed.load() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    CHECK(state->destroyed.load());
}

TEST_CASE("a callback that throws is logged; its writer still waits for release()") {
    wm::test::TempFile file(file_size);
    Fd fd(open_read_only(file.path()));
    std::mutex log_mutex;
    std::condition_variable logged_cv;
    std::vector<std::string> errors;
    FileGuardParams params;
    params.files = {{fd.fd, file.path()}};
    params.log = [&](LogLevel level, std::string_view message) {
        if (level != LogLevel::error) return;
        std::lock_guard lock(log_mutex);
        errors.emplace_back(message);
        logged_cv.notify_all();
    };
    params.on_event = [](const FileGuardEvent& e) {
        if (e.kind == Kind::lease_breaking) throw std::runtime_error("an engine's bug");
    };
    auto guard = FileGuard::create(std::move(params));
    REQUIRE(guard);
    auto [pid, done] = fork_writer(file.path(), open_truncating);
    Fd done_fd(done);
    {
        std::unique_lock lock(log_mutex);
        REQUIRE(logged_cv.wait_for(lock, 5s, [&] { return !errors.empty(); }));
        CHECK_THAT(errors.front(), Catch::Contains("the event callback threw: an engine's bug"));
    }
    CHECK_FALSE(readable(done, 200)); // the event was delivered; the lease is still breaking
    CHECK(guard->status(0)->lease == FileLeaseState::breaking);
    REQUIRE(guard->release(0));
    REQUIRE(readable(done, 5000));
    CHECK(exit_code(pid) == 0);
}

namespace {

std::atomic<int> sigio_count{0};
void count_sigio(int) { sigio_count.fetch_add(1); }

// Breaks the lease on `path` with a writer in another process and waits until it is through,
// releasing through `release` once the break is visible.
template <class Release>
void break_lease(const std::string& path, Events* events, Release release) {
    auto [pid, done] = fork_writer(path, open_truncating);
    Fd done_fd(done);
    if (events != nullptr) REQUIRE(events->wait_for(Kind::lease_breaking, 5000ms));
    else std::this_thread::sleep_for(100ms);
    release();
    REQUIRE(readable(done, 5000));
    CHECK(exit_code(pid) == 0);
}

} // namespace

TEST_CASE("no SIGIO reaches the process on a break; a bare lease's break would send one") {
    struct sigaction action {}, old {};
    action.sa_handler = count_sigio;
    sigemptyset(&action.sa_mask);
    REQUIRE(sigaction(SIGIO, &action, &old) == 0);
    wm::test::TempFile file(file_size);

    Fd fd(open_read_only(file.path()));
    f_owner_ex before{}, after{};
    REQUIRE(fcntl(fd.fd, F_GETOWN_EX, &before) == 0);
    {
        Events events;
        FileGuard guard = make_guard(fd.fd, file.path(), events);
        sigio_count.store(0);
        break_lease(file.path(), &events, [&] { REQUIRE(guard.release(0)); });
        std::this_thread::sleep_for(50ms);
        CHECK(sigio_count.load() == 0);
    }
    REQUIRE(fcntl(fd.fd, F_GETOWN_EX, &after) == 0); // the caller's description is as it was
    CHECK(after.type == before.type);
    CHECK(after.pid == before.pid);

    // The control: the kernel makes a bare lease's taker the owner and signals it (the
    // counter works, and the guard's redirection is what kept it at zero above).
    Fd bare(open_read_only(file.path()));
    REQUIRE(fcntl(bare.fd, F_SETLEASE, F_RDLCK) == 0);
    break_lease(file.path(), nullptr, [&] { fcntl(bare.fd, F_SETLEASE, F_UNLCK); });
    CHECK(sigio_count.load() >= 1);
    sigaction(SIGIO, &old, nullptr);
}

TEST_CASE("events queue for next_event() and event_fd() without a callback") {
    wm::test::TempFile file(file_size);
    Fd fd(open_read_only(file.path()));
    FileGuardParams params;
    params.files = {{fd.fd, file.path()}};
    auto guard = FileGuard::create(std::move(params));
    REQUIRE(guard);
    CHECK_FALSE(readable(guard->event_fd(), 0));
    std::atomic<bool> opened{false};
    std::thread writer = open_for_writing(file.path(), opened);
    REQUIRE(readable(guard->event_fd(), 5000));
    FileGuardEvent e;
    REQUIRE(guard->next_event(e));
    CHECK(e.file == 0);
    CHECK(e.kind == Kind::lease_breaking);
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         Clock::now().time_since_epoch()).count();
    CHECK(e.monotonic_ns <= now);
    CHECK(now - e.monotonic_ns < std::int64_t{5'000'000'000});
    CHECK_FALSE(readable(guard->event_fd(), 0));
    REQUIRE(guard->release(0));
    writer.join();
    CHECK(opened.load());
}

namespace {

std::string create_error(std::vector<GuardedFile> files, std::uint32_t period = 20) {
    FileGuardParams params;
    params.files = std::move(files);
    params.poll_period_ms = period;
    auto guard = FileGuard::create(std::move(params));
    REQUIRE_FALSE(guard);
    CHECK(guard.error().kind == ErrorKind::invalid_argument);
    return guard.error().message;
}

} // namespace

TEST_CASE("every error names the file and the field") {
    wm::test::TempFile file(file_size);
    Fd ok(open_read_only(file.path()));
    Fd rw(open(file.path().c_str(), O_RDWR | O_CLOEXEC));
    Fd dir(open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    int closed = open_read_only(file.path());
    close(closed);
    using Catch::Contains;
    CHECK_THAT(create_error({}), Contains("params.files is empty"));
    CHECK_THAT(create_error({{ok.fd, file.path()}, {-1, "/m/b.gguf"}}),
               Contains("files[1] (/m/b.gguf)") && Contains("fd is -1"));
    CHECK_THAT(create_error({{closed, "/m/c.gguf"}}),
               Contains("files[0] (/m/c.gguf)") && Contains("not an open descriptor") &&
                   Contains("EBADF"));
    CHECK_THAT(create_error({{rw.fd, "/m/d.gguf"}}),
               Contains("files[0] (/m/d.gguf)") && Contains("O_RDONLY"));
    CHECK_THAT(create_error({{dir.fd, "/m/e"}}),
               Contains("files[0] (/m/e)") && Contains("not a regular file"));
    CHECK_THAT(create_error({{ok.fd, file.path()}}, 0), Contains("params.poll_period_ms is 0"));
    Fd again(open_read_only(file.path()));
    CHECK_THAT(create_error({{ok.fd, "/m/a.gguf"}, {again.fd, "/m/a2.gguf"}}),
               Contains("files[1] (/m/a2.gguf)") && Contains("same file as files[0] (/m/a.gguf)"));
    CHECK_THAT(create_error({{ok.fd, file.path()}}, 1001),
               Contains("params.poll_period_ms is 1001"));

    Events events;
    FileGuard guard = make_guard(ok.fd, file.path(), events);
    auto released = guard.release(1);
    REQUIRE_FALSE(released);
    CHECK(released.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(released.error().message,
               Contains("FileGuard::release: file 1 is out of range (1)"));
    auto status = guard.status(7);
    REQUIRE_FALSE(status);
    CHECK_THAT(status.error().message, Contains("FileGuard::status: file 7 is out of range (1)"));
}

namespace {

int count_fds() {
    int n = 0;
    for (int fd = 0; fd < 1024; ++fd) n += fcntl(fd, F_GETFD) >= 0;
    return n;
}

// The descriptor limit at which exactly `free` descriptors are left to open.
rlim_t limit_leaving(int free) {
    rlim_t limit = 0;
    for (int left = free; left > 0; ++limit)
        if (fcntl(static_cast<int>(limit), F_GETFD) < 0) --left;
    return limit;
}

} // namespace

TEST_CASE("a guard that fails part-way leaves no lease and no descriptor behind; the caller's "
          "descriptor never holds the lease") {
    wm::test::TempFile file(file_size), second(file_size);
    Fd ok(open_read_only(file.path()));
    Fd other(open_read_only(second.path()));
    const int before = count_fds();
    // Room for inotify, two eventfds and the first file's reopened descriptor: the second's
    // reopen fails.
    rlimit old{};
    REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
    rlimit low = old;
    low.rlim_cur = limit_leaving(4);
    REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
    FileGuardParams params;
    params.files = {{ok.fd, file.path()}, {other.fd, "/m/second.gguf"}};
    auto failed = FileGuard::create(std::move(params));
    REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
    REQUIRE_FALSE(failed);
    CHECK(failed.error().kind == ErrorKind::io);
    CHECK_THAT(failed.error().message,
               Catch::Contains("files[1] (/m/second.gguf): fd " + std::to_string(other.fd)) &&
                   Catch::Contains("open(/proc/self/fd/" + std::to_string(other.fd) + ")") &&
                   Catch::Contains("EMFILE"));
    CHECK(count_fds() == before);
    CHECK(fcntl(ok.fd, F_GETLEASE) == F_UNLCK);
    {
        Events events;
        FileGuard guard = make_guard(ok.fd, file.path(), events);
        CHECK(guard.status(0)->lease == FileLeaseState::held);
        CHECK(fcntl(ok.fd, F_GETLEASE) == F_UNLCK); // the lease is on the guard's description
        CHECK(count_fds() == before + 4);
    }
    CHECK(count_fds() == before); // destroyed: its descriptor, inotify and eventfds are closed
    CHECK(fcntl(ok.fd, F_GETLEASE) == F_UNLCK);
}
