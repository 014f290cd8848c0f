// SPDX-License-Identifier: MIT
// The mapping policy with HSA, as ROCm behaves: read-only first. A runtime that accepts
// read-only pages imports from a read-only mapping and no file is ever opened O_RDWR; one that
// refuses them has its regions copied, the model file left clean (a lock write-faults every page
// of a writable mapping: the fake does what KFD does), unless LoadOptions::writable_retry asks
// for the writable mapping, under the rules (the caller owns the file, it has the owner-write
// bit, the reopen is the same inode), or its regions stay copies saying why.
// A locked range is never mprotected or munmapped (the syscall hooks watch every call against
// the fake's live locks). The registry's HSA importer loads the fake via WEIGHTMAP_HSA_LIBRARY.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <vector>

#include "hsa/fake_hsa.hpp"
#include "support/dirty_pages.hpp"
#include "internal/sys_hooks.hpp"
#include "support/child.hpp"
#include "support/skip.hpp"
#include "support/sys_hooks_guard.hpp"
#include "support/temp_file.hpp"
#include "weightmap/loader.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/registry.hpp"

using namespace wm;

namespace {
// The registry's HSA importer loads the fake runtime. The fake stays loaded meanwhile (FakeHsa
// holds it): its state is a deliberate process-lifetime singleton, and every dlclose + dlopen
// of the library would allocate a new one, which LeakSanitizer rightly reports.
struct FakeRuntimeForTheRegistry {
    wm::test::FakeHsa loaded;
    FakeRuntimeForTheRegistry() { setenv("WEIGHTMAP_HSA_LIBRARY", WEIGHTMAP_FAKE_HSA_PATH, 1); }
    ~FakeRuntimeForTheRegistry() { unsetenv("WEIGHTMAP_HSA_LIBRARY"); }
};
} // namespace

TEST_CASE("no importer list: the registry's HSA importer keeps the mapping read-only",
          "[mapping][hsa]") {
    FakeRuntimeForTheRegistry fake;
    auto hsa = create_importer("hsa");
    REQUIRE(hsa.ok()); // the fake runtime is what the registry found
    // Read-only first: HSA goes writable only after its runtime refused (load_model's retry).
    REQUIRE_FALSE(hsa.value()->caps().needs_writable_mapping);

    wm::test::TempFile a(8192), b(4096);
    std::vector<std::string> paths{a.path(), b.path()};
    MappingDecision d = decide_mapping(paths, {});
    CHECK(d.access == MappingAccess::read_only);
    CHECK(d.unwritable_path.empty());
}

TEST_CASE("every registry entry's static caps agree with its importer's", "[registry][hsa]") {
    FakeRuntimeForTheRegistry fake;
    for (const ImporterEntry& entry : importer_registry()) {
        if (!entry.built) continue;
        INFO(entry.name);
        auto importer = entry.create_default();
        REQUIRE(importer != nullptr);
        // decide_mapping skips entries without the static cap: one whose importer does need a
        // writable mapping would silently keep HSA-style imports failing.
        if (importer->caps().needs_writable_mapping) CHECK(entry.may_need_writable_mapping);
    }
}

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// What the library asked of the kernel while a Watch was installed.
struct Watch {
    static inline std::mutex mutex;
    static inline const wm::test::FakeHsa* fake = nullptr;
    static inline std::vector<std::string> opens; // "path flags"
    static inline int read_write_opens = 0, proc_reopens = 0, plain_read_write_opens = 0;
    static inline int protects_of_locked = 0, unmaps_of_locked = 0, unmaps = 0;

