// SPDX-License-Identifier: MIT
// The mapping policy: shared read-only by default, writable shared only when an importer needs it
// and every shard allows it, never private-writable, populate/mlock without anonymous copies,
// clear errors, and nothing left mapped when file k of n fails.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakes/fake_importers.hpp"
#include "internal/sys_hooks.hpp"
#include "support/child.hpp"
#include "support/skip.hpp"
#include "support/sys_hooks_guard.hpp"
#include "support/temp_file.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/memstat.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::FakeImporter;
using wm::test::TempDir;
using wm::test::TempFile;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// The permission string ("r--s", "rw-s", ...) of the mapping that contains `address`.
std::string maps_permissions(const void* address) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    auto a = reinterpret_cast<std::uintptr_t>(address);
    while (std::getline(maps, line)) {
        unsigned long lo = 0, hi = 0;
        char perms[5] = {};
        if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) == 3 && a >= lo && a < hi)
            return perms;
    }
    return {};
}

std::string write_file(const std::string& dir, const std::string& name, std::uint64_t size) {
    std::string path = dir + "/" + name;
    std::ofstream out(path, std::ios::binary);
    for (std::uint64_t i = 0; i < size; ++i) out.put(static_cast<char>(wm::test::pattern_byte(i)));
    return path;
}

FakeImporter writable_needing(std::string name = "hsa-like") {
    return FakeImporter(std::move(name), wm::test::device_caps(4096, /*needs_writable=*/true));
}
} // namespace

TEST_CASE("decision: read-only unless an available non-CPU importer needs writable pages",
          "[mapping][policy]") {
    TempFile file(64 * 1024);
    std::vector<std::string> paths{file.path()};

    auto cpu = make_cpu_importer();
    FakeImporter vulkan_like("vulkan-like", wm::test::device_caps(4096, false));
    FakeImporter hsa_like = writable_needing();

    std::vector<Importer*> none_need{cpu.get(), &vulkan_like};
    MappingDecision d = decide_mapping(paths, none_need);
    CHECK(d.access == MappingAccess::read_only);
    CHECK_THAT(d.reason, Catch::Contains("no available non-CPU importer"));

    std::vector<Importer*> with_hsa{cpu.get(), &hsa_like, nullptr};
    d = decide_mapping(paths, with_hsa);
    CHECK(d.access == MappingAccess::writable);
    CHECK_THAT(d.reason, Catch::Contains("'hsa-like'"));

    // A CPU importer never causes a writable mapping, even if it (wrongly) asks for one.
    ImporterCaps odd_cpu;
    odd_cpu.is_cpu = true;
    odd_cpu.needs_writable_mapping = true;
    FakeImporter cpu_asking("cpu-asking", odd_cpu);
    std::vector<Importer*> cpu_only{&cpu_asking};
    CHECK(decide_mapping(paths, cpu_only).access == MappingAccess::read_only);

    // An importer that is not available is not active.
    hsa_like.set_unavailable("no GPU agent");
    CHECK(decide_mapping(paths, with_hsa).access == MappingAccess::read_only);
}

TEST_CASE("decision: registry defaults without an available HSA runtime map read-only",
          "[mapping][policy]") {
    // The writable half (the registry's HSA importer on the fake runtime makes the mapping
    // writable) is tests/hsa/test_hsa_mapping_policy.cpp.
    setenv("WEIGHTMAP_HSA_LIBRARY", "/nonexistent/libhsa-runtime64.so.1", 1);
    TempFile file(4096);
    std::vector<std::string> paths{file.path()};
    MappingDecision d = decide_mapping(paths, {});
    unsetenv("WEIGHTMAP_HSA_LIBRARY");
    CHECK(d.access == MappingAccess::read_only);
    CHECK(d.reason == "read-only: no available non-CPU importer needs a writable mapping "
                      "(import_policy unified_only)");
}

TEST_CASE("decision is all-or-nothing across shards: one read-only mount keeps all read-only",
          "[mapping][policy][root][may_skip]") {
    TempDir writable_dir, ro_dir;
    std::vector<std::string> paths{write_file(writable_dir.path(), "m-00001-of-00003.gguf", 8192),
                                   write_file(ro_dir.path(), "m-00002-of-00003.gguf", 8192),
                                   write_file(writable_dir.path(), "m-00003-of-00003.gguf", 8192)};
    // Root passes access(W_OK) on anything: prove the policy with a real read-only mount.
    auto result = wm::test::run_in_child([&] {
        if (!wm::test::remount_read_only_in_private_namespace(ro_dir.path())) return 77;
        FakeImporter hsa_like = writable_needing();
        std::vector<Importer*> importers{&hsa_like};
        MappingDecision d = decide_mapping(paths, importers);
        if (d.access != MappingAccess::read_only) return 1;
        if (d.unwritable_path != paths[1]) return 2;
        if (d.reason.find("weight file not writable: " + paths[1]) == std::string::npos) return 3;
        if (d.reason.find("Read-only file system") == std::string::npos) return 4;
        // The mapping that follows is read-only and MAP_SHARED for every shard.
        auto mapped = MappedModel::open(paths, d.access);
        if (!mapped) return 5;
        for (const MappedFile& f : mapped->files())
            if (maps_permissions(f.base) != "r--s") return 6;
        return 0;
    });
    if (result.exited && result.code == 77)
        return wm::test::skip("unshare(CLONE_NEWNS) is not permitted here (a read-only mount)");
    CHECK(result.exited);
    CHECK(result.code == 0);
}

