// SPDX-License-Identifier: MIT
// Smoke test against the real libcuda.so.1, through the public API alone.
//   * Without an NVIDIA driver or GPU (CI): the importer must exist, report available() == false
//     with a non-empty reason, and refuse an import; then the GPU part is skipped (exit 77,
//     which meson reports as SKIP). A failed check exits 1 first.
//   * With a GPU: register a read-only MAP_SHARED file mapping (allow_discrete on a discrete
//     card, which is otherwise unavailable by design), read every byte back through the device,
//     make and read back a device copy, and check nothing stays registered.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support/smoke_check.hpp"
#include "weightmap/backends/cuda.hpp"

namespace {

using wm::test::smoke::check;
using wm::test::smoke::exit_skip;
using wm::test::smoke::failures;

std::uint8_t byte_at(std::uint64_t offset) {
    return static_cast<std::uint8_t>((offset * 2654435761u) >> 13);
}

// A read-only MAP_SHARED mapping of a fresh temporary file of `size` pattern bytes.
struct PatternMapping {
    std::string path;
    void* base = MAP_FAILED;
    std::size_t size = 0;
    explicit PatternMapping(std::size_t bytes) : size(bytes) {
        const char* dir = std::getenv("TMPDIR");
        path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
               "/weightmap-cuda-smoke-XXXXXX";
        int fd = mkstemp(path.data());
        if (fd < 0) return;
        std::vector<std::uint8_t> data(bytes);
        for (std::size_t i = 0; i < bytes; ++i) data[i] = byte_at(i);
        if (write(fd, data.data(), bytes) == static_cast<ssize_t>(bytes))
            base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
    }
    ~PatternMapping() {
        if (base != MAP_FAILED) munmap(base, size);
        if (!path.empty()) unlink(path.c_str());
    }
    std::byte* bytes() const { return static_cast<std::byte*>(base); }
};

bool matches(const std::vector<std::uint8_t>& got, std::uint64_t offset) {
    for (std::size_t i = 0; i < got.size(); ++i)
        if (got[i] != byte_at(offset + i)) return false;
    return true;
}

int gpu_part(wm::Importer& cuda) {
    const std::uint64_t page = cuda.caps().alignment;
    PatternMapping file(64 * page);
    check(file.base != MAP_FAILED, "a read-only file mapping");
    if (failures != 0) return 1;
    auto imported = cuda.import(file.bytes() + page, 32 * page);
    check(imported.ok(), "cuMemHostRegister of a PROT_READ MAP_SHARED file range",
          imported.ok() ? "" : imported.error().message);
    if (imported.ok()) {
        std::vector<std::uint8_t> got(32 * page);
        wm::Status read = cuda.read_back(imported.value(), 0, got.size(), got.data());
        check(read.ok() && matches(got, page), "every byte reads back through the device",
              read.ok() ? "" : read.error().message);
        check(cuda.release(imported.value()).ok(), "cuMemHostUnregister");
    }
    auto copy = cuda.allocate_copy(file.bytes() + 77, 5000);
    check(copy.ok(), "cuMemAlloc + cuMemcpyHtoD", copy.ok() ? "" : copy.error().message);
    if (copy.ok()) {
        std::vector<std::uint8_t> got(5000);
        wm::Status read = cuda.read_back(copy.value(), 0, got.size(), got.data());
        check(read.ok() && matches(got, 77), "the copy reads back",
              read.ok() ? "" : read.error().message);
        check(cuda.free_copy(copy.value()).ok(), "cuMemFree");
    }
    return failures == 0 ? 0 : 1;
}

} // namespace

int main() {
    wm::CudaImporterParams params;
    params.library_path = "libcuda.so.1"; // the real one, whatever the environment says
    auto made = wm::make_cuda_importer(params);
    check(made.ok(), "make_cuda_importer with default params never fails",
          made.ok() ? "" : made.error().message);
    if (!made.ok()) return 1;
    const wm::Availability availability = made.value()->available();
    const wm::ImporterCaps caps = made.value()->caps();
    std::printf("available=%d reason='%s' device_memory=%s (%s) needs_writable_mapping=%d\n",
                availability.available, availability.reason.c_str(),
                wm::to_string(caps.device_memory), std::string(made.value()->notes().device_memory).c_str(),
                caps.needs_writable_mapping);
    if (caps.device_memory == wm::DeviceMemory::discrete && !availability.available) {
        check(availability.reason.find("discrete GPU") != std::string::npos,
              "a discrete device is unavailable for imports, saying why", availability.reason);
        params.allow_discrete = true; // the smoke test still exercises the driver
        made = wm::make_cuda_importer(params);
        if (!made.ok()) return 1;
    }
    wm::Importer& cuda = *made.value();
    if (!cuda.available().available) {
        check(!cuda.available().reason.empty(), "an unavailable importer says why");
        PatternMapping file(static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
        auto refused = cuda.import(file.base, file.size);
        check(!refused.ok() && refused.error().kind == wm::ErrorKind::unsupported,
              "an import is refused as unsupported",
              refused.ok() ? "it was registered" : refused.error().message);
        if (refused.ok()) (void)cuda.release(refused.value());
        if (failures != 0) return 1;
        std::printf("SKIP: no usable NVIDIA driver or GPU: %s\n",
                    cuda.available().reason.c_str());
        return exit_skip;
    }
    return gpu_part(cuda);
}
