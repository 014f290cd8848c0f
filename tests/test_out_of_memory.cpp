// SPDX-License-Identifier: MIT
// Out of memory on every acquire-then-record path: each call runs with its 1st, 2nd, ... N-th
// allocation failing (support/alloc_fault.hpp) until it runs untouched, and after each run
// nothing it acquired is left mapped, imported, open or owned, and no bad_alloc crossed an API
// that promises none (the format readers, the C API). A resource recorded in a container only
// after it was acquired leaked when that container's growth threw.
#include <catch2/catch.hpp>

#include <fstream>
#include <new>

#include <sys/mman.h>

#include "fakes/fake_importers.hpp"
#include "support/alloc_fault.hpp"
#include "support/sys_hooks_guard.hpp"
#include "support/temp_file.hpp"
#include "testkit/gguf_writer.hpp"
#include "testkit/safetensors_writer.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/formats.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/memstat.hpp"
#include "weightmap/registry.hpp"
#include "weightmap/weightmap.h"

using namespace wm;
using wm::test::open_fds;
using wm::test::fail_each_allocation;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

int mappings_of(const std::vector<std::string>& paths) {
    std::ifstream maps("/proc/self/maps");
    int n = 0;
    for (std::string line; std::getline(maps, line);)
        for (const std::string& p : paths) n += line.find(p) != std::string::npos;
    return n;
}

// Counts the mmaps and munmaps made through the syscall hooks.
struct MapCount {
    static inline int maps = 0, unmaps = 0;
    static void* map(void* a, std::size_t l, int p, int f, int fd, off_t o) {
        void* r = internal::libc_syscalls().map(a, l, p, f, fd, o);
        maps += r != MAP_FAILED;
        return r;
    }
    static int unmap(void* a, std::size_t l) {
        ++unmaps;
        return internal::libc_syscalls().unmap(a, l);
    }
};
} // namespace

TEST_CASE("MappedModel::open out of memory leaves no file mapped") {
    wm::test::TempFile a(MiB), b(MiB, ".b"), c(MiB, ".c");
    const std::vector<std::string> paths{a.path(), b.path(), c.path()};
    const std::uint64_t faults = fail_each_allocation(
        [&] { auto opened = MappedModel::open(paths, MappingAccess::read_only, {}); },
        [&] { CHECK(mappings_of(paths) == 0); });
    CHECK(faults > 3);
}

TEST_CASE("the CPU importer's copy out of memory unmaps it and reports out_of_memory") {
    auto cpu = make_cpu_importer();
    std::vector<std::byte> source(MiB, std::byte{7});
    internal::SysCalls table = internal::libc_syscalls();
    table.map = &MapCount::map;
    table.unmap = &MapCount::unmap;
    wm::test::SysCallsGuard hooks(table);
    bool threw = false;
    fail_each_allocation(
        [&] {
            MapCount::maps = MapCount::unmaps = 0;
            try {
                auto copy = cpu->allocate_copy(source.data(), source.size());
                if (copy) REQUIRE(cpu->free_copy(copy.value()).ok());
            } catch (const std::bad_alloc&) {
                threw = true;
            }
        },
        [&] {
            CHECK(MapCount::maps == MapCount::unmaps);
            CHECK_FALSE(threw);
        });
}

TEST_CASE("execute_plan out of memory releases every import it made") {
    wm::test::TempFile file(8 * MiB);
    ModelDesc m;
    m.files = {{file.path(), file.size()}};
    TargetDesc gpu{"GPU0", "fake", wm::test::device_caps()};
    m.targets = {gpu};
    // four tensors 1 MiB apart: four runs, four imports
    for (std::uint32_t i = 0; i < 4; ++i) m.tensors.push_back({"t", 0, i * 2 * MiB, MiB, 0});
    PlanOptions o;
    o.import_enabled = true;
    o.mode = PlanMode::runs;
    auto plan = make_plan(m, o);
    REQUIRE(plan.ok());
    const std::string paths[] = {file.path()};
    auto mapped = MappedModel::open(paths, MappingAccess::read_only, {});
    REQUIRE(mapped.ok());
    wm::test::FakeImporter device("fake", gpu.caps);
    std::vector<Importer*> importers{&device};
    fail_each_allocation(
        [&] { auto placed = execute_plan(m, *plan, mapped->files(), importers, {}); },
        [&] { CHECK(device.live_imports() == 0); });
    CHECK(device.imports().size() > 4);
}

