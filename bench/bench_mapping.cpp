// SPDX-License-Identifier: MIT
// Why the mapping policy is MAP_SHARED: map + populate (and + mlock) a weight file three ways and
// print the time and RssAnon delta side by side. The private writable arm is the counter-example
// the library forbids; it exists only here, built by hand with mmap(2).
//
//   build/bench/bench_mapping [SIZE_MIB]   (default 1024)
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include "weightmap/mapping.hpp"
#include "weightmap/memstat.hpp"

namespace {

std::string make_file(std::uint64_t size) {
    const char* tmp = std::getenv("TMPDIR");
    std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/weightmap-bench-XXXXXX";
    int fd = mkstemp(path.data());
    if (fd < 0) return {};
    std::vector<char> chunk(1 << 20);
    for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 7 + 1);
    for (std::uint64_t done = 0; done < size; done += chunk.size())
        if (write(fd, chunk.data(), chunk.size()) < 0) break;
    fsync(fd);
    close(fd);
    return path;
}

// Reads the file once so every arm finds it in the page cache (none pays the disk).
void warm(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY);
    std::vector<char> buf(1 << 20);
    while (read(fd, buf.data(), buf.size()) > 0) {
    }
    close(fd);
}

struct Arm {
    const char* name;
    int open_flags, prot, flags;
    bool via_library; // the two arms the policy can produce go through MappedModel
};

struct Row {
    double seconds;
    long long rss_anon_delta;
    long long rss_file_delta;
};

Row run(const Arm& arm, const std::string& path, std::uint64_t size, bool lock) {
    wm::MemStat before = wm::read_memstat();
    auto t0 = std::chrono::steady_clock::now();
    Row row{};
    if (arm.via_library) {
        wm::MappingOptions options;
        options.populate = true;
        options.lock = lock;
        std::vector<std::string> paths{path};
        auto mapped = wm::MappedModel::open(paths, arm.prot & PROT_WRITE ? wm::MappingAccess::writable
                                                                         : wm::MappingAccess::read_only,
                                            options);
        row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!mapped) {
            fmt::print(stderr, "bench_mapping: {}\n", mapped.error().message);
            std::exit(1);
        }
        wm::MemStat after = wm::read_memstat();
        row.rss_anon_delta = wm::delta(before.rss_anon, after.rss_anon).value_or(0);
        row.rss_file_delta = wm::delta(before.rss_file, after.rss_file).value_or(0);
        return row;
    }
    int fd = open(path.c_str(), arm.open_flags);
    void* p = mmap(nullptr, size, arm.prot, arm.flags | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) std::exit(1);
    if (lock && mlock(p, size) != 0) std::exit(1);
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    wm::MemStat after = wm::read_memstat();
    row.rss_anon_delta = wm::delta(before.rss_anon, after.rss_anon).value_or(0);
    row.rss_file_delta = wm::delta(before.rss_file, after.rss_file).value_or(0);
    munmap(p, size);
    return row;
}

} // namespace

int main(int argc, char** argv) {
    std::uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
    std::uint64_t size = mib << 20;
    std::string path = make_file(size);
    if (path.empty()) return 1;
    warm(path);
    const Arm arms[] = {
        {"read-only shared (default)", O_RDONLY, PROT_READ, MAP_SHARED, true},
        {"writable shared (policy)", O_RDWR, PROT_READ | PROT_WRITE, MAP_SHARED, true},
        {"writable PRIVATE (forbidden)", O_RDWR, PROT_READ | PROT_WRITE, MAP_PRIVATE, false},
    };
    fmt::print("bench_mapping: {} MiB file, page cache warm, MAP_POPULATE (+ mlock)\n", mib);
    fmt::print("{:<30} {:>7} {:>10} {:>15} {:>15} {:>13}\n", "mapping", "mlock", "seconds",
               "RssAnon delta", "RssFile delta", "anon/file");
    for (bool lock : {false, true}) {
        for (const Arm& arm : arms) {
            Row r = run(arm, path, size, lock);
            fmt::print("{:<30} {:>7} {:>10.3f} {:>11} MiB {:>11} MiB {:>13.3f}\n", arm.name,
                       lock ? "yes" : "no", r.seconds, r.rss_anon_delta >> 20,
                       r.rss_file_delta >> 20,
                       static_cast<double>(r.rss_anon_delta) / static_cast<double>(size));
        }
    }
    unlink(path.c_str());
    return 0;
}
