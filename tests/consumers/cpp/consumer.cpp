// SPDX-License-Identifier: MIT
// An engine's use of libweightmap through the C++ API, compiled as C++17 (as llama.cpp is) from
// outside the tree: by CMake from an installed prefix (cpp17_cmake/) and by a Meson project with
// our tree as its subproject (meson_subproject/). Plans a small model, checks the totals
// against its own arithmetic, executes the plan with CPU importers over an anonymous mapping
// and checks where every tensor landed. Exits 1 on any failed check.
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <weightmap/backends/hsa.hpp>
#include <weightmap/executor.hpp>
#include <weightmap/planner.hpp>
#include <weightmap/registry.hpp>
#include <weightmap/version.h>

// Proves the standard was not raised behind the consumer's back (e.g. a subproject's c++20).
static_assert(__cplusplus == 201703L, "this consumer must be compiled as C++17");
static_assert(WM_VERSION_MAJOR == 0 && WM_VERSION_MINOR >= 2, "weightmap 0.2 or newer");

namespace {

int failures = 0;

void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "FAIL: %s\n", what);
        ++failures;
    }
}

constexpr std::uint32_t dev = 0; // a device-like target, served by a CPU importer
constexpr std::uint32_t cpu = 1;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// Five tensors in one 16-page file: three on the device in one tight cluster, two on the CPU.
wm::ModelDesc make_model(std::uint64_t page, const wm::Importer& cpu_importer) {
    wm::ModelDesc model;
    model.files = {{"consumer.gguf", 16 * page}};
    wm::ImporterCaps dev_caps;
    dev_caps.alignment = page;
    dev_caps.device_memory = wm::DeviceMemory::unified; // an APU: the default policy imports
    model.targets = {{"DEV", "dev", dev_caps}, wm::target_for("CPU", cpu_importer)};
    model.tensors = {
        {"blk.0.attn_q.weight", 0, 0, page * 3 / 4, dev},
        {"blk.0.attn_k.weight", 0, page, page + 100, dev},
        {"blk.0.ffn_up_exps.weight", 0, 3 * page, page / 2, cpu},
        {"blk.1.attn_q.weight", 0, 8 * page, 2 * page, dev},
        {"blk.1.ffn_up_exps.weight", 0, 12 * page + 64, 1000, cpu},
    };
    return model;
}

// What the planner must report: the device tensors form one run from page 0 to the end of the
// last one, rounded up to a page (the gaps are far below the 1 MiB merge gap).
wm::PlanTotals expected_totals(const wm::ModelDesc& model, std::uint64_t page, bool import) {
    wm::PlanTotals totals;
    std::uint64_t end = 0;
    for (const wm::TensorDesc& t : model.tensors) {
        if (t.target != dev) continue;
        totals.device_bytes += t.size;
        if (t.offset + t.size > end) end = t.offset + t.size;
    }
    if (!import) {
        totals.fallback_bytes = totals.device_bytes;
        return totals;
    }
    totals.imported_bytes = totals.device_bytes;
    totals.pinned_bytes = align_up(end, page);
    totals.imports = 1;
    return totals;
}

void check_totals(const wm::PlanTotals& got, const wm::PlanTotals& want, const char* which) {
    std::printf("%s: device %llu imported %llu pinned %llu fallback %llu imports %llu\n", which,
                static_cast<unsigned long long>(got.device_bytes),
                static_cast<unsigned long long>(got.imported_bytes),
                static_cast<unsigned long long>(got.pinned_bytes),
                static_cast<unsigned long long>(got.fallback_bytes),
                static_cast<unsigned long long>(got.imports));
    check(got.device_bytes == want.device_bytes, "device_bytes");
    check(got.imported_bytes == want.imported_bytes, "imported_bytes");
    check(got.pinned_bytes == want.pinned_bytes, "pinned_bytes");
    check(got.fallback_bytes == want.fallback_bytes, "fallback_bytes");
    check(got.imports == want.imports, "imports");
}

