// SPDX-License-Identifier: MIT
// Populate before lock: when hsa_amd_memory_lock is called, every page of its range is already
// in the page cache and mapped in the process (the fake records both, by mincore and
// /proc/self/pagemap), on a kernel with MADV_POPULATE_READ and on one without it; a failure to
// populate does not fail the lock. The file is evicted from the page cache and the mapping is
// fresh before each lock, so without the populate step the fake would see no page mapped.
#include <catch2/catch.hpp>

#include <cerrno>
#include <fstream>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hsa/fake_hsa.hpp"
#include "internal/sys_hooks.hpp"
#include "support/sys_hooks_guard.hpp"
#include "support/temp_file.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

using namespace wm;
using wm::test::FakeHsa;
using wm::test::FileMapping;

namespace {
const std::uint64_t page = host_page_size();
constexpr std::uint64_t file_pages = 256;

// A file on disk (not tmpfs: TempDir lives where the tests run) whose pages are then dropped
// from the page cache. Returns how many stayed resident (0 where the kernel evicts clean pages).
std::uint64_t write_and_evict(const std::string& path) {
    {
        std::ofstream out(path, std::ios::binary);
        for (std::uint64_t i = 0; i < file_pages * page; ++i)
            out.put(static_cast<char>(wm::test::pattern_byte(i)));
    }
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    void* p = mmap(nullptr, file_pages * page, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(p != MAP_FAILED);
    std::vector<unsigned char> vec(file_pages);
    REQUIRE(mincore(p, file_pages * page, vec.data()) == 0);
    munmap(p, file_pages * page);
    std::uint64_t resident = 0;
    for (unsigned char v : vec) resident += v & 1u;
    return resident;
}

// Locks pages [64, 192) of a fresh read-only mapping and returns what the fake saw.
FakeHsa::LockRecord lock_middle(FakeHsa& fake, const std::string& path, bool expect_lock = true) {
    FileMapping ro(path, file_pages * page, false);
    auto hsa = fake.importer();
    auto imported = hsa->import(ro.base() + 64 * page, 128 * page);
    CHECK(imported.ok() == expect_lock);
    if (imported.ok()) CHECK(hsa->release(imported.value()).ok());
    const auto records = fake.lock_records();
    REQUIRE(records.size() == 1);
    return records[0];
}

int advise_old_kernel(void* address, std::size_t length, int advice) {
    if (advice == MADV_POPULATE_READ) {
        errno = EINVAL; // Linux before 5.14
        return -1;
    }
    return internal::libc_syscalls().advise(address, length, advice);
}

int advise_failing(void*, std::size_t, int) {
    errno = EIO;
    return -1;
}
} // namespace

TEST_CASE("every page is in the page cache and mapped when the lock is called", "[hsa][populate]") {
    FakeHsa& fake = FakeHsa::fresh();
    wm::test::TempDir dir;
    const std::string path = dir.path() + "/cold.gguf";
    const std::uint64_t left = write_and_evict(path);
    INFO("pages still cached after eviction: " << left);
    const FakeHsa::LockRecord r = lock_middle(fake, path);
    CHECK(r.pages == 128);
    CHECK(r.resident == 128);
    CHECK(r.mapped == 128);
}

TEST_CASE("without MADV_POPULATE_READ (Linux < 5.14) one read per page still maps every page",
          "[hsa][populate]") {
    FakeHsa& fake = FakeHsa::fresh();
    wm::test::TempDir dir;
    const std::string path = dir.path() + "/cold.gguf";
    write_and_evict(path);
    internal::SysCalls table = internal::libc_syscalls();
    table.advise = &advise_old_kernel;
    wm::test::SysCallsGuard hooks(table);
    const FakeHsa::LockRecord r = lock_middle(fake, path);
    CHECK(r.pages == 128);
    CHECK(r.resident == 128);
    CHECK(r.mapped == 128);
}

TEST_CASE("a populate that fails does not fail the lock", "[hsa][populate]") {
    FakeHsa& fake = FakeHsa::fresh();
    wm::test::TempDir dir;
    const std::string path = dir.path() + "/cold.gguf";
    write_and_evict(path);
    internal::SysCalls table = internal::libc_syscalls();
    table.advise = &advise_failing;
    wm::test::SysCallsGuard hooks(table);
    const FakeHsa::LockRecord r = lock_middle(fake, path);
    CHECK(r.pages == 128);
    CHECK(r.mapped == 0); // nothing populated it: the fake's record sees the difference
    CHECK(fake.live_locks() == 0);
}
