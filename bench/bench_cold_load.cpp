// SPDX-License-Identifier: MIT
// bench_cold_load - how fast a cold file reaches memory, by the way it is read.
//
//   bench_cold_load [SIZE_MIB (default 1024)] [DIR (default build/bench-cold)]
//
// Writes a file of SIZE_MIB (random bytes, so nothing compresses or dedups), a sparse file of the
// same size, and a 3-shard model of the same total, then for each measures, best of 3, with the
// files evicted from the page cache before every run (posix_fadvise(POSIX_FADV_DONTNEED), checked
// with mincore: under 1 % resident):
//   read_1m      sequential read(2) in 1 MiB blocks (the limit)
//   touch        one load per page of a read-only shared mapping (a copy through the mapping)
//   touch_random the same after madvise(MADV_RANDOM) (upstream's --numa case)
//   mlock        mlock() of the mapping (what a pin does)
//   populate     wm::populate() of the whole mapping (what load_model does before importing)
//   copy         wm::copy_fallback_tensors() of the whole file into host memory, 64 MiB tensors
//                (the destination is faulted in before the runs, as an engine's buffer is)
// One line per method: `set=<file|sparse|shards> method=<name> MBps=<n> ratio=<n>` (ratio against
// read_1m of the same set), then a table. Exits 1 when a file cannot be evicted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "weightmap/mapping.hpp"
#include "weightmap/populate.hpp"

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

bool write_file(const std::string& path, std::uint64_t size, bool sparse) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return false;
    bool ok = true;
    if (sparse) {
        ok = ::ftruncate(fd, static_cast<off_t>(size)) == 0;
    } else {
        std::mt19937_64 rng(42);
        std::vector<std::uint64_t> block(MiB / 8);
        for (std::uint64_t done = 0; ok && done < size; done += MiB) {
            for (auto& v : block) v = rng();
            ok = ::write(fd, block.data(), MiB) == static_cast<ssize_t>(MiB);
        }
    }
    ok = ::fsync(fd) == 0 && ok;
    ::close(fd);
    return ok;
}

// Drops the file's pages; true when under 1 % of them stay resident.
bool evict(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return false;
    struct stat st {};
    ::fstat(fd, &st);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return false;
    std::vector<unsigned char> v((size + 4095) / 4096);
    std::uint64_t in = 0;
    if (::mincore(p, size, v.data()) == 0)
        for (unsigned char r : v) in += r & 1;
    ::munmap(p, size);
    return in * 100 < v.size();
}

struct Set {
    std::string name;
    std::vector<std::string> paths;
    std::uint64_t bytes = 0;
};

// The read-only shared mappings of the set's files (what an engine maps).
struct Maps {
    explicit Maps(const Set& set) {
        auto opened = wm::MappedModel::open(set.paths, wm::MappingAccess::read_only, {});
        if (opened) model = std::move(opened).value();
        ok = opened.ok();
    }
    wm::MappedModel model;
    bool ok = false;
};

using Method = std::function<bool(const Set&)>;

bool read_1m(const Set& set) {
    std::vector<char> buffer(MiB);
    for (const std::string& path : set.paths) {
        const int fd = ::open(path.c_str(), O_RDONLY);
        if (fd < 0) return false;
        while (::read(fd, buffer.data(), buffer.size()) > 0) {
        }
        ::close(fd);
    }
    return true;
}

bool touch(const Set& set, bool random) {
    Maps maps(set);
    if (!maps.ok) return false;
    unsigned sum = 0;
    for (const wm::MappedFile& f : maps.model.files()) {
        if (random) ::madvise(f.base, f.length, MADV_RANDOM);
        for (std::uint64_t at = 0; at < f.length; at += 4096)
            sum += static_cast<unsigned>(*static_cast<volatile const std::byte*>(f.base + at));
    }
    return sum != 1; // keeps the loads
}

bool lock(const Set& set) {
    Maps maps(set);
    if (!maps.ok) return false;
    bool ok = true;
    for (const wm::MappedFile& f : maps.model.files()) {
        ok = ::mlock(f.base, f.length) == 0 && ok;
        ::munlock(f.base, f.length);
    }
    return ok;
}

// The set as a model of 64 MiB tensors on one (unified) device target.
wm::ModelDesc model_of(const Set& set) {
    wm::ModelDesc m;
    wm::TargetDesc gpu{"GPU0", "gpu", {}};
    gpu.caps.device_memory = wm::DeviceMemory::unified;
    m.targets = {gpu};
    for (std::uint32_t f = 0; f < set.paths.size(); ++f) {
        struct stat st {};
        ::stat(set.paths[f].c_str(), &st);
        const auto size = static_cast<std::uint64_t>(st.st_size);
        m.files.push_back({set.paths[f], size});
        for (std::uint64_t at = 0; at < size; at += 64 * MiB)
            m.tensors.push_back({"t", f, at, std::min(64 * MiB, size - at), 0});
    }
    return m;
}

