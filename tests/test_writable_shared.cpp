// SPDX-License-Identifier: MIT
// map_file_writable_shared and the rules behind every writable mapping libweightmap makes: the
// effective uid must own the file and its mode must have the owner-write bit (root's override of
// mode bits is not taken), and the descriptor reopened O_RDWR through /proc/self/fd must be the
// same inode. decide_mapping and MappedModel apply the same rules.
#include <catch2/catch.hpp>

#include <cstring>
#include <dirent.h>
#include <fstream>
#include <string>
#include <vector>

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
#include "weightmap/planner.hpp"

using namespace wm;
using wm::test::TempDir;

namespace {

std::string write_file(const std::string& dir, const std::string& name, std::uint64_t size) {
    std::string path = dir + "/" + name;
    std::ofstream out(path, std::ios::binary);
    for (std::uint64_t i = 0; i < size; ++i) out.put(static_cast<char>(wm::test::pattern_byte(i)));
    return path;
}

int open_fds() {
    int n = 0;
    DIR* dir = opendir("/proc/self/fd");
    while (dir != nullptr && readdir(dir) != nullptr) ++n;
    if (dir != nullptr) closedir(dir);
    return n;
}

// A read-only descriptor of `path`, closed at scope exit.
struct ReadOnlyFd {
    int fd;
    explicit ReadOnlyFd(const std::string& path) : fd(open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
        if (fd < 0) throw std::runtime_error("open " + path);
    }
    ~ReadOnlyFd() { close(fd); }
};

wm::test::FakeImporter writable_needing() {
    return wm::test::FakeImporter("hsa-like", wm::test::device_caps(4096, true));
}

} // namespace

