// SPDX-License-Identifier: MIT
// The fallback copy's source, measured side by side in one run: device copies of a file's bytes
// made out of its read-only MAP_SHARED mapping (what an engine copying from the mapping does)
// against the same copies made after one large pread per chunk into anonymous staging (what
// copy_fallback_tensors and wm-load do on a device that reads pageable memory). On Grace, copies
// out of file-backed pages are reported pathologically slow (a GB300: 1,184 s -> 67 s once each
// tensor was read into anonymous memory first, NVIDIA/cosmos-framework#150); here the host side
// of it is measured, cold (the file evicted before every pass) and warm, twice: through the
// importer's allocate_copy (the device copy included; on the fake a calloc and a memcpy), and on
// the host alone (the mapping arm a memcpy into the same staging the pread arm reads into), which
// isolates the source.
//
// Usage: bench_cuda_fallback_copy [SIZE_MIB [DIR]]   (default 512 MiB in $TMPDIR)
// The driver is libcuda.so.1 or $WEIGHTMAP_CUDA_LIBRARY (the fake: the copy itself is memcpy).
// Prints `cuda_fallback_copy cache=<cold|warm> to=<device|host> ... mapping_mibps=<n>
// pread_mibps=<n> ratio=<n>` (ratio = pread / mapping, best of 3 each, the arms alternated).
// Exits 77 without a driver.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "weightmap/backends/cuda.hpp"

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr std::uint64_t chunk = 64 * MiB; // one tensor, one copy, one pread
constexpr int passes = 3;

std::uint8_t byte_at(std::uint64_t offset) {
    return static_cast<std::uint8_t>((offset * 2654435761u) >> 13);
}

struct PatternFile {
    std::string path;
    int fd = -1;
    std::uint64_t size = 0;
    bool write(const std::string& dir, std::uint64_t bytes) {
        path = dir + "/weightmap-bench-fallback-XXXXXX";
        fd = mkstemp(path.data());
        std::vector<std::uint8_t> block(chunk);
        for (std::uint64_t done = 0; fd >= 0 && done < bytes; done += chunk) {
            const std::uint64_t n = std::min(chunk, bytes - done);
            for (std::uint64_t i = 0; i < n; ++i) block[i] = byte_at(done + i);
            if (::write(fd, block.data(), n) != static_cast<ssize_t>(n)) return false;
        }
        size = bytes;
        return fd >= 0 && fsync(fd) == 0;
    }
    // Drops the file's pages from the page cache (none is mapped between passes).
    void evict() const { posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }
    ~PatternFile() {
        if (fd >= 0) close(fd);
        if (!path.empty()) unlink(path.c_str());
    }
};

// Checks one device copy of the chunk at `offset` and frees it.
void check_and_free(wm::Importer& cuda, const wm::ImportedBuffer& copy, std::uint64_t offset,
                    std::string& error) {
    std::uint8_t last = 0; // the chunk's last byte as the device holds it
    if (!cuda.read_back(copy, copy.size - 1, 1, &last).ok()) error = "read_back failed";
    else if (last != byte_at(offset + copy.size - 1)) error = "a copied byte differs from the file";
    (void)cuda.free_copy(copy);
}

// One pass: every chunk's bytes taken from the mapping or from a pread into `staging`, then
// copied to the device (allocate_copy, checked, freed at once) - or, with no importer, the
// mapping arm memcpys into `staging` and the pass ends there. Seconds, or -1 on failure.
double copy_pass(wm::Importer* cuda, const PatternFile& file, bool from_mapping,
                 std::vector<std::uint8_t>& staging, std::string& error) {
    const auto start = std::chrono::steady_clock::now();
    void* map = mmap(nullptr, file.size, PROT_READ, MAP_SHARED, file.fd, 0);
    if (map == MAP_FAILED) return error = "mmap failed", -1;
    const auto* base = static_cast<const std::uint8_t*>(map);
    for (std::uint64_t done = 0; done < file.size && error.empty(); done += chunk) {
        const std::uint64_t n = std::min(chunk, file.size - done);
        const void* source = base + done;
        if (!from_mapping) {
            if (pread(file.fd, staging.data(), n, static_cast<off_t>(done)) !=
                static_cast<ssize_t>(n))
                error = "pread failed";
            source = staging.data();
        } else if (cuda == nullptr) {
            std::memcpy(staging.data(), source, n);
        }
        if (cuda == nullptr) continue;
        auto copy = cuda->allocate_copy(source, n);
        if (copy) check_and_free(*cuda, copy.value(), done, error);
        else error = copy.error().message;
    }
    munmap(map, file.size);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return error.empty() ? seconds : -1;
}

struct Best {
    double mapping = 1e30, pread = 1e30;
};

Best measure(wm::Importer* cuda, const PatternFile& file, bool cold, std::string& error) {
    std::vector<std::uint8_t> staging(chunk);
    Best best;
    for (int p = 0; p < passes && error.empty(); ++p)
        for (bool from_mapping : {true, false}) { // alternated: drift hits both arms
            if (cold) file.evict();
            const double s = copy_pass(cuda, file, from_mapping, staging, error);
            double& slot = from_mapping ? best.mapping : best.pread;
            if (s > 0) slot = std::min(slot, s);
        }
    return best;
}

} // namespace

int main(int argc, char** argv) {
    const std::uint64_t size_mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 512;
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = argc > 2 ? argv[2] : (tmp != nullptr && *tmp ? tmp : "/tmp");
    wm::CudaImporterParams params;
    params.allow_discrete = true;
    auto made = wm::make_cuda_importer(params);
    if (!made) return std::fprintf(stderr, "%s\n", made.error().message.c_str()), 1;
    wm::Importer& cuda = *made.value();
    auto state = wm::cuda_importer_state(cuda);
    PatternFile file;
    if (size_mib == 0 || !file.write(dir, size_mib * MiB))
        return std::fprintf(stderr, "cannot write %s\n", dir.c_str()), 1;
    std::string error;
    for (bool to_device : {true, false})
        for (bool cold : {true, false}) {
            const Best best = measure(to_device ? &cuda : nullptr, file, cold, error);
            if (!error.empty()) {
                // No driver (or no device): allocate_copy says so; nothing was measured.
                std::printf("SKIP: %s\n", error.c_str());
                return 77;
            }
            const double mib = static_cast<double>(file.size) / MiB;
            std::printf("cuda_fallback_copy cache=%s to=%s size_mib=%llu method=%s "
                        "mapping_mibps=%.0f pread_mibps=%.0f ratio=%.2f\n",
                        cold ? "cold" : "warm", to_device ? "device" : "host",
                        static_cast<unsigned long long>(size_mib),
                        state ? wm::to_string(state->method) : "unavailable", mib / best.mapping,
                        mib / best.pread, best.mapping / best.pread);
        }
    return 0;
}