bool populate(const Set& set) {
    Maps maps(set);
    if (!maps.ok) return false;
    const wm::ModelDesc m = model_of(set);
    std::vector<wm::FileExtent> all;
    for (std::uint32_t f = 0; f < m.files.size(); ++f) all.push_back({f, 0, m.files[f].size});
    return wm::populate(m, maps.model.files(), all).ok();
}

// The engine's destination memory, faulted in once before any run: the engine owns its buffers
// whichever way it fills them, as read_1m reuses one warm buffer.
std::byte* destination = nullptr;

bool copy(const Set& set) {
    const wm::ModelDesc m = model_of(set);
    wm::Plan plan;
    plan.tensors.resize(m.tensors.size()); // every tensor falls back
    std::vector<std::byte*> dst(m.tensors.size());
    std::byte* block = destination;
    std::uint64_t at = 0;
    for (std::size_t t = 0; t < m.tensors.size(); ++t) {
        dst[t] = block + at;
        at += m.tensors[t].size;
    }
    wm::CopyDestination to;
    to.address = [&](std::uint32_t t) { return static_cast<void*>(dst[t]); };
    return wm::copy_fallback_tensors(m, plan, to).ok();
}

// Best of 3 cold runs, in MB/s; negative when the method failed or the set could not be evicted.
double measure(const Set& set, const Method& method) {
    double best = 0;
    for (int run = 0; run < 3; ++run) {
        for (const std::string& path : set.paths)
            if (!evict(path)) return -1;
        const auto start = std::chrono::steady_clock::now();
        if (!method(set)) return -2;
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        best = std::max(best, static_cast<double>(set.bytes) / 1e6 / took.count());
    }
    return best;
}

} // namespace

int main(int argc, char** argv) {
    const std::uint64_t size_mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
    const std::string dir = argc > 2 ? argv[2] : "build/bench-cold";
    if (size_mib < 3) {
        std::fprintf(stderr, "usage: %s [SIZE_MIB >= 3, default 1024] [DIR]\n", argv[0]);
        return 2;
    }
    ::mkdir(dir.c_str(), 0755);
    const std::uint64_t size = size_mib * MiB, shard = size_mib / 3 * MiB;
    std::vector<Set> sets = {{"file", {dir + "/cold.bin"}, size},
                             {"sparse", {dir + "/sparse.bin"}, size},
                             {"shards", {dir + "/shard-1.bin", dir + "/shard-2.bin", dir + "/shard-3.bin"}, 3 * shard}};
    bool ok = write_file(sets[0].paths[0], size, false) && write_file(sets[1].paths[0], size, true);
    for (const std::string& p : sets[2].paths) ok = ok && write_file(p, shard, false);
    if (!ok) {
        std::fprintf(stderr, "bench_cold_load: cannot write the files in %s\n", dir.c_str());
        return 1;
    }
    void* block = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (block == MAP_FAILED) {
        std::fprintf(stderr, "bench_cold_load: no memory for a %llu MiB destination\n",
                     static_cast<unsigned long long>(size_mib));
        return 1;
    }
    destination = static_cast<std::byte*>(block);
    const std::vector<std::pair<const char*, Method>> methods = {
        {"read_1m", read_1m},
        {"touch", [](const Set& s) { return touch(s, false); }},
        {"touch_random", [](const Set& s) { return touch(s, true); }},
        {"mlock", lock},
        {"populate", populate},
        {"copy", copy},
    };
    std::printf("# %llu MiB per set, best of 3 cold runs each; ratio = MBps / read_1m's\n",
                static_cast<unsigned long long>(size_mib));
    std::vector<std::vector<double>> table(sets.size());
    int status = 0;
    for (std::size_t s = 0; s < sets.size(); ++s) {
        for (const auto& [name, method] : methods) {
            const double mbps = measure(sets[s], method);
            if (mbps < 0) {
                std::printf("# %s/%s: %s\n", sets[s].name.c_str(), name,
                            mbps == -1 ? "cannot evict (tmpfs?)" : "failed");
                status = 1;
            }
            table[s].push_back(mbps);
            const double ratio = table[s][0] > 0 ? mbps / table[s][0] : 0;
            std::printf("set=%s method=%s MBps=%.0f ratio=%.2f\n", sets[s].name.c_str(), name,
                        mbps, ratio);
        }
    }
    std::printf("\n| method |");
    for (const Set& s : sets) std::printf(" %s MB/s | ratio |", s.name.c_str());
    std::printf("\n|---|");
    for (std::size_t s = 0; s < sets.size(); ++s) std::printf("---|---|");
    std::printf("\n");
    for (std::size_t m = 0; m < methods.size(); ++m) {
        std::printf("| %s |", methods[m].first);
        for (std::size_t s = 0; s < sets.size(); ++s)
            std::printf(" %.0f | %.2f |", table[s][m], table[s][0] > 0 ? table[s][m] / table[s][0] : 0);
        std::printf("\n");
    }
    for (const Set& s : sets)
        for (const std::string& p : s.paths) ::unlink(p.c_str());
    return status;
}
