// SPDX-License-Identifier: MIT
// The CUDA importer on a file-backed, read-only MAP_SHARED mapping (1 GiB by default): the time
// to register it and the process's RssAnon growth, every byte read back through the device,
// and host-to-device copies from the registered mapping against the same copies from the same,
// unregistered (pageable) pages, side by side in one run. The copy ratio is the DMA use
// (cuda_pin_fallbacks, llama.cpp PR #26659); on a fake driver both arms are memcpy (ratio ~1).
// Then the device's read bandwidth: cuMemcpyDtoD out of the import (and, where the device reads
// pageable memory but the importer registers, out of the plain mapping: the direct method)
// against the same copy out of device memory, as a ratio (issue 26).
//
// Usage: bench_cuda_register [SIZE_MIB [DIR]]   (DIR: where the file is written; default $TMPDIR)
// The driver is libcuda.so.1, or $WEIGHTMAP_CUDA_LIBRARY. A discrete device is measured too
// (allow_discrete). Exits 77 (SKIP) when no driver or device is usable.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda/cuda_driver.hpp" // types and signatures only: the bench resolves its own entries
#include "weightmap/backends/cuda.hpp"
#include "weightmap/memstat.hpp"

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr std::uint64_t chunk = 64 * MiB; // per read_back / allocate_copy
constexpr int repeats = 3;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

std::int64_t rss_anon() {
    wm::MemStat stat = wm::read_memstat();
    return stat.rss_anon ? static_cast<std::int64_t>(*stat.rss_anon) : -1;
}

std::uint8_t byte_at(std::uint64_t offset) {
    return static_cast<std::uint8_t>((offset * 2654435761u) >> 13);
}

// A pattern file of `size` bytes, mapped MAP_SHARED PROT_READ, every page faulted in (both copy
// arms then read the same resident page-cache pages).
struct MappedFile {
    std::string path;
    std::byte* base = nullptr;
    std::uint64_t size = 0;
    bool open(const std::string& dir, std::uint64_t bytes) {
        path = dir + "/weightmap-bench-cuda-XXXXXX";
        const int fd = mkstemp(path.data());
        if (fd < 0) return false;
        std::vector<std::uint8_t> block(chunk);
        for (std::uint64_t done = 0; done < bytes; done += chunk) {
            const std::uint64_t n = std::min(chunk, bytes - done);
            for (std::uint64_t i = 0; i < n; ++i) block[i] = byte_at(done + i);
            if (write(fd, block.data(), n) != static_cast<ssize_t>(n)) return close(fd), false;
        }
        void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return false;
        base = static_cast<std::byte*>(p);
        size = bytes;
        volatile std::uint8_t sink = 0;
        for (std::uint64_t i = 0; i < size; i += 4096) sink = sink + std::to_integer<std::uint8_t>(base[i]);
        return true;
    }
    ~MappedFile() {
        if (base != nullptr) munmap(base, size);
        if (!path.empty()) unlink(path.c_str());
    }
};

struct Registration {
    double seconds = 0;
    std::int64_t rss_anon_delta = 0;
};

// Registers the whole mapping `repeats` times (released in between); the median time.
Registration time_register(wm::Importer& cuda, const MappedFile& file, std::string& error) {
    std::vector<Registration> samples;
    for (int r = 0; r < repeats && error.empty(); ++r) {
        const std::int64_t before = rss_anon();
        const auto start = Clock::now();
        auto imported = cuda.import(file.base, file.size);
        const double s = seconds_since(start);
        if (!imported) {
            error = imported.error().message;
            break;
        }
        samples.push_back({s, rss_anon() - before});
        if (wm::Status released = cuda.release(imported.value()); !released)
            error = released.error().message;
    }
    if (samples.empty()) return {};
    std::sort(samples.begin(), samples.end(),
              [](const Registration& a, const Registration& b) { return a.seconds < b.seconds; });
    return samples[samples.size() / 2];
}

// Reads every byte back through the device; the mismatching bytes and the seconds taken.
std::uint64_t verify(wm::Importer& cuda, const wm::ImportedBuffer& buffer, double& seconds,
                     std::string& error) {
    std::vector<std::uint8_t> got(chunk);
    std::uint64_t mismatched = 0;
    const auto start = Clock::now();
    for (std::uint64_t done = 0; done < buffer.size && error.empty(); done += chunk) {
        const std::uint64_t n = std::min(chunk, buffer.size - done);
        if (wm::Status s = cuda.read_back(buffer, done, n, got.data()); !s) {
            error = s.error().message;
            break;
        }
        for (std::uint64_t i = 0; i < n; ++i) mismatched += got[i] != byte_at(done + i);
    }
    seconds = seconds_since(start);
    return mismatched;
}

