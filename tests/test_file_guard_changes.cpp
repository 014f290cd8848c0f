// SPDX-License-Identifier: MIT
// What the file guard calls a change (issue 45): an attribute change or a close without a write
// is metadata_changed, never `changed`; without a lease the size and pages sampled over the
// engine's regions decide (a write through a shared mapping raises no IN_MODIFY); a break says
// by when the move must be done; read() never faults on a truncated file; a fork()ed child that
// outlives its parent holds none of the parent's leases.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/guard_events.hpp"
#include "support/temp_file.hpp"
#include "weightmap/file_guard.hpp"

using namespace wm;
using namespace std::chrono_literals;
using Kind = FileGuardEventKind;

namespace {

constexpr std::uint64_t page = 4096;
constexpr std::uint64_t file_size = 16 * page;


using Events = wm::test::GuardEvents;
using wm::test::Fd;

FileGuard make_guard(int fd, const std::string& path, Events& events,
                     std::vector<GuardedRegion> regions = {}) {
    FileGuardParams params;
    params.files = {{fd, path}};
    params.regions = std::move(regions);
    params.on_event = [&events](const FileGuardEvent& e) { events.push(e); };
    auto guard = FileGuard::create(std::move(params));
    if (!guard) FAIL(guard.error().message);
    return std::move(guard).value();
}

void touch(const std::string& path) { REQUIRE(utimensat(AT_FDCWD, path.c_str(), nullptr, 0) == 0); }

// Opens the file for writing and closes it: IN_CLOSE_WRITE, no IN_MODIFY.
void open_and_close(const std::string& path) {
    const int w = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(w >= 0);
    close(w);
}

// Flips the first byte of page `index` through a writable shared mapping (no IN_MODIFY), then
// closes the descriptor (IN_CLOSE_WRITE).
void write_through_mapping(const std::string& path, std::uint64_t index) {
    const int w = open(path.c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(w >= 0);
    void* m = mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_SHARED, w, 0);
    REQUIRE(m != MAP_FAILED);
    static_cast<unsigned char*>(m)[index * page] ^= 0xff;
    munmap(m, file_size);
    close(w);
}

long lease_break_time_s() {
    long s = 45;
    if (FILE* f = std::fopen("/proc/sys/fs/lease-break-time", "re")) {
        if (std::fscanf(f, "%ld", &s) != 1) s = 45;
        std::fclose(f);
    }
    return s;
}

} // namespace

TEST_CASE("a touch of a leased file is metadata_changed: the lease stays, nothing is `changed`") {
    wm::test::TempFile file(file_size);
    Fd fd(open(file.path().c_str(), O_RDONLY | O_CLOEXEC));
    Events events;
    FileGuard guard = make_guard(fd.fd, file.path(), events);
    REQUIRE(guard.status(0)->lease == FileLeaseState::held);
    touch(file.path());
    REQUIRE(events.wait_for(Kind::metadata_changed, 5000ms));
    std::this_thread::sleep_for(100ms);
    CHECK(events.count(Kind::changed) == 0);
    CHECK(guard.status(0)->lease == FileLeaseState::held);
}

TEST_CASE("without a lease, a touch and a close without a write are metadata_changed; a write is "
          "`changed`") {
    wm::test::TempFile file(file_size);
    Fd writer(open(file.path().c_str(), O_WRONLY | O_CLOEXEC)); // no lease: EAGAIN
    Fd fd(open(file.path().c_str(), O_RDONLY | O_CLOEXEC));
    Events events;
    FileGuard guard = make_guard(fd.fd, file.path(), events);
    REQUIRE(guard.status(0)->lease == FileLeaseState::none);
    touch(file.path());
    REQUIRE(events.wait_for(Kind::metadata_changed, 5000ms));
    open_and_close(file.path());
    REQUIRE(events.wait_for(Kind::metadata_changed, 5000ms, 1));
    CHECK(events.count(Kind::changed) == 0);
    const unsigned char same = wm::test::pattern_byte(0);
    REQUIRE(pwrite(writer.fd, &same, 1, 0) == 1); // a write, even of the same byte
    CHECK(events.wait_for(Kind::changed, 5000ms));
}

TEST_CASE("without a lease, a write through a shared mapping of a region the engine reads is "
          "`changed`; outside its regions, metadata_changed") {
    wm::test::TempFile file(file_size);
    Fd writer(open(file.path().c_str(), O_WRONLY | O_CLOEXEC));
    Fd fd(open(file.path().c_str(), O_RDONLY | O_CLOEXEC));
    Events events;
    // the engine reads pages 4..8 only
    FileGuard guard = make_guard(fd.fd, file.path(), events, {{0, 4 * page, 4 * page}});
    write_through_mapping(file.path(), 1);
    REQUIRE(events.wait_for(Kind::metadata_changed, 5000ms));
    CHECK(events.count(Kind::changed) == 0);
    write_through_mapping(file.path(), 4); // the region's first page: always sampled
    CHECK(events.wait_for(Kind::changed, 5000ms));
}

