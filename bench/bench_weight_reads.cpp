// SPDX-License-Identifier: MIT
// Does reading weights from the page cache cost decode speed? Decoding reads every weight once per
// token; an import reads them where the file's pages are, a copy from anonymous memory. This
// bench reads one file's bytes end to end, repeatedly, from four places, alternated, and prints
// the median read rate, its spread and the part of the bytes mapped by huge pages (PMD):
//   mapping            a shared read-only mapping of the file, read cold once, populated (what an
//                      import reads)
//   mapping+hugepage   the same after MADV_HUGEPAGE and a cold populate: the kernel's readahead
//                      then fills the page cache with PMD-sized folios where the file system can
//   anon               a malloc'd copy (what lavapipe's device memory is: host malloc)
//   anon+hugepage      the copy in memory advised MADV_HUGEPAGE before it was written
// The llama.cpp note (integrations/llama.cpp/README.md) compares these ratios with decode's.
//
//   build/bench/bench_weight_reads FILE [PASSES]   (default 7 passes per place; FILE is read cold
//                                                    once: its page cache is dropped first)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

namespace {

constexpr std::uint64_t huge_page = std::uint64_t{2} << 20;

// Sum of the region's 64-bit words on two threads (the llama.cpp cases run with -t 2).
double read_gbps(const std::byte* data, std::uint64_t size) {
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t sums[2] = {0, 0};
    auto part = [&](int t) {
        const auto* words = reinterpret_cast<const std::uint64_t*>(data);
        const std::uint64_t n = size / 8, first = n * t / 2, last = n * (t + 1) / 2;
        std::uint64_t s = 0;
        for (std::uint64_t i = first; i < last; ++i) s += words[i];
        sums[t] = s;
    };
    std::thread other(part, 1);
    part(0);
    other.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sums[0] + sums[1] == 42) std::fputs("", stdout); // keeps the sums alive
    return static_cast<double>(size) / seconds / 1e9;
}

// kB of the VMA at `addr` mapped by PMDs (FilePmdMapped + AnonHugePages), from /proc/self/smaps.
std::uint64_t pmd_kib(const void* addr) {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool inside = false;
    std::uint64_t kib = 0;
    const auto at = reinterpret_cast<std::uintptr_t>(addr);
    while (std::getline(smaps, line)) {
        unsigned long lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
            inside = at >= lo && at < hi;
            continue;
        }
        unsigned long long v = 0;
        if (inside && (std::sscanf(line.c_str(), "FilePmdMapped: %llu", &v) == 1 ||
                       std::sscanf(line.c_str(), "AnonHugePages: %llu", &v) == 1))
            kib += v;
    }
    return kib;
}

struct Place {
    explicit Place(const char* n) : name(n) {}
    const char* name;
    std::byte* data = nullptr;
    std::vector<double> rates;
    std::uint64_t pmd_mib = 0;
};

// Drops FILE's page cache, maps it shared read-only and populates it (after MADV_HUGEPAGE if
// asked): the readahead of this cold read decides the page cache's folio sizes.
std::byte* map_cold(const char* path, std::uint64_t size, bool hugepage) {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return nullptr;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return nullptr;
    if (hugepage) madvise(p, size, MADV_HUGEPAGE);
    madvise(p, size, 22 /* MADV_POPULATE_READ */);
    return static_cast<std::byte*>(p);
}

std::byte* anon_copy(const std::byte* from, std::uint64_t size, bool hugepage) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    if (hugepage) madvise(p, size, MADV_HUGEPAGE);
    std::memcpy(p, from, size);
    return static_cast<std::byte*>(p);
}

// PASSES rounds over {mapping, anon, anon+hugepage}, the order rotating each round.
void alternate(Place* a, Place* b, Place* c, std::uint64_t size, int passes) {
    Place* order[] = {a, b, c};
    for (int r = 0; r < passes; ++r)
        for (int j = 0; j < 3; ++j) {
            Place* p = order[(r + j) % 3];
            p->rates.push_back(read_gbps(p->data, size));
        }
    for (Place* p : order) p->pmd_mib = std::max(p->pmd_mib, pmd_kib(p->data) >> 10);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        fmt::print(stderr, "usage: bench_weight_reads FILE [PASSES]\n");
        return 2;
    }
    const int passes = argc > 2 ? std::max(1, std::atoi(argv[2])) : 7;
    const int fd = open(argv[1], O_RDONLY);
    if (fd < 0) return fmt::print(stderr, "bench_weight_reads: cannot open {}\n", argv[1]), 1;
    const std::uint64_t size = static_cast<std::uint64_t>(lseek(fd, 0, SEEK_END)) / huge_page * huge_page;
    close(fd);
    if (size == 0) return fmt::print(stderr, "bench_weight_reads: {} is under 2 MiB\n", argv[1]), 1;
    Place mapping("mapping"), advised("mapping+hugepage"), anon("anon"), anon_huge("anon+hugepage");
    mapping.data = map_cold(argv[1], size, false);
    if (mapping.data == nullptr) return fmt::print(stderr, "bench_weight_reads: cannot map {}\n", argv[1]), 1;
    anon.data = anon_copy(mapping.data, size, false);
    anon_huge.data = anon_copy(mapping.data, size, true);
    if (anon.data == nullptr || anon_huge.data == nullptr) return 1;
    alternate(&mapping, &anon, &anon_huge, size, passes);
    munmap(mapping.data, size); // unmapped, so that the cold read below can drop its pages
    advised.data = map_cold(argv[1], size, true);
    if (advised.data == nullptr) return 1;
    alternate(&advised, &anon, &anon_huge, size, passes);

    fmt::print("bench_weight_reads: {} ({} MiB), {} alternated passes per mapping, {} per anon "
               "copy, 2 threads\n", argv[1], size >> 20, passes, 2 * passes);
    fmt::print("{:<18} {:>8} {:>16} {:>9} {:>14}\n", "place", "GB/s", "spread", "PMD MiB", "ratio to anon");
    const double base = median(anon.rates);
    for (const Place* p : {&mapping, &advised, &anon, &anon_huge}) {
        const auto [lo, hi] = std::minmax_element(p->rates.begin(), p->rates.end());
        fmt::print("{:<18} {:>8.2f} {:>7.2f}..{:<7.2f} {:>9} {:>14.3f}\n", p->name, median(p->rates), *lo, *hi,
                   p->pmd_mib, median(p->rates) / base);
    }
    return 0;
}