    static int open_file(const char* path, int flags) {
        std::lock_guard<std::mutex> guard(mutex);
        const bool proc = std::strncmp(path, "/proc/self/fd/", 14) == 0;
        const bool rw = (flags & O_ACCMODE) != O_RDONLY;
        read_write_opens += rw;
        proc_reopens += proc;
        plain_read_write_opens += rw && !proc;
        return wm::internal::libc_syscalls().open_file(path, flags);
    }
    static int protect(void* address, std::size_t length, int prot) {
        if (fake->overlaps_lock(address, length)) ++protects_of_locked;
        return wm::internal::libc_syscalls().protect(address, length, prot);
    }
    static int unmap(void* address, std::size_t length) {
        ++unmaps;
        if (fake->overlaps_lock(address, length)) ++unmaps_of_locked;
        return wm::internal::libc_syscalls().unmap(address, length);
    }
    wm::internal::SysCalls table = wm::internal::libc_syscalls();
    wm::test::SysCallsGuard guard{install(table)};
    explicit Watch(const wm::test::FakeHsa& f) {
        fake = &f;
        read_write_opens = proc_reopens = plain_read_write_opens = protects_of_locked = unmaps_of_locked = unmaps = 0;
    }
    static const wm::internal::SysCalls& install(wm::internal::SysCalls& t) {
        t.open_file = &open_file;
        t.protect = &protect;
        t.unmap = &unmap;
        return t;
    }
};

// Two files; GPU tensors in both, one CPU tensor between.
struct TwoFiles {
    wm::test::TempDir dir;
    std::string a = make(dir.path() + "/m-1.gguf", 6 * MiB + 100);
    std::string b = make(dir.path() + "/m-2.gguf", 4 * MiB);
    static std::string make(const std::string& path, std::uint64_t size) {
        wm::test::TempFile f(size);
        REQUIRE(std::system(("cp " + f.path() + " " + path).c_str()) == 0);
        return path;
    }
    ModelDesc model(const Importer& gpu, const Importer& cpu) const {
        ModelDesc m;
        m.files = {{a, 0}, {b, 0}};
        m.targets = {target_for("ROCm0", gpu), target_for("CPU", cpu)};
        m.tensors = {{"a.gpu", 0, 4096, 2 * MiB, 0},
                     {"a.cpu", 0, 3 * MiB, MiB, 1},
                     {"b.gpu", 1, 0, 3 * MiB, 0}};
        return m;
    }
};

LoadOptions quiet_import() {
    LoadOptions o;
    o.plan.import_enabled = true;
    o.execute.log = [](LogLevel, std::string_view) {};
    return o;
}

LoadOptions writable_retry() {
    LoadOptions o = quiet_import();
    o.writable_retry = true;
    return o;
}

// A runtime that refuses read-only locks, the two files written back first (from then on, a
// dirty page of theirs is one the load made), and the syscall watch.
struct Refusing {
    wm::test::FakeHsa& fake = wm::test::FakeHsa::fresh();
    std::unique_ptr<Importer> hsa = (fake.set_refuse_read_only(true), fake.importer());
    std::unique_ptr<Importer> cpu = make_cpu_importer();
    TwoFiles files;
    bool written_back = wm::test::write_back(files.a);
    std::int64_t mtime = wm::test::mtime_ns_of(files.a);
    std::vector<Importer*> importers{hsa.get(), cpu.get()};
    Watch watch{fake};

    Result<LoadedModel> load(const LoadOptions& options) {
        return load_model(files.model(*hsa, *cpu), importers, options);
    }
};
} // namespace

TEST_CASE("a runtime that accepts read-only locks imports on a read-only mapping; nothing is "
          "opened O_RDWR", "[hsa][loader]") {
    wm::test::FakeHsa& fake = wm::test::FakeHsa::fresh();
    auto hsa = fake.importer();
    auto cpu = make_cpu_importer();
    TwoFiles files;
    std::vector<Importer*> importers{hsa.get(), cpu.get()};
    Watch watch(fake);
    {
        auto loaded = load_model(files.model(*hsa, *cpu), importers, quiet_import());
        REQUIRE(loaded.ok());
        CHECK(loaded->mapping_decision().access == MappingAccess::read_only);
        CHECK(loaded->read_only());
        CHECK(loaded->placement().plan().totals.fallback_bytes == 0);
        CHECK(fake.live_locks() == 2);
    }
    CHECK(fake.live_locks() == 0);
    CHECK(Watch::read_write_opens == 0);
    CHECK(Watch::proc_reopens == 0);
    CHECK(Watch::protects_of_locked == 0);
    CHECK(Watch::unmaps_of_locked == 0);
}