TEST_CASE("a file the caller owns with owner-write maps writable and shared from a read-only fd",
          "[writable_shared]") {
    TempDir dir;
    const std::uint64_t page = host_page_size();
    const std::string path = write_file(dir.path(), "w.gguf", 3 * page + 5);
    REQUIRE(chmod(path.c_str(), 0600) == 0);
    ReadOnlyFd ro(path);
    const int fds = open_fds();
    auto mapped = map_file_writable_shared(ro.fd, 0);
    REQUIRE(mapped.ok());
    CHECK(open_fds() == fds); // the O_RDWR reopen is closed again; the mapping keeps the file
    CHECK(mapped->length == 4 * page);
    mapped->base[7] = std::byte{0xA5}; // shared: the store reaches the file
    REQUIRE(msync(mapped->base, mapped->length, MS_SYNC) == 0);
    unsigned char byte = 0;
    REQUIRE(pread(ro.fd, &byte, 1, 7) == 1);
    CHECK(byte == 0xA5);
    REQUIRE(munmap(mapped->base, mapped->length) == 0); // the caller's to unmap

    auto part = map_file_writable_shared(ro.fd, page + 1);
    REQUIRE(part.ok());
    CHECK(part->length == 2 * page);
    munmap(part->base, part->length);
    auto past_end = map_file_writable_shared(ro.fd, 4 * page);
    REQUIRE_FALSE(past_end.ok());
    CHECK(past_end.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(past_end.error().message, Catch::Contains(path));
    CHECK(map_file_writable_shared(-1, 0).error().kind == ErrorKind::invalid_argument);
    CHECK(open_fds() == fds);
}

TEST_CASE("a 0444 file stays read-only, even for root: the owner-write rule, not open(O_RDWR)",
          "[writable_shared]") {
    TempDir dir;
    const std::string path = write_file(dir.path(), "ro.gguf", 8192);
    REQUIRE(chmod(path.c_str(), 0444) == 0);
    ReadOnlyFd ro(path);
    auto mapped = map_file_writable_shared(ro.fd, 0);
    REQUIRE_FALSE(mapped.ok());
    CHECK(mapped.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(mapped.error().message, Catch::Contains(path) && Catch::Contains("0444") &&
                                           Catch::Contains("owner-write"));
    if (geteuid() == 0) { // what the rule overrides: root itself would open it O_RDWR
        const int rw = open(path.c_str(), O_RDWR | O_CLOEXEC);
        CHECK(rw >= 0);
        if (rw >= 0) close(rw);
    }
    // The mapping policy and MappedModel apply the same rule.
    auto hsa_like = writable_needing();
    std::vector<Importer*> importers{&hsa_like};
    std::vector<std::string> paths{path};
    MappingDecision d = decide_mapping(paths, importers);
    CHECK(d.access == MappingAccess::read_only);
    CHECK(d.unwritable_path == path);
    CHECK_THAT(d.reason, Catch::Contains("owner-write"));
    auto model = MappedModel::open(paths, MappingAccess::writable);
    REQUIRE_FALSE(model.ok());
    CHECK_THAT(model.error().message, Catch::Contains("owner-write"));
}

TEST_CASE("a file the caller does not own is refused, even with every write bit set",
          "[writable_shared][root][may_skip]") {
    if (geteuid() != 0) return wm::test::skip("needs root to drop privileges");
    TempDir dir;
    chmod(dir.path().c_str(), 0755);
    const std::string path = write_file(dir.path(), "theirs.gguf", 8192);
    REQUIRE(chmod(path.c_str(), 0666) == 0); // nobody could open it O_RDWR; the rule says no
    auto result = wm::test::run_in_child([&] {
        if (!wm::test::drop_privileges_to_nobody()) return 10;
        const int probe = open(path.c_str(), O_RDWR | O_CLOEXEC);
        if (probe < 0) return 11; // the rule, not the permission check, must be what refuses
        close(probe);
        ReadOnlyFd ro(path);
        auto mapped = map_file_writable_shared(ro.fd, 0);
        if (mapped.ok()) return 1;
        if (mapped.error().kind != ErrorKind::invalid_argument) return 2;
        const std::string& m = mapped.error().message;
        if (m.find(path) == std::string::npos) return 3;
        if (m.find("owned by uid 0") == std::string::npos) return 4;
        if (m.find("rule: the caller must own the file") == std::string::npos) return 5;
        auto hsa_like = writable_needing();
        std::vector<Importer*> importers{&hsa_like};
        std::vector<std::string> paths{path};
        if (decide_mapping(paths, importers).access != MappingAccess::read_only) return 6;
        return 0;
    });
    CHECK(result.exited);
    CHECK(result.code == 0);
}

namespace {
// Reopens of /proc/self/fd/N go to another file: what a /proc that is not procfs would do.
std::string other_path;
int open_other_on_reopen(const char* path, int flags) {
    if (std::strncmp(path, "/proc/self/fd/", 14) == 0) path = other_path.c_str();
    return internal::libc_syscalls().open_file(path, flags);
}
int maps_made = 0;
void* counting_map(void* addr, std::size_t length, int prot, int flags, int fd, off_t offset) {
    ++maps_made;
    return internal::libc_syscalls().map(addr, length, prot, flags, fd, offset);
}
} // namespace

TEST_CASE("a reopened descriptor of another inode is refused and nothing is mapped",
          "[writable_shared]") {
    TempDir dir;
    const std::string path = write_file(dir.path(), "mine.gguf", 8192);
    other_path = write_file(dir.path(), "other.gguf", 8192);
    ReadOnlyFd ro(path);
    internal::SysCalls table = internal::libc_syscalls();
    table.open_file = &open_other_on_reopen;
    table.map = &counting_map;
    maps_made = 0;
    const int fds = open_fds();
    {
        wm::test::SysCallsGuard hooks(table);
        auto mapped = map_file_writable_shared(ro.fd, 0);
        REQUIRE_FALSE(mapped.ok());
        CHECK(mapped.error().kind == ErrorKind::invalid_argument);
        CHECK_THAT(mapped.error().message,
                   Catch::Contains(path) && Catch::Contains("rule: the same inode"));
    }
    CHECK(maps_made == 0);
    CHECK(open_fds() == fds); // the wrong file's descriptor is closed
    // Without the substitution the same descriptor maps: the refusal was the inode check.
    auto mapped = map_file_writable_shared(ro.fd, 0);
    REQUIRE(mapped.ok());
    munmap(mapped->base, mapped->length);
}
