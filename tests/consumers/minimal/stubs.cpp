// SPDX-License-Identifier: MIT
// Links against a library built with -Dvulkan=disabled -Dhsa=disabled -Dcuda=disabled: the
// backend headers' factories must still resolve, and say why they cannot help. Exits 1 on any failed check.
#include <cstdio>
#include <string>

#include <weightmap/backends/cuda.hpp>
#include <weightmap/backends/hsa.hpp>
#include <weightmap/registry.hpp>
#if __has_include(<vulkan/vulkan_core.h>) // the library compiled its Vulkan stub too
#include <weightmap/backends/vulkan.hpp>
#define CHECK_VULKAN 1
#endif

namespace {

int failures = 0;

void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "FAIL: %s\n", what);
        ++failures;
    }
}

template <class T>
void check_built_without(const wm::Result<T>& result, const char* what) {
    const bool ok = !result.ok() && result.error().kind == wm::ErrorKind::unsupported &&
                    result.error().message.find("built without") != std::string::npos;
    if (!result.ok()) std::printf("%s: %s\n", what, result.error().message.c_str());
    check(ok, what);
}

} // namespace

int main() {
    static_assert(__cplusplus == 201703L, "this consumer must be compiled as C++17");
    check_built_without(wm::make_hsa_importer(), "make_hsa_importer");
    check_built_without(wm::make_cuda_importer(), "make_cuda_importer");
    wm::Placement placement;
    auto cpu = wm::make_cpu_importer();
    check_built_without(wm::cuda_pin_fallbacks(*cpu, placement, {}, {}), "cuda_pin_fallbacks");
#ifdef CHECK_VULKAN
    check_built_without(wm::make_vulkan_importer({}), "make_vulkan_importer");
#else
    std::printf("no Vulkan headers: make_vulkan_importer not checked\n");
#endif
    for (const wm::ImporterEntry& entry : wm::importer_registry())
        check(entry.built == (entry.name == "cpu"), "only the CPU importer is built");
    auto chosen = wm::create_importer("auto");
    check(chosen.ok() && chosen.value()->name() == "cpu", "auto picks the CPU importer");
    std::printf("%s: %d failed checks\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