TEST_CASE("a runtime that refuses read-only locks: its regions are copied and the model file "
          "stays clean", "[hsa][loader]") {
    Refusing r;
    REQUIRE(r.written_back);
    {
        auto loaded = r.load(quiet_import());
        REQUIRE(loaded.ok());
        const MappingDecision& d = loaded->mapping_decision();
        CHECK(d.access == MappingAccess::read_only);
        CHECK_THAT(d.reason, Catch::Contains("would dirty the model file") &&
                                 Catch::Contains("writable_retry"));
        CHECK(loaded->placement().plan().totals.imported_bytes == 0);
        CHECK(r.fake.live_locks() == 0);
        CHECK(wm::test::dirty_kib_of(r.files.a) == 0);
    }
    CHECK(wm::test::mtime_ns_of(r.files.a) == r.mtime);
    CHECK(Watch::read_write_opens == 0);
}

TEST_CASE("under writable_retry a refusing runtime imports from a writable mapping, and the lock "
          "dirties the model file (why the retry is off by default)", "[hsa][loader]") {
    Refusing r;
    REQUIRE(r.written_back);
    wm::test::FakeHsa& fake = r.fake;
    {
        auto loaded = r.load(writable_retry());
        CHECK(wm::test::dirty_kib_of(r.files.a) > 0); // the fake's write faults, as KFD's
        REQUIRE(loaded.ok());
        const MappingDecision& d = loaded->mapping_decision();
        CHECK(d.access == MappingAccess::writable);
        CHECK_THAT(d.reason, Catch::Contains("'hsa'") &&
                                 Catch::Contains(std::string(read_only_refusal_marker)));
        CHECK(loaded->mapping().access() == MappingAccess::writable);
        CHECK(loaded->placement().plan().totals.fallback_bytes == 0);
        CHECK(fake.live_locks() == 2);
        CHECK(fake.lock_calls() == 4); // two refused read-only, two locked writable
        // HSA's locks forbid the re-protect: the mapping stays writable, and says why.
        CHECK_FALSE(loaded->read_only());
        CHECK_THAT(loaded->reprotect_note(), Catch::Contains("left writable"));
    }
    CHECK(fake.live_locks() == 0);
    // Writable descriptors came only from the rules' reopen through /proc/self/fd.
    CHECK(Watch::read_write_opens >= 2);
    CHECK(Watch::plain_read_write_opens == 0);
    CHECK(Watch::protects_of_locked == 0);
    CHECK(Watch::unmaps_of_locked == 0);
}

TEST_CASE("a refusing runtime on root-owned 0444 files: the rules keep them read-only and the "
          "regions fall back saying why", "[hsa][loader]") {
    wm::test::FakeHsa& fake = wm::test::FakeHsa::fresh();
    fake.set_refuse_read_only(true);
    auto hsa = fake.importer();
    auto cpu = make_cpu_importer();
    TwoFiles files;
    REQUIRE(chmod(files.a.c_str(), 0444) == 0); // owned by this process's uid (root in CI)
    std::vector<Importer*> importers{hsa.get(), cpu.get()};
    Watch watch(fake);
    auto loaded = load_model(files.model(*hsa, *cpu), importers, writable_retry());
    REQUIRE(loaded.ok());
    const MappingDecision& d = loaded->mapping_decision();
    CHECK(d.access == MappingAccess::read_only);
    CHECK(d.unwritable_path == files.a);
    CHECK_THAT(d.reason, Catch::Contains(std::string(read_only_refusal_marker)) &&
                             Catch::Contains("owner-write") && Catch::Contains(files.a));
    CHECK(loaded->read_only());
    CHECK(loaded->placement().plan().totals.imported_bytes == 0);
    const TensorLocation gpu = loaded->locate(0);
    CHECK_FALSE(gpu.imported);
    CHECK_THAT(std::string(gpu.reason), Catch::Contains(std::string(read_only_refusal_marker)));
    CHECK(fake.live_locks() == 0);
    CHECK(Watch::read_write_opens == 0);
}