// Host-to-device copies of the whole mapping in chunks (allocate_copy, freed at once): the
// median seconds over `repeats` passes.
double time_copies(wm::Importer& cuda, const MappedFile& file, std::string& error) {
    std::vector<double> samples;
    for (int r = 0; r < repeats && error.empty(); ++r) {
        double total = 0;
        for (std::uint64_t done = 0; done < file.size && error.empty(); done += chunk) {
            const auto start = Clock::now();
            auto copy = cuda.allocate_copy(file.base + done, std::min(chunk, file.size - done));
            total += seconds_since(start);
            if (!copy) error = copy.error().message;
            else (void)cuda.free_copy(copy.value());
        }
        samples.push_back(total);
    }
    std::sort(samples.begin(), samples.end());
    return samples.empty() ? 0 : samples[samples.size() / 2];
}

double gib_per_s(std::uint64_t bytes, double seconds) {
    return seconds > 0 ? static_cast<double>(bytes) / (1024.0 * MiB) / seconds : 0;
}

// The driver the importer loaded (dlopen returns the same instance), for device-side copies in
// device 0's primary context, current on this thread while it lives.
class DeviceReads {
public:
    bool open() {
        const char* env = std::getenv("WEIGHTMAP_CUDA_LIBRARY");
        handle_ = dlopen(env != nullptr && *env ? env : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (handle_ == nullptr || !resolve(alloc_, "cuMemAlloc_v2") ||
            !resolve(free_, "cuMemFree_v2") || !resolve(dtod_, "cuMemcpyDtoD_v2") ||
            !resolve(retain_, "cuDevicePrimaryCtxRetain") ||
            !resolve(release_, "cuDevicePrimaryCtxRelease_v2") ||
            !resolve(push_, "cuCtxPushCurrent_v2") || !resolve(pop_, "cuCtxPopCurrent_v2"))
            return false;
        sync_ = reinterpret_cast<wm::cuda::CUresult (*)()>(dlsym(handle_, "cuCtxSynchronize"));
        wm::cuda::CUcontext context = nullptr;
        current_ = retain_(&context, 0) == wm::cuda::CUDA_SUCCESS &&
                   push_(context) == wm::cuda::CUDA_SUCCESS;
        return current_;
    }
    ~DeviceReads() {
        wm::cuda::CUcontext popped = nullptr;
        if (current_ && pop_(&popped) == wm::cuda::CUDA_SUCCESS) release_(0);
        if (handle_ != nullptr) dlclose(handle_);
    }
    // GiB/s of cuMemcpyDtoD from `source` (device-visible) into device memory: best of 3.
    double read_gibps(wm::cuda::CUdeviceptr source, std::uint64_t size) {
        wm::cuda::CUdeviceptr into = 0;
        if (alloc_(&into, size) != wm::cuda::CUDA_SUCCESS) return 0;
        double best = 0;
        for (int r = 0; r < repeats; ++r) {
            const auto start = Clock::now();
            const bool ok = dtod_(into, source, size) == wm::cuda::CUDA_SUCCESS &&
                            (sync_ == nullptr || sync_() == wm::cuda::CUDA_SUCCESS);
            if (ok) best = std::max(best, gib_per_s(size, seconds_since(start)));
        }
        free_(into);
        return best;
    }
    // The same out of device memory of the same size: the ratio's denominator.
    double device_gibps(std::uint64_t size) {
        wm::cuda::CUdeviceptr from = 0;
        if (alloc_(&from, size) != wm::cuda::CUDA_SUCCESS) return 0;
        const double gibps = read_gibps(from, size);
        free_(from);
        return gibps;
    }

private:
    template <class Fn>
    bool resolve(Fn& fn, const char* name) {
        fn = reinterpret_cast<Fn>(dlsym(handle_, name));
        return fn != nullptr;
    }
    void* handle_ = nullptr;
    bool current_ = false;
    wm::cuda::PFN_cuMemAlloc alloc_ = nullptr;
    wm::cuda::PFN_cuMemFree free_ = nullptr;
    wm::cuda::PFN_cuMemcpyDtoD dtod_ = nullptr;
    wm::cuda::PFN_cuDevicePrimaryCtxRetain retain_ = nullptr;
    wm::cuda::PFN_cuDevicePrimaryCtxRelease release_ = nullptr;
    wm::cuda::PFN_cuCtxPushCurrent push_ = nullptr;
    wm::cuda::PFN_cuCtxPopCurrent pop_ = nullptr;
    wm::cuda::CUresult (*sync_)() = nullptr; // cuCtxSynchronize; the fake has none (synchronous)
};

wm::cuda::CUdeviceptr as_device(const void* pointer) {
    return static_cast<wm::cuda::CUdeviceptr>(reinterpret_cast<std::uintptr_t>(pointer));
}

int fail(const std::string& what) {
    std::fprintf(stderr, "bench_cuda_register: %s\n", what.c_str());
    return 1;
}

} // namespace