TEST_CASE("decision with dropped privileges: one unwritable shard keeps all read-only",
          "[mapping][policy][root][may_skip]") {
    if (geteuid() != 0) return wm::test::skip("needs root to drop privileges");
    TempDir dir;
    chmod(dir.path().c_str(), 0755);
    std::vector<std::string> paths{write_file(dir.path(), "a.gguf", 4096),
                                   write_file(dir.path(), "b.gguf", 4096)};
    // nobody may write a.gguf but not b.gguf (0444, root-owned).
    REQUIRE(chown(paths[0].c_str(), 65534, 65534) == 0);
    REQUIRE(chmod(paths[0].c_str(), 0644) == 0);
    REQUIRE(chmod(paths[1].c_str(), 0444) == 0);
    auto result = wm::test::run_in_child([&] {
        if (!wm::test::drop_privileges_to_nobody()) return 10;
        FakeImporter hsa_like = writable_needing();
        std::vector<Importer*> importers{&hsa_like};
        MappingDecision d = decide_mapping(paths, importers);
        if (d.access != MappingAccess::read_only) return 1;
        if (d.unwritable_path != paths[1]) return 2;
        // Root owns b.gguf: the owner rule refuses it (test_writable_shared has the rules).
        if (d.reason.find("rule: the caller must own the file") == std::string::npos) return 3;
        // With only the writable shard, the same child gets a writable mapping.
        std::vector<std::string> first{paths[0]};
        if (decide_mapping(first, importers).access != MappingAccess::writable) return 4;
        return 0;
    });
    CHECK(result.exited);
    CHECK(result.code == 0);
}

TEST_CASE("the policy never produces a private writable mapping", "[mapping][policy]") {
    TempFile file(3 * MiB + 17);
    std::vector<std::string> paths{file.path()};
    for (MappingAccess access : {MappingAccess::read_only, MappingAccess::writable}) {
        for (int combo = 0; combo < 16; ++combo) {
            MappingOptions o;
            o.populate = combo & 1;
            o.will_need = combo & 2;
            o.lock = combo & 4;
            o.hint = combo & 8 ? AccessHint::random : AccessHint::sequential;
            o.base_alignment = combo & 8 ? 2 * MiB : 0;
            auto mapped = MappedModel::open(paths, access, o);
            REQUIRE(mapped.ok());
            const MappedFile& f = mapped->files()[0];
            std::string perms = maps_permissions(f.base);
            INFO("access " << to_string(access) << " combo " << combo << " perms " << perms);
            CHECK(perms == (access == MappingAccess::writable ? "rw-s" : "r--s"));
            CHECK(f.length == 3 * MiB + 4096);
            CHECK(mapped->file_sizes()[0] == 3 * MiB + 17);
            if (o.base_alignment != 0)
                CHECK(reinterpret_cast<std::uintptr_t>(f.base) % o.base_alignment == 0);
            CHECK(static_cast<unsigned char>(f.base[3 * MiB + 16]) ==
                  wm::test::pattern_byte(3 * MiB + 16));
        }
    }
}

TEST_CASE("populate + mlock of a 64 MiB file grows RssFile, not RssAnon", "[mapping][memory]") {
    TempFile file(64 * MiB);
    std::vector<std::string> paths{file.path()};
    for (MappingAccess access : {MappingAccess::read_only, MappingAccess::writable}) {
        MemStat before = read_memstat();
        MappingOptions o;
        o.populate = true;
        o.lock = true;
        auto mapped = MappedModel::open(paths, access, o);
        REQUIRE(mapped.ok());
        MemStat after = read_memstat();
        REQUIRE(before.rss_anon);
        INFO("access " << to_string(access));
        CHECK(*delta(before.rss_file, after.rss_file) >= static_cast<std::int64_t>(60 * MiB));
        CHECK(std::llabs(*delta(before.rss_anon, after.rss_anon)) <= static_cast<long long>(MiB));
#if defined(__SANITIZE_ADDRESS__)
        // ASan's mlock interceptor does nothing (it cannot lock its shadow): VmLck stays put.
        WARN("VmLck not checked under AddressSanitizer");
#else
        CHECK(*delta(before.vm_lck, after.vm_lck) == static_cast<std::int64_t>(64 * MiB));
#endif
    }
}

