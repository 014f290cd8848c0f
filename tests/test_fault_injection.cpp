// SPDX-License-Identifier: MIT
// Fault injection over a whole load: for every N, fail the N-th import, the N-th release, hand
// back a misaligned pointer at the N-th import, or fail the N-th mmap / mlock / mprotect. Each
// load either succeeds with the right fallbacks or fails cleanly; either way no lock, mapping or
// file descriptor is left behind, the model files' bytes are unchanged, and every tensor that
// was placed reads back correct.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fstream>
#include <sys/mman.h>

#include <fmt/format.h>

#include "fakes/fake_importers.hpp"
#include "internal/sys_hooks.hpp"
#include "support/sys_hooks_guard.hpp"
#include "support/temp_file.hpp"
#include "weightmap/loader.hpp"
#include "weightmap/memstat.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::FakeImporter;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

int open_fds() {
    int n = 0;
    DIR* d = opendir("/proc/self/fd");
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

int mappings_of(const std::vector<std::string>& paths) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line))
        for (const auto& p : paths) n += line.find(p) != std::string::npos;
    return n;
}

// Fails the N-th call of one system call; counts the rest.
struct SysFaults {
    static inline int fail_map_at = 0, fail_lock_at = 0, fail_protect_at = 0;
    static inline int maps = 0, locks = 0, protects = 0;
    static void reset(int map_at, int lock_at, int protect_at) {
        fail_map_at = map_at;
        fail_lock_at = lock_at;
        fail_protect_at = protect_at;
        maps = locks = protects = 0;
    }
    static void* map(void* a, std::size_t l, int p, int f, int fd, off_t o) {
        if (++maps == fail_map_at) {
            errno = ENOMEM;
            return MAP_FAILED;
        }
        return internal::libc_syscalls().map(a, l, p, f, fd, o);
    }
    static int lock(const void* a, std::size_t l) {
        if (++locks == fail_lock_at) {
            errno = EAGAIN;
            return -1;
        }
        return internal::libc_syscalls().lock(a, l);
    }
    static int protect(void* a, std::size_t l, int prot) {
        if (++protects == fail_protect_at) {
            errno = EACCES;
            return -1;
        }
        return internal::libc_syscalls().protect(a, l, prot);
    }
};

struct Model {
    wm::test::TempFile a{12 * MiB + 77}, b{9 * MiB}, c{5 * MiB + 4096};
    std::vector<std::string> paths{a.path(), b.path(), c.path()};
    std::vector<std::uint64_t> hashes;
    Model() {
        for (const auto& p : paths) hashes.push_back(wm::test::hash_file(p));
    }
    // Two device targets sharing one importer, CPU experts interleaved: several regions and
    // several runs per region, so every N hits a different import.
    ModelDesc describe(const ImporterCaps& device) const {
        ModelDesc m;
        m.files = {{paths[0], 0}, {paths[1], 0}, {paths[2], 0}};
        m.targets = {TargetDesc{"GPU0", "dev", device}, TargetDesc{"GPU0-host", "dev", device},
                     TargetDesc{"CPU", "cpu", {}}};
        m.targets[2].caps.is_cpu = true;
        std::uint32_t n = 0;
        for (std::uint32_t f = 0; f < 3; ++f) {
            std::uint64_t size = f == 0 ? 12 * MiB : f == 1 ? 9 * MiB : 5 * MiB;
            for (std::uint64_t off = 0; off + 700 * 1024 <= size; off += 1536 * 1024) {
                std::uint32_t target = n % 3 == 2 ? 2 : n % 3;
                m.tensors.push_back({fmt::format("t{}", n), f, off + 333, 700 * 1024, target});
                // A CPU expert block between device tensors breaks the gate: runs.
                m.tensors.push_back({fmt::format("x{}", n), f, off + 700 * 1024 + 512,
                                     800 * 1024, 2});
                ++n;
            }
        }
        return m;
    }
};

// Everything that was placed reads back the file's bytes; nothing is left behind after unload.
void check_placed_tensors(const LoadedModel& loaded) {
    const ModelDesc& m = loaded.model();
    for (std::uint32_t i = 0; i < m.tensors.size(); ++i) {
        const TensorDesc& t = m.tensors[i];
        TensorLocation where = loaded.locate(i);
        const auto* bytes = reinterpret_cast<const unsigned char*>(where.host_address);
        REQUIRE(bytes[0] == wm::test::pattern_byte(t.offset));
        REQUIRE(bytes[t.size - 1] == wm::test::pattern_byte(t.offset + t.size - 1));
        if (where.imported) {
            const auto* via_import =
                static_cast<const unsigned char*>(where.buffer->host_address) + where.offset_in_buffer;
            REQUIRE(via_import == bytes);
        }
    }
}

struct Baseline {
    int fds;
    std::optional<std::uint64_t> vm_lck;
};
Baseline baseline() { return {open_fds(), read_memstat().vm_lck}; }

void check_nothing_left(const Model& model, const Baseline& before, const FakeImporter& device) {
    CHECK(device.live_imports() == 0);
    CHECK(mappings_of(model.paths) == 0);
    CHECK(open_fds() == before.fds);
    CHECK(read_memstat().vm_lck == before.vm_lck);
    for (std::size_t i = 0; i < model.paths.size(); ++i)
        CHECK(wm::test::hash_file(model.paths[i]) == model.hashes[i]);
}

ImporterCaps device_caps() {
    ImporterCaps caps = wm::test::device_caps(4096, /*needs_writable=*/true);
    caps.survives_read_only_reprotect = true;
    return caps;
}
} // namespace