TEST_CASE("a region past the files is refused, naming the field") {
    wm::test::TempFile file(file_size);
    Fd fd(open(file.path().c_str(), O_RDONLY | O_CLOEXEC));
    FileGuardParams params;
    params.files = {{fd.fd, file.path()}};
    params.regions = {{0, 0, page}, {1, 0, page}};
    auto guard = FileGuard::create(std::move(params));
    REQUIRE_FALSE(guard);
    CHECK(guard.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(guard.error().message, Catch::Contains("params.regions[1].file is 1"));
}

TEST_CASE("lease_breaking says by when the kernel may drop the lease: lease-break-time after the "
          "last poll that saw it held") {
    wm::test::TempFile file(file_size);
    Fd fd(open(file.path().c_str(), O_RDONLY | O_CLOEXEC));
    Events events;
    FileGuard guard = make_guard(fd.fd, file.path(), events);
    REQUIRE(guard.status(0)->lease == FileLeaseState::held);
    std::this_thread::sleep_for(100ms);
    const pid_t pid = fork();
    if (pid == 0) {
        const int w = open(file.path().c_str(), O_WRONLY | O_CLOEXEC); // waits for release
        _exit(w >= 0 ? 0 : 1);
    }
    REQUIRE(events.wait_for(Kind::lease_breaking, 5000ms));
    const FileGuardEvent e = events.first(Kind::lease_breaking);
    const std::int64_t lbt = lease_break_time_s() * 1000000000LL;
    CHECK(e.deadline_ns <= e.monotonic_ns + lbt);
    CHECK(e.deadline_ns >= e.monotonic_ns + lbt - 200 * 1000000LL); // 20 ms polls, with slack
    CHECK(guard.status(0)->lease == FileLeaseState::breaking);
    REQUIRE(guard.release(0));
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
}

TEST_CASE("read() returns the file's bytes, and for a truncated file an io error naming it, "
          "never SIGBUS") {
    wm::test::TempFile file(file_size);
    Fd writer(open(file.path().c_str(), O_WRONLY | O_CLOEXEC));
    Fd fd(open(file.path().c_str(), O_RDONLY | O_CLOEXEC));
    Events events;
    FileGuard guard = make_guard(fd.fd, file.path(), events);
    std::vector<std::uint8_t> bytes(3 * page);
    REQUIRE(guard.read(0, page + 7, bytes.data(), bytes.size()));
    CHECK(wm::test::equals_file_bytes(bytes, page + 7));
    REQUIRE(ftruncate(writer.fd, 2 * page) == 0);
    auto read = guard.read(0, page, bytes.data(), bytes.size());
    REQUIRE_FALSE(read);
    CHECK(read.error().kind == ErrorKind::io);
    CHECK_THAT(read.error().message, Catch::Contains(file.path()) && Catch::Contains("truncated") &&
                                         Catch::Contains("4096 of 12288 bytes"));
    CHECK(guard.read(1, 0, bytes.data(), 1).error().kind == ErrorKind::invalid_argument);
}

TEST_CASE("a fork()ed child that outlives its parent holds none of the parent's leases") {
    wm::test::TempFile file(file_size);
    int hold[2];
    REQUIRE(pipe2(hold, O_CLOEXEC) == 0);
    const pid_t parent = fork();
    if (parent == 0) {
        const int fd = open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
        FileGuardParams params;
        params.files = {{fd, file.path()}};
        auto guard = FileGuard::create(std::move(params));
        if (!guard || guard->status(0)->lease != FileLeaseState::held) _exit(2);
        if (fork() == 0) { // the child: waits on the pipe, touching nothing of the guard
            char c;
            close(hold[1]);
            [[maybe_unused]] const ssize_t n = read(hold[0], &c, 1);
            _exit(0);
        }
        _exit(0); // the parent goes without destroying the guard
    }
    close(hold[0]);
    int status = 0;
    waitpid(parent, &status, 0);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    // a lease still held by the child's copy would answer EWOULDBLOCK here
    const int w = open(file.path().c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    const int e = errno;
    close(hold[1]); // the child exits
    CAPTURE(e);
    CHECK(w >= 0);
    if (w >= 0) close(w);
}