namespace {
struct CustomImporter {
    int destroyed = 0;
    static void caps(void*, wm_importer_caps* caps) { caps->device_memory_note = "a note that needs a heap copy"; }
    static wm_status import(void*, void*, uint64_t, wm_imported_buffer*, char*, size_t) {
        return WM_ERROR_UNSUPPORTED;
    }
    static wm_status release(void*, const wm_imported_buffer*) { return WM_OK; }
    static void destroy(void* user) { ++static_cast<CustomImporter*>(user)->destroyed; }
};
} // namespace

TEST_CASE("wm_importer_create_custom out of memory never runs the engine's destroy") {
    CustomImporter engine;
    wm_importer_vtable vtable{};
    vtable.struct_size = sizeof vtable;
    vtable.name = "engine";
    vtable.caps = &CustomImporter::caps;
    vtable.import = &CustomImporter::import;
    vtable.release = &CustomImporter::release;
    vtable.destroy = &CustomImporter::destroy;
    wm_status status = WM_OK;
    const std::uint64_t faults = fail_each_allocation(
        [&] {
            engine.destroyed = 0;
            wm_importer* importer = nullptr;
            status = wm_importer_create_custom(&vtable, &engine, &importer);
            wm_importer_destroy(importer); // NULL when creation failed
        },
        [&] {
            // Created: destroyed once, by wm_importer_destroy. Failed: the engine still owns
            // `user` and frees it itself, so the library must not have called destroy.
            CHECK(engine.destroyed == (status == WM_OK ? 1 : 0));
            if (status != WM_OK) CHECK(status == WM_ERROR_OUT_OF_MEMORY);
        });
    CHECK(faults > 1);
}

TEST_CASE("the format readers report out of memory, never throw it") {
    wm::test::TempDir dir;
    const std::string gguf = dir.path() + "/m.gguf", st = dir.path() + "/m.safetensors";
    testkit::GgufSpec spec;
    spec.metadata.push_back({"general.architecture", testkit::GgufValue::string("llama")});
    spec.tensors = {{"a", 0, {64, 4}, std::nullopt}, {"b", 0, {64, 4}, std::nullopt}};
    REQUIRE(testkit::write_gguf(gguf, spec, testkit::DataFill::pattern).ok());
    testkit::SafetensorsSpec st_spec;
    st_spec.tensors = {{"a", "F32", {64, 4}, std::nullopt}, {"b", "F16", {8}, std::nullopt}};
    REQUIRE(testkit::write_safetensors(st, st_spec, testkit::DataFill::pattern).ok());
    for (const std::string& path : {gguf, st}) {
        INFO(path);
        const std::string paths[] = {path};
        bool threw = false;
        bool failed = false;
        ErrorKind kind = ErrorKind::internal;
        const std::size_t fds = open_fds();
        fail_each_allocation(
            [&] {
                failed = false;
                try {
                    auto read = read_model(paths);
                    if (!read) {
                        failed = true;
                        kind = read.error().kind;
                    }
                } catch (const std::bad_alloc&) {
                    threw = true;
                }
            },
            [&] {
                CHECK_FALSE(threw);
                if (failed) CHECK(kind == ErrorKind::out_of_memory);
                CHECK(open_fds() == fds);
            });
    }
}

TEST_CASE("read_memstat out of memory closes /proc/self/fdinfo") {
    const std::size_t fds = open_fds();
    fail_each_allocation([&] { (void)read_memstat(); }, [&] { CHECK(open_fds() == fds); });
}