int main(int argc, char** argv) {
    const std::uint64_t size_mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = argc > 2 ? argv[2] : (tmp != nullptr && *tmp ? tmp : "/tmp");
    wm::CudaImporterParams params;
    params.allow_discrete = true; // measure a discrete card too: the numbers are the point
    auto made = wm::make_cuda_importer(params);
    if (!made) return fail(made.error().message);
    wm::Importer& cuda = *made.value();
    if (!cuda.available().available) {
        std::printf("SKIP: %s\n", cuda.available().reason.c_str());
        return 77;
    }
    const wm::ImporterCaps caps = cuda.caps();
    MappedFile file;
    if (size_mib == 0 || !file.open(dir, size_mib * MiB)) return fail("cannot write and map " + dir);

    std::string error;
    const Registration registered = time_register(cuda, file, error);
    auto held = cuda.import(file.base, file.size);
    if (!error.empty() || !held) return fail(error.empty() ? held.error().message : error);
    double verify_s = 0;
    const std::uint64_t mismatched = verify(cuda, held.value(), verify_s, error);
    auto state = wm::cuda_importer_state(cuda);
    if (!state) return fail(state.error().message);
    DeviceReads device;
    if (!device.open()) return fail("cannot open the driver for device-side reads");
    const double read_device = device.device_gibps(file.size);
    const double read_import = device.read_gibps(as_device(held->device_address), file.size);
    // The direct method where the device reads pageable memory and the importer did not use it.
    const bool direct_too =
        state->pageable_access && state->method != wm::CudaImportMethod::direct;
    const double read_direct = direct_too ? device.read_gibps(as_device(file.base), file.size) : 0;
    const double htod_registered = time_copies(cuda, file, error);
    (void)cuda.release(held.value());
    const double htod_pageable = time_copies(cuda, file, error);
    if (!error.empty()) return fail(error);

    const double gib = static_cast<double>(file.size) / (1024.0 * MiB);
    std::printf("device: %s (%s), read-only registration: %s\n", std::string(cuda.notes().device_memory).c_str(),
                wm::to_string(caps.device_memory), caps.needs_writable_mapping ? "no" : "yes");
    std::printf("| %-44s | %12s | %10s |\n", "step (file-backed PROT_READ mapping)", "value",
                "GiB/s");
    std::printf("| %-44s | %9.1f ms | %10s |\n", "cuMemHostRegister, per GiB (median of 3)",
                registered.seconds * 1000 / gib, "");
    std::printf("| %-44s | %8.1f MiB | %10s |\n", "RssAnon growth across the registration",
                static_cast<double>(registered.rss_anon_delta) / MiB, "");
    std::printf("| %-44s | %12llu | %10.2f |\n", "bytes mismatched, read back through device",
                static_cast<unsigned long long>(mismatched), gib_per_s(file.size, verify_s));
    std::printf("| %-44s | %9.1f ms | %10.2f |\n", "HtoD copies from the registered mapping",
                htod_registered * 1000, gib_per_s(file.size, htod_registered));
    std::printf("| %-44s | %9.1f ms | %10.2f |\n", "HtoD copies from the same pages, pageable",
                htod_pageable * 1000, gib_per_s(file.size, htod_pageable));
    const double ratio = htod_registered > 0 ? htod_pageable / htod_registered : 0;
    std::printf("registered/pageable copy throughput: %.2fx\n", ratio);
    const auto read_ratio = [&](double gibps) { return read_device > 0 ? gibps / read_device : 0; };
    std::printf("cuda_read method=%s import_gibps=%.2f device_gibps=%.2f ratio=%.3f\n",
                wm::to_string(state->method), read_import, read_device, read_ratio(read_import));
    if (direct_too)
        std::printf("cuda_read method=direct import_gibps=%.2f device_gibps=%.2f ratio=%.3f\n",
                    read_direct, read_device, read_ratio(read_direct));
    std::printf("cuda_register method=%s size_mib=%llu register_ms_per_gib=%.1f "
                "rss_anon_delta_mib=%.1f mismatched=%llu htod_registered_gibps=%.2f "
                "htod_pageable_gibps=%.2f ratio=%.2f\n",
                wm::to_string(state->method), static_cast<unsigned long long>(size_mib),
                registered.seconds * 1000 / gib,
                static_cast<double>(registered.rss_anon_delta) / MiB,
                static_cast<unsigned long long>(mismatched), gib_per_s(file.size, htod_registered),
                gib_per_s(file.size, htod_pageable), ratio);
    return mismatched == 0 ? 0 : 1;
}
