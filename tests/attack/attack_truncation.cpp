// SPDX-License-Identifier: MIT
// A model file truncated at each stage of a load, as another process may do to a model in use:
// after planning, during populate (from its progress callback, so the moment is exact), during
// the fallback copy (from its sink). Every stage fails cleanly with ErrorKind::io naming the
// file, where it now ends and the extent or tensor being read (docs/testing.md), never SIGBUS,
// and leaves no descriptor open (issue 44 item 12: a truncation during populate said only
// "madvise(MADV_POPULATE_READ) at offset ...: Bad address").
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fcntl.h>
#include <string>
#include <unistd.h>
#include <vector>

#include "weightmap/mapping.hpp"
#include "weightmap/model.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/populate.hpp"

namespace {

using Catch::Contains;
constexpr std::uint64_t MiB = std::uint64_t{1} << 20;

std::size_t open_fds() {
    std::size_t n = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
        while (readdir(d) != nullptr) ++n;
        closedir(d);
    }
    return n;
}

// An 8 MiB file under $TMPDIR, mapped read-only, with one 8 MiB tensor at 0 on a unified device
// target: its plan imports [0, +8 MiB).
struct Load {
    std::string path;
    wm::MappedModel mapped;
    wm::ModelDesc model;
    wm::Plan plan;

    Load() {
        const char* dir = std::getenv("TMPDIR");
        path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/wm-attack-trunc-XXXXXX";
        const int fd = mkstemp(path.data());
        REQUIRE(fd >= 0);
        std::vector<char> bytes(8 * MiB, 'w');
        REQUIRE(write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
        close(fd);
        auto opened = wm::MappedModel::open({&path, 1}, wm::MappingAccess::read_only);
        REQUIRE(opened.ok());
        mapped = std::move(opened).value();
        wm::TargetDesc device;
        device.name = "device";
        device.caps.device_memory = wm::DeviceMemory::unified;
        model.files.push_back({path, 8 * MiB});
        model.targets.push_back(device);
        model.tensors.push_back({"w", 0, 0, 8 * MiB, 0});
        auto planned = wm::make_plan(model);
        REQUIRE(planned.ok());
        plan = std::move(planned).value();
    }
    ~Load() { unlink(path.c_str()); }
    void truncate_to(std::uint64_t size) const {
        REQUIRE(::truncate(path.c_str(), static_cast<off_t>(size)) == 0);
    }
};

} // namespace

TEST_CASE("a file truncated after planning: populate names the file, its end and the extent") {
    Load load;
    load.truncate_to(3 * MiB);
    const std::size_t fds = open_fds();
    auto populated = wm::populate_imports(load.model, load.plan, load.mapped.files());
    REQUIRE_FALSE(populated.ok());
    CHECK(populated.error().kind == wm::ErrorKind::io);
    CHECK_THAT(populated.error().message, Contains(load.path) && Contains("ends at offset 3145728") &&
                                              Contains("[0, +8388608)"));
    CHECK(open_fds() == fds);
}

// issue 44 item 12
TEST_CASE("a file truncated during populate: the error names the file, its end and the extent") {
    Load load;
    wm::ReadOptions options;
    options.chunk_size = MiB;
    options.threads = 1;
    int reports = 0;
    options.progress = [&](std::uint64_t, std::uint64_t) {
        if (reports++ == 0) load.truncate_to(3 * MiB + 100); // after the first chunk
        return true;
    };
    const std::size_t fds = open_fds();
    auto populated = wm::populate_imports(load.model, load.plan, load.mapped.files(), options);
    REQUIRE_FALSE(populated.ok());
    CHECK(reports >= 1);
    CHECK(populated.error().kind == wm::ErrorKind::io);
    // 3 MiB + 100 bytes end inside the page at 3 MiB: the first page that cannot be read is the
    // next one, 3 MiB + 4096 = 3149824.
    CHECK_THAT(populated.error().message,
               Contains(load.path) && Contains("ends at offset 3149824") &&
                   Contains("[0, +8388608)"));
    CHECK(open_fds() == fds);
}

TEST_CASE("a file truncated during the fallback copy: the error names the file and its end") {
    Load load;
    wm::Plan fallback = load.plan;
    for (wm::TensorPlacement& t : fallback.tensors) t.run = wm::no_index;
    wm::ReadOptions options;
    options.chunk_size = MiB;
    options.threads = 1;
    int chunks = 0;
    wm::CopyDestination to;
    to.sink = [&](std::uint32_t, std::uint64_t, const void*, std::uint64_t) -> wm::Status {
        if (chunks++ == 0) load.truncate_to(2 * MiB);
        return {};
    };
    const std::size_t fds = open_fds();
    auto copied = wm::copy_fallback_tensors(load.model, fallback, to, options);
    REQUIRE_FALSE(copied.ok());
    CHECK(copied.error().kind == wm::ErrorKind::io);
    CHECK_THAT(copied.error().message, Contains(load.path) && Contains("ends at offset 2097152"));
    CHECK(open_fds() == fds);
}
