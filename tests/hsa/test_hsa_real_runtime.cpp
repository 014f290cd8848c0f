// SPDX-License-Identifier: MIT
// Smoke test against the real libhsa-runtime64.so.1, through the public API alone.
//   * Without /dev/kfd (CI, containers, machines without an AMD GPU): the importer must exist,
//     report available() == false with a non-empty reason, and refuse an import; then the GPU
//     part is skipped (exit 77, which meson reports as SKIP). A failed check exits 1 first.
//   * With /dev/kfd and a GPU agent: lock and unlock a page-aligned range of a MAP_SHARED
//     writable file mapping; lock a PROT_READ mapping, which a runtime may accept (KFD takes
//     file-backed pages) or refuse, and then must refuse saying "refused a read-only lock" (the
//     marker load_model's writable retry answers); lock an unaligned range through
//     hsa_lock_superset.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support/smoke_check.hpp"
#include "weightmap/backends/hsa.hpp"

namespace {

using wm::test::smoke::check;
using wm::test::smoke::exit_skip;
using wm::test::smoke::failures;

// A MAP_SHARED mapping of a fresh temporary file of `size` bytes.
struct TempMapping {
    std::string path;
    void* base = MAP_FAILED;
    std::size_t size = 0;
    TempMapping(std::size_t bytes, bool writable) : size(bytes) {
        const char* dir = std::getenv("TMPDIR");
        path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
               "/weightmap-hsa-smoke-XXXXXX";
        int fd = mkstemp(path.data());
        if (fd < 0) return;
        if (ftruncate(fd, static_cast<off_t>(bytes)) == 0)
            base = mmap(nullptr, bytes, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
        close(fd);
    }
    ~TempMapping() {
        if (base != MAP_FAILED) munmap(base, size);
        if (!path.empty()) unlink(path.c_str());
    }
    std::byte* bytes() const { return static_cast<std::byte*>(base); }
};

int gpu_part(wm::Importer& hsa) {
    const std::uint64_t page = hsa.caps().alignment;
    TempMapping rw(16 * page, true), ro(4 * page, false);
    check(rw.base != MAP_FAILED && ro.base != MAP_FAILED, "temporary mappings");
    if (failures != 0) return 1;

    auto locked = hsa.import(rw.bytes() + page, 4 * page);
    check(locked.ok(), "hsa_amd_memory_lock of a writable MAP_SHARED range",
          locked.ok() ? "" : locked.error().message);
    if (locked.ok()) {
        check(locked->device_address != nullptr, "the agent pointer is set");
        wm::Status unlocked = hsa.release(locked.value());
        check(unlocked.ok(), "hsa_amd_memory_unlock", unlocked.ok() ? "" : unlocked.error().message);
    }

    auto read_only = hsa.import(ro.base, page);
    std::printf("note: this runtime %s a read-only lock\n", read_only.ok() ? "accepts" : "refuses");
    check(read_only.ok() ||
              read_only.error().message.find(wm::read_only_refusal_marker) != std::string::npos,
          "a PROT_READ mapping is locked, or refused as a read-only lock",
          read_only.ok() ? "" : read_only.error().message);
    if (read_only.ok()) check(hsa.release(read_only.value()).ok(), "its unlock");

    auto superset = wm::hsa_lock_superset(hsa, rw.bytes() + 3 * page + 100, 2 * page);
    check(superset.ok() && superset->delta() == 100, "hsa_lock_superset of an unaligned range",
          superset.ok() ? "" : superset.error().message);
    if (superset.ok()) check(superset->release().ok(), "its unlock");
    return failures == 0 ? 0 : 1;
}

} // namespace

int main() {
    const bool have_kfd = access("/dev/kfd", F_OK) == 0;
    wm::HsaImporterParams params;
    params.library_path = "libhsa-runtime64.so.1"; // the real one, whatever the environment says

    const auto start = std::chrono::steady_clock::now();
    auto made = wm::make_hsa_importer(params);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    check(made.ok(), "make_hsa_importer with default agents never fails",
          made.ok() ? "" : made.error().message);
    if (!made.ok()) return 1;
    wm::Importer& hsa = *made.value();
    const wm::Availability availability = hsa.available();
    std::printf("dlopen + hsa_init + agents took %.1f ms; available=%d reason='%s'\n", ms,
                availability.available, availability.reason.c_str());

    if (!have_kfd) {
        check(!availability.available, "without /dev/kfd the importer is not available");
        check(!availability.reason.empty(), "and it says why", availability.reason);
        TempMapping rw(4 * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), true);
        auto refused = hsa.import(rw.base, rw.size);
        check(!refused.ok() && refused.error().kind == wm::ErrorKind::unsupported,
              "an import is refused as unsupported",
              refused.ok() ? "it was locked" : refused.error().message);
        if (refused.ok()) (void)hsa.release(refused.value());
        if (failures != 0) return 1;
        std::printf("SKIP: no /dev/kfd, so no GPU part (the unavailable contract held)\n");
        return exit_skip;
    }
    if (!availability.available) {
        check(!availability.reason.empty(), "an unavailable importer says why", availability.reason);
        if (failures != 0) return 1;
        std::printf("SKIP: /dev/kfd exists but the runtime is not usable here: %s\n",
                    availability.reason.c_str());
        return exit_skip;
    }
    return gpu_part(hsa);
}