TEST_CASE("fault injection: the N-th import, release or returned pointer goes wrong",
          "[fault]") {
    Model model;
    ImporterCaps caps = device_caps();
    // How many imports a clean load makes: every N up to it (and one past) is a case.
    std::uint64_t clean_imports = 0;
    {
        FakeImporter device("dev", caps);
        auto cpu = make_cpu_importer();
        std::vector<Importer*> importers{&device, &device, cpu.get()};
        LoadOptions o;
        o.plan.import_enabled = true;
        auto loaded = load_model(model.describe(caps), importers, o);
        REQUIRE(loaded.ok());
        clean_imports = device.imports().size();
        REQUIRE(clean_imports >= 6);
        CHECK(loaded->placement().plan().totals.fallback_bytes == 0);
    }
    int cases = 0;
    for (int kind = 0; kind < 3; ++kind) {
        for (std::uint64_t n = 1; n <= clean_imports + 1; ++n) {
            Baseline before = baseline();
            FakeImporter device("dev", caps);
            device.reject_read_only = true;
            device.reject_unaligned = true;
            if (kind == 0) device.fail_import_at = n;
            if (kind == 1) device.fail_release_at = n;
            auto cpu = make_cpu_importer();
            std::vector<Importer*> importers{&device, &device, cpu.get()};
            LoadOptions o;
            o.plan.import_enabled = true;
            o.execute.log = [](LogLevel, std::string_view) {};
            if (kind == 2) device.misalign_result_by = 0; // set below for the N-th only
            INFO("kind " << kind << " n " << n);
            {
                struct MisalignNth : FakeImporter {
                    using FakeImporter::FakeImporter;
                    std::uint64_t nth = 0, calls = 0;
                    Result<ImportedBuffer> import_checked(void* p, std::uint64_t s) override {
                        misalign_result_by = ++calls == nth ? 64 : 0;
                        return FakeImporter::import_checked(p, s);
                    }
                } misaligning("dev", caps);
                misaligning.nth = n;
                if (kind == 2) importers = {&misaligning, &misaligning, cpu.get()};
                auto loaded = load_model(model.describe(caps), importers, o);
                REQUIRE(loaded.ok()); // import faults are fallbacks, never load failures
                const Plan& plan = loaded->placement().plan();
                if (kind != 1 && n <= clean_imports) {
                    // Exactly the run of the failed import falls back; the others stay live.
                    std::uint64_t device_runs = 0, refused = 0;
                    for (const PlanRegion& r : plan.regions)
                        if (!loaded->model().targets[r.target].caps.is_cpu)
                            device_runs += r.runs.size();
                    CHECK(device_runs == clean_imports - 1);
                    CHECK((kind == 2 ? misaligning : device).live_imports() ==
                          static_cast<std::int64_t>(clean_imports - 1));
                    for (const TensorPlacement& place : plan.tensors) {
                        if (place.run != no_index) continue;
                        ++refused;
                        CHECK_THAT(place.reason, Catch::Contains(kind == 0 ? "injected failure"
                                                                           : "returned"));
                    }
                    CHECK(refused > 0);
                    CHECK(plan.totals.fallback_bytes > 0);
                } else {
                    CHECK(plan.totals.fallback_bytes == 0);
                }
                check_placed_tensors(loaded.value());
                loaded->unload();
                CHECK(misaligning.live_imports() == 0);
            }
            check_nothing_left(model, before, device);
            ++cases;
        }
    }
    // The log line the note reports.
    WARN("import/release/misalign fault cases run: " << cases);
}

TEST_CASE("fault injection: the N-th mmap, mlock or mprotect fails", "[fault]") {
    Model model;
    ImporterCaps caps = device_caps();
    internal::SysCalls table = internal::libc_syscalls();
    table.map = &SysFaults::map;
    table.lock = &SysFaults::lock;
    table.protect = &SysFaults::protect;
    wm::test::SysCallsGuard hooks(table); // libc's again however the case ends
    int cases = 0, failed_cleanly = 0;
    for (int kind = 0; kind < 3; ++kind) {
        for (int n = 1; n <= 4; ++n) {
            Baseline before = baseline();
            SysFaults::reset(kind == 0 ? n : 0, kind == 1 ? n : 0, kind == 2 ? n : 0);
            FakeImporter device("dev", caps);
            device.reject_read_only = true;
            auto cpu = make_cpu_importer();
            std::vector<Importer*> importers{&device, &device, cpu.get()};
            LoadOptions o;
            o.plan.import_enabled = true;
            o.mapping.lock = true;
            o.execute.log = [](LogLevel, std::string_view) {};
            INFO("kind " << kind << " n " << n);
            {
                auto loaded = load_model(model.describe(caps), importers, o);
                if (kind == 2) {
                    // mprotect runs after importing: the load succeeds; when it fails the
                    // mapping stays writable and the note names the system call.
                    REQUIRE(loaded.ok());
                    CHECK(loaded->read_only() == (n > 3));
                    if (n <= 3) CHECK_THAT(loaded->reprotect_note(), Catch::Contains("mprotect"));
                    check_placed_tensors(loaded.value());
                } else if (n <= 3) {
                    REQUIRE_FALSE(loaded.ok());
                    CHECK_THAT(loaded.error().message,
                               Catch::Contains(model.paths[static_cast<std::size_t>(n - 1)]) &&
                                   Catch::Contains(kind == 0 ? "mmap" : "mlock"));
                    CHECK(device.imports().empty());
                    ++failed_cleanly;
                } else {
                    REQUIRE(loaded.ok()); // only 3 files: the 4th call never happens
                    check_placed_tensors(loaded.value());
                }
            }
            check_nothing_left(model, before, device);
            ++cases;
        }
    }
    WARN("mmap/mlock/mprotect fault cases run: " << cases << ", failed cleanly: " << failed_cleanly);
}