// Every tensor is imported in place: buffer + offset is the mapping + file offset, and the
// device (the CPU here) reads the file's bytes there.
void check_locations(const wm::Placement& placed, const wm::ModelDesc& model, std::byte* base) {
    for (std::uint32_t i = 0; i < model.tensors.size(); ++i) {
        const wm::TensorDesc& t = model.tensors[i];
        const wm::TensorLocation where = placed.locate(i);
        check(where.imported, "tensor imported");
        check(where.host_address == base + t.offset, "host address == base + offset");
        if (!where.imported || where.buffer == nullptr) continue;
        const auto* buffer_host = static_cast<const std::byte*>(where.buffer->host_address);
        check(buffer_host + where.offset_in_buffer == base + t.offset,
              "buffer host address + offset_in_buffer == base + offset");
        const auto* device = static_cast<const std::byte*>(where.buffer->device_address);
        check(device != nullptr && std::memcmp(device + where.offset_in_buffer, base + t.offset,
                                                t.size) == 0, "device bytes == file bytes");
        check(where.import_index < placed.import_count() &&
                  placed.import_at(where.import_index).buffer == where.buffer,
              "import_at(import_index) serves the tensor");
    }
}

// The imports list every tensor exactly once, and the device import is the planned extent.
void check_imports(const wm::Placement& placed, const wm::ModelDesc& model, std::byte* base,
                   std::uint64_t pinned) {
    std::vector<int> served(model.tensors.size(), 0);
    int device_imports = 0;
    for (std::size_t k = 0; k < placed.import_count(); ++k) {
        const wm::PlacedImport imp = placed.import_at(k);
        check(imp.buffer->host_address == base + imp.extent_offset,
              "import host address == base + extent offset");
        for (std::uint32_t t : imp.tensors) ++served[t];
        if (imp.target != dev) continue;
        ++device_imports;
        check(imp.extent_offset == 0 && imp.buffer->size == pinned, "device import extent");
    }
    check(device_imports == 1, "one device import");
    for (int n : served) check(n == 1, "each tensor served by one import");
}

// make_hsa_importer links whatever the build: a stub says "built without", the real one loads
// the runtime (here a library that does not exist, so nothing is initialised) and says why not.
void check_hsa_links() {
    wm::HsaImporterParams params;
    params.library_path = "libweightmap-consumer-no-such-hsa-runtime.so";
    auto hsa = wm::make_hsa_importer(params);
    if (hsa) {
        const wm::Availability a = hsa.value()->available();
        check(!a.available && !a.reason.empty(), "absent HSA runtime: unavailable, with a reason");
    } else {
        check(hsa.error().kind == wm::ErrorKind::unsupported &&
                  hsa.error().message.find("built without") != std::string::npos,
              "HSA stub: unsupported, built without");
    }
}

void run(std::uint64_t page) {
    std::unique_ptr<wm::Importer> dev_importer = wm::make_cpu_importer();
    std::unique_ptr<wm::Importer> cpu_importer = wm::make_cpu_importer();
    const wm::ModelDesc model = make_model(page, *cpu_importer);

    wm::PlanOptions off;
    off.import_enabled = false;
    auto control = wm::make_plan(model, off);
    check(control.ok(), "make_plan (import disabled)");
    if (control) check_totals(control->totals, expected_totals(model, page, false), "control");

    wm::PlanOptions on;
    on.import_enabled = true;
    auto plan = wm::make_plan(model, on);
    check(plan.ok(), "make_plan");
    if (!plan) return;
    const wm::PlanTotals want = expected_totals(model, page, true);
    check_totals(plan->totals, want, "plan");

    const std::uint64_t length = model.files[0].size;
    void* map = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    check(map != MAP_FAILED, "anonymous mmap");
    if (map == MAP_FAILED) return;
    auto* base = static_cast<std::byte*>(map);
    for (std::uint64_t i = 0; i < length; ++i) base[i] = static_cast<std::byte>(i * 7 + 3);
    {
        const std::vector<wm::MappedFile> files = {{base, length}};
        const std::vector<wm::Importer*> importers = {dev_importer.get(), cpu_importer.get()};
        auto placed = wm::execute_plan(model, std::move(plan).value(), files, importers);
        check(placed.ok(), "execute_plan");
        if (placed) {
            check_totals(placed->plan().totals, want, "executed");
            check_locations(placed.value(), model, base);
            check_imports(placed.value(), model, base, want.pinned_bytes);
        }
    } // the placement releases its imports before the mapping goes
    munmap(map, length);
}

} // namespace

int main() {
    run(wm::host_page_size());
    check_hsa_links();
    std::printf("%s: %d failed checks\n", failures ? "FAIL" : "ok", failures);
    return failures ? 1 : 0;
}