TEST_CASE("re-protect: a store into the mapping after make_read_only faults", "[mapping][death]") {
    TempFile file(2 * MiB);
    std::uint64_t hash_before = wm::test::hash_file(file.path());
    std::vector<std::string> paths{file.path()};
    auto mapped = MappedModel::open(paths, MappingAccess::writable);
    REQUIRE(mapped.ok());
    CHECK_FALSE(mapped->is_read_only());
    REQUIRE(mapped->make_read_only().ok());
    CHECK(mapped->is_read_only());
    CHECK(maps_permissions(mapped->files()[0].base) == "r--s");
    std::byte* target = mapped->files()[0].base + 12345;
    auto result = wm::test::run_in_child([&] {
        *reinterpret_cast<volatile unsigned char*>(target) = 0xAB; // must fault
        return 0;
    });
    CHECK_FALSE(result.exited);
    CHECK(result.signal == SIGSEGV);
    CHECK(wm::test::hash_file(file.path()) == hash_before);
}

TEST_CASE("errors name the file and the system call", "[mapping][errors]") {
    TempDir dir;
    std::string missing = dir.path() + "/missing.gguf";
    std::string empty = write_file(dir.path(), "empty.gguf", 0);

    auto open_one = [](const std::string& path, MappingAccess access = MappingAccess::read_only) {
        std::vector<std::string> paths{path};
        return MappedModel::open(paths, access);
    };
    auto r = open_one(missing);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().kind == ErrorKind::io);
    CHECK_THAT(r.error().message, Catch::Contains(missing) && Catch::Contains("open(") &&
                                      Catch::Contains("No such file"));

    r = open_one(dir.path());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("is a directory"));

    r = open_one(empty);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains(empty) && Catch::Contains("empty file"));

    CHECK_FALSE(MappedModel::open({}, MappingAccess::read_only).ok());

    // Permission denied: a 0600 root file seen by nobody.
    if (geteuid() == 0) {
        std::string secret = write_file(dir.path(), "secret.gguf", 4096);
        chmod(dir.path().c_str(), 0755);
        chmod(secret.c_str(), 0600);
        auto child = wm::test::run_in_child([&] {
            if (!wm::test::drop_privileges_to_nobody()) return 10;
            auto denied = open_one(secret);
            if (denied.ok()) return 1;
            if (denied.error().message.find("Permission denied") == std::string::npos) return 2;
            if (denied.error().message.find(secret) == std::string::npos) return 3;
            return 0;
        });
        CHECK(child.exited);
        CHECK(child.code == 0);
    }
}

namespace {
// Counting wrappers over libc, failing the N-th mmap/mlock on demand.
struct Counting {
    static inline int maps = 0, unmaps = 0, locks = 0, unlocks = 0, fail_map_at = 0,
                      fail_lock_at = 0;
    static void* map(void* a, std::size_t l, int p, int f, int fd, off_t o) {
        if (++maps == fail_map_at) {
            errno = ENOMEM;
            return MAP_FAILED;
        }
        return internal::libc_syscalls().map(a, l, p, f, fd, o);
    }
    static int unmap(void* a, std::size_t l) {
        ++unmaps;
        return internal::libc_syscalls().unmap(a, l);
    }
    static int lock(const void* a, std::size_t l) {
        if (++locks == fail_lock_at) {
            errno = ENOMEM;
            return -1;
        }
        return internal::libc_syscalls().lock(a, l);
    }
    static int unlock(const void* a, std::size_t l) {
        ++unlocks;
        return internal::libc_syscalls().unlock(a, l);
    }
};
} // namespace

TEST_CASE("a failed mapping of file k unmaps files 0..k-1", "[mapping][errors]") {
    TempDir dir;
    std::vector<std::string> paths;
    for (int i = 0; i < 4; ++i) paths.push_back(write_file(dir.path(), fmt::format("s{}.gguf", i), 8192));
    internal::SysCalls table = internal::libc_syscalls();
    table.map = &Counting::map;
    table.unmap = &Counting::unmap;
    table.lock = &Counting::lock;
    table.unlock = &Counting::unlock;
    wm::test::SysCallsGuard hooks(table); // libc's again however the case ends
    for (int k = 1; k <= 4; ++k) {
        for (bool fail_lock : {false, true}) {
            Counting::maps = Counting::unmaps = Counting::locks = Counting::unlocks = 0;
            Counting::fail_map_at = fail_lock ? 0 : k;
            Counting::fail_lock_at = fail_lock ? k : 0;
            MappingOptions o;
            o.lock = true;
            auto r = MappedModel::open(paths, MappingAccess::read_only, o);
            INFO("k " << k << " fail_lock " << fail_lock);
            REQUIRE_FALSE(r.ok());
            CHECK_THAT(r.error().message,
                       Catch::Contains(paths[k - 1]) &&
                           Catch::Contains(fail_lock ? "mlock" : "mmap"));
            // Every successful map was unmapped, every successful lock unlocked.
            int good_maps = Counting::maps - (fail_lock ? 0 : 1);
            CHECK(Counting::unmaps == good_maps);
            CHECK(Counting::unlocks == Counting::locks - (fail_lock ? 1 : 0));
        }
    }
}
