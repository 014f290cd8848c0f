// SPDX-License-Identifier: MIT
// populate on a kernel before 5.14, where madvise(MADV_POPULATE_READ) answers EINVAL (RHEL 8,
// Ubuntu 20.04, Debian 11), emulated through the syscall hooks: a sharded model on several
// threads takes the pread path and reads every byte. The path once tested an errno that the
// thread had not set (another thread had found the old kernel), and failed with
// "madvise(MADV_POPULATE_READ) ...: Success" on every sharded load.
#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include <sys/mman.h>

#include "support/sys_hooks_guard.hpp"
#include "support/temp_file.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/populate.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

using namespace wm;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// What the hooks saw, and how the pread hook behaves.
struct OldKernel {
    static inline std::atomic<int> populate_calls{0}, reads{0};
    // A successful call may leave errno at any nonzero value (POSIX: errno is valid only after
    // a failure), as libc's own functions do; the hook does so when this is set.
    static inline std::atomic<bool> clobber_errno{false};
    static int advise(void* address, std::size_t length, int advice) {
        if (advice != MADV_POPULATE_READ) return internal::libc_syscalls().advise(address, length, advice);
        ++populate_calls;
        errno = EINVAL;
        return -1;
    }
    static ssize_t read_at(int fd, void* buffer, std::size_t count, off_t offset) {
        ++reads;
        // Slow enough that the other threads take their next chunks meanwhile.
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        const ssize_t n = internal::libc_syscalls().read_at(fd, buffer, count, offset);
        if (n > 0 && clobber_errno) errno = ENOTTY;
        return n;
    }
    static internal::SysCalls table() {
        internal::SysCalls t = internal::libc_syscalls();
        t.advise = &advise;
        t.read_at = &read_at;
        populate_calls = reads = 0;
        return t;
    }
};

// A model of three 4 MiB shards, each one device tensor, and their read-only mappings.
struct ShardedModel {
    wm::test::TempFile a{4 * MiB}, b{4 * MiB, ".b"}, c{4 * MiB, ".c"};
    ModelDesc m;
    MappedModel mapped;
    std::vector<FileExtent> extents;
    ShardedModel() {
        m.files = {{a.path(), a.size()}, {b.path(), b.size()}, {c.path(), c.size()}};
        TargetDesc gpu{"GPU0", "fake", {}};
        gpu.caps.device_memory = DeviceMemory::unified;
        m.targets = {gpu};
        for (std::uint32_t f = 0; f < 3; ++f) {
            m.tensors.push_back({"t", f, 0, 4 * MiB, 0});
            extents.push_back({f, 0, 4 * MiB});
        }
        const std::string paths[] = {a.path(), b.path(), c.path()};
        auto opened = MappedModel::open(paths, MappingAccess::read_only, {});
        REQUIRE(opened.ok());
        mapped = std::move(opened).value();
    }
};

void check_old_kernel_load(bool clobber_errno, std::uint32_t threads) {
    ShardedModel model;
    const internal::SysCalls table = OldKernel::table();
    OldKernel::clobber_errno = clobber_errno;
    wm::test::SysCallsGuard hooks(table);
    ReadOptions options;
    options.chunk_size = 256 * 1024; // 48 chunks across the three shards
    options.threads = threads;
    errno = 0; // a thread that never called madvise sees this
    auto populated = populate(model.m, model.mapped.files(), model.extents, options);
    INFO((populated.ok() ? std::string() : populated.error().message));
    REQUIRE(populated.ok());
    CHECK(populated->method == "pread + page touch");
    CHECK(populated->bytes == 12 * MiB);
    CHECK(OldKernel::populate_calls >= 1);
    CHECK(OldKernel::populate_calls <= static_cast<int>(threads)); // at most once a thread
    CHECK(OldKernel::reads == 48);
}
} // namespace

TEST_CASE("an old kernel (MADV_POPULATE_READ is EINVAL): a sharded model loads on 3 threads") {
    for (int attempt = 0; attempt < 5; ++attempt) check_old_kernel_load(false, 3);
}

TEST_CASE("an old kernel: a successful pread that leaves errno set does not fail the next chunk") {
    check_old_kernel_load(true, 1);
    check_old_kernel_load(true, 4);
}

TEST_CASE("madvise errors other than EINVAL still fail, naming file and errno") {
    ShardedModel model;
    internal::SysCalls table = internal::libc_syscalls();
    table.advise = [](void* address, std::size_t length, int advice) {
        if (advice != MADV_POPULATE_READ) return internal::libc_syscalls().advise(address, length, advice);
        errno = EFAULT;
        return -1;
    };
    wm::test::SysCallsGuard hooks(table);
    ReadOptions options;
    options.threads = 2;
    auto populated = populate(model.m, model.mapped.files(), model.extents, options);
    REQUIRE_FALSE(populated.ok());
    CHECK(populated.error().kind == ErrorKind::io);
    CHECK_THAT(populated.error().message, Catch::Contains("madvise(MADV_POPULATE_READ)") &&
                                              Catch::Contains("Bad address"));
}
