// SPDX-License-Identifier: MIT
// Proves the fake runtime's leak check bites: this program leaks a lock on purpose (it leaks the
// importer, so its destructor never unlocks) and returns 0. The fake's unload-time check must turn
// that into exit status 1; meson runs it with should_fail, so a silent leak check fails the suite.
// Every path that does not reach the leak returns 0 too, so it cannot pass by accident.
#include <cstdio>

#include <sys/mman.h>
#include <unistd.h>

#include "weightmap/backends/hsa.hpp"

int main() {
    wm::HsaImporterParams params;
    params.library_path = WEIGHTMAP_FAKE_HSA_PATH;
    auto made = wm::make_hsa_importer(params);
    if (!made || !made.value()->available().available) {
        std::puts("the fake runtime did not load: nothing to leak");
        return 0;
    }
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 0;
    auto locked = made.value()->import(p, page);
    if (!locked) {
        std::printf("lock failed: %s\n", locked.error().message.c_str());
        return 0;
    }
    made.value().release(); // leaked on purpose: the lock outlives everything
    std::puts("leaked one lock; the fake must now fail the process at unload");
    return 0;
}