TEST_CASE("a refusing runtime with one shard on a read-only mount: every region stays a copy",
          "[hsa][loader][may_skip]") {
    wm::test::TempDir ro_dir;
    TwoFiles files;
    const std::string ro_path = ro_dir.path() + "/m-2.gguf";
    REQUIRE(std::system(("cp " + files.b + " " + ro_path).c_str()) == 0);
    // Root passes every permission check: only a read-only mount shows the rule's reopen to root.
    auto child = wm::test::run_in_child([&] {
        if (!wm::test::remount_read_only_in_private_namespace(ro_dir.path())) return 77;
        wm::test::FakeHsa& fake = wm::test::FakeHsa::fresh();
        fake.set_refuse_read_only(true);
        auto hsa = fake.importer();
        auto cpu = make_cpu_importer();
        ModelDesc model = files.model(*hsa, *cpu);
        model.files[1].path = ro_path;
        std::vector<Importer*> importers{hsa.get(), cpu.get()};
        auto loaded = load_model(model, importers, writable_retry());
        if (!loaded) return 1;
        const MappingDecision& d = loaded->mapping_decision();
        if (d.access != MappingAccess::read_only) return 2;
        if (d.unwritable_path != ro_path) return 3;
        if (d.reason.find("Read-only file system") == std::string::npos) return 4;
        if (loaded->placement().plan().totals.imported_bytes != 0) return 5;
        return 0;
    });
    REQUIRE(child.exited);
    if (child.code == 77)
        return wm::test::skip("unshare(CLONE_NEWNS) is not permitted here (a read-only mount)");
    CHECK(child.code == 0);
}

TEST_CASE("a locked range is never mprotected or munmapped, whatever the caller's order",
          "[hsa][mapping]") {
    wm::test::FakeHsa& fake = wm::test::FakeHsa::fresh();
    fake.set_refuse_read_only(true); // the writable mapping, where a re-protect could happen
    auto hsa = fake.importer();
    auto cpu = make_cpu_importer();
    TwoFiles files;
    ModelDesc model = files.model(*hsa, *cpu);
    model.files[0].size = 6 * MiB + 100; // make_plan needs them; load_model reads them itself
    model.files[1].size = 4 * MiB;
    std::vector<Importer*> importers{hsa.get(), cpu.get()};
    std::vector<std::string> paths{files.a, files.b};
    PlanOptions plan_options;
    plan_options.import_enabled = true;
    auto plan = make_plan(model, plan_options);
    REQUIRE(plan.ok());
    Watch watch(fake);
    auto mapped = MappedModel::open(paths, MappingAccess::writable);
    REQUIRE(mapped.ok());
    const std::vector<MappedFile> views(mapped->files().begin(), mapped->files().end());
    auto placed = execute_plan(model, plan.value(), views, importers);
    REQUIRE(placed.ok());
    REQUIRE(fake.live_locks() == 2);

    // wm_mapped_model_make_read_only's path: refused before any mprotect.
    Status reprotect = mapped->make_read_only();
    CHECK_FALSE(reprotect.ok());
    CHECK_THAT(reprotect.error().message, Catch::Contains("locked by the hsa importer"));
    // The mapping destroyed before the placement (a caller's mistake): the locked files stay
    // mapped; the device may still read them.
    const int unmaps_before = Watch::unmaps;
    mapped = MappedModel();
    CHECK(Watch::unmaps == unmaps_before); // both files hold a lock
    CHECK(views[0].base[4096] == std::byte{wm::test::pattern_byte(4096)}); // still readable
    placed->release_all();
    CHECK(fake.live_locks() == 0);
    CHECK(Watch::protects_of_locked == 0);
    CHECK(Watch::unmaps_of_locked == 0);
    for (const MappedFile& f : views) munmap(f.base, f.length); // the test owns the leftovers
}
