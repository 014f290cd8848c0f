// SPDX-License-Identifier: MIT
// Cold loads (populate.hpp): populate brings exactly the planned extents into the page cache and
// the mapping's page tables without writing or growing RssAnon, and keeps a read-only mapping
// read-only; copy_fallback_tensors copies exactly the fallback tensors' bytes, to addresses or a
// sink; a file truncated after planning is an error naming file and offset; a cancel stops both
// with nothing left open.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support/temp_file.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/memstat.hpp"
#include "weightmap/populate.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::open_fds;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// Evicts the file from the page cache; false where the filesystem cannot (tmpfs).
bool evict(const std::string& path, std::uint64_t size) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return false;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    std::vector<unsigned char> resident((size + 4095) / 4096);
    const bool ok = p != MAP_FAILED && ::mincore(p, size, resident.data()) == 0;
    std::uint64_t in = 0;
    for (unsigned char r : resident) in += r & 1;
    if (p != MAP_FAILED) ::munmap(p, size);
    return ok && in * 100 < resident.size(); // under 1 % resident
}

// Pages of [offset, offset + size) of the mapping that are resident in the page cache.
std::uint64_t resident_pages(const MappedFile& file, std::uint64_t offset, std::uint64_t size) {
    std::vector<unsigned char> v((size + 4095) / 4096);
    REQUIRE(::mincore(file.base + offset, size, v.data()) == 0);
    std::uint64_t n = 0;
    for (unsigned char r : v) n += r & 1;
    return n;
}

std::string maps_line_of(const void* address) {
    std::ifstream maps("/proc/self/maps");
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    for (std::string line; std::getline(maps, line);) {
        std::uintptr_t lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) return line;
    }
    return {};
}

// The VmFlags line of the mapping that holds `address` (/proc/self/smaps).
std::string vm_flags_of(const void* address) {
    std::ifstream smaps("/proc/self/smaps");
    const auto a = reinterpret_cast<std::uintptr_t>(address);
    bool inside = false;
    for (std::string line; std::getline(smaps, line);) {
        std::uintptr_t lo = 0, hi = 0;
        char colon = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx %*s %*s %*s %*s%c", &lo, &hi, &colon) >= 2 &&
            line.rfind("VmFlags:", 0) != 0 && line.find(':') > line.find(' '))
            inside = a >= lo && a < hi;
        else if (inside && line.rfind("VmFlags:", 0) == 0)
            return line;
    }
    return {};
}

bool kernel_has_thp() { return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good(); }

ModelDesc one_file_model(const std::string& path, std::uint64_t size) {
    ModelDesc m;
    m.files = {{path, size}};
    TargetDesc gpu{"GPU0", "fake", {}};
    gpu.caps.alignment = 4096;
    gpu.caps.device_memory = DeviceMemory::unified;
    TargetDesc cpu{"CPU", "cpu", {}};
    cpu.caps.is_cpu = true;
    m.targets = {gpu, cpu};
    // two device tensors far apart (two runs), one CPU tensor between them
    m.tensors = {{"a", 0, 4 * MiB + 100, 8 * MiB, 0}, {"cpu", 0, 13 * MiB, 6 * MiB, 1},
                 {"b", 0, 20 * MiB, 4 * MiB - 10, 0}};
    return m;
}
// A 32 MiB file, its one_file_model, the plan with imports on, and its read-only mapping.
struct PlannedFile {
    wm::test::TempFile file{32 * MiB};
    ModelDesc m = one_file_model(file.path(), file.size());
    Plan plan;
    MappedModel mapped;
    PlannedFile() {
        PlanOptions o;
        o.import_enabled = true;
        auto planned = make_plan(m, o);
        REQUIRE(planned.ok());
        plan = std::move(planned).value();
        const std::string paths[] = {file.path()};
        auto opened = MappedModel::open(paths, MappingAccess::read_only, {});
        REQUIRE(opened.ok());
        mapped = std::move(opened).value();
    }
};
} // namespace

TEST_CASE("import_extents are the plan's device runs, merged per file") {
    ModelDesc m = one_file_model("x", 32 * MiB);
    PlanOptions o;
    o.page_size = 4096;
    o.import_enabled = true;
    auto plan = make_plan(m, o);
    REQUIRE(plan.ok());
    const auto extents = import_extents(m, *plan);
    REQUIRE(extents.size() == 2);
    CHECK(extents[0].offset == 4 * MiB);
    CHECK(extents[0].size == 8 * MiB + 4096);
    CHECK(extents[1].offset == 20 * MiB);
    CHECK(extents[1].size == 4 * MiB);
    Plan touching = *plan;
    touching.regions[0].runs[1].extent_offset = 12 * MiB + 4096; // now touches the first run
    CHECK(import_extents(m, touching).size() == 1);
}

TEST_CASE("populate brings the planned extents in, reads only, and leaves the rest cold") {
    PlannedFile p;
    const std::uint64_t hash = wm::test::hash_file(p.file.path());
    if (!evict(p.file.path(), p.file.size())) {
        WARN("the filesystem of " << p.file.path() << " cannot be evicted (tmpfs?): cold part skipped");
    } else {
        CHECK(resident_pages(p.mapped.files()[0], 0, 32 * MiB) * 100 < 8192);
    }
    const MemStat before = read_memstat();
    std::vector<std::uint64_t> progress;
    ReadOptions ro;
    ro.chunk_size = MiB;
    ro.threads = 3;
    ro.progress = [&](std::uint64_t done, std::uint64_t total) {
        progress.push_back(done);
        CHECK(total == 12 * MiB + 4096); // whole pages: the file is longer than the extents
        return true;
    };
    auto report = populate_imports(p.m, p.plan, p.mapped.files(), ro);
    REQUIRE(report.ok());
    const MemStat after = read_memstat();
    CHECK(report->bytes == 12 * MiB + 4096);
    CHECK(report->method == "MADV_POPULATE_READ");
    REQUIRE_FALSE(progress.empty());
    CHECK(std::is_sorted(progress.begin(), progress.end()));
    CHECK(progress.back() == 12 * MiB + 4096);
    const MappedFile& f = p.mapped.files()[0];
    CHECK(resident_pages(f, 4 * MiB, 8 * MiB + 4096) == (8 * MiB + 4096) / 4096);
    CHECK(resident_pages(f, 20 * MiB, 4 * MiB) == MiB / 1024);
    // the page tables hold them (RssFile), no anonymous copy was made, the mapping is read-only
    REQUIRE(before.rss_file);
    CHECK(*after.rss_file >= *before.rss_file + 12 * MiB);
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer's per-thread state is anonymous memory (+1.9 MiB for the reading threads).
    WARN("RssAnon not checked under ThreadSanitizer");
#else
    CHECK(*after.rss_anon < *before.rss_anon + MiB);
#endif
    CHECK(maps_line_of(f.base).find(" r--s ") != std::string::npos);
    CHECK(wm::test::hash_file(p.file.path()) == hash);
    // the extents, and only they, are advised MADV_HUGEPAGE ("hg")
    if (!kernel_has_thp()) {
        WARN("no transparent huge pages in this kernel: MADV_HUGEPAGE not checked");
    } else {
        CHECK(vm_flags_of(f.base + 4 * MiB).find(" hg") != std::string::npos);
        CHECK(vm_flags_of(f.base + 20 * MiB).find(" hg") != std::string::npos);
        CHECK(vm_flags_of(f.base + 16 * MiB).find(" hg") == std::string::npos);
        CHECK(vm_flags_of(f.base).find(" hg") == std::string::npos);
    }
}

TEST_CASE("progress ends at the total whichever thread read the chunks") {
    // With more threads than the calling thread can keep up with, the helpers may read every
    // chunk before it takes one (CI, ThreadSanitizer): the final report must still come.
    PlannedFile p;
    for (int round = 0; round < 20; ++round) {
        std::vector<std::uint64_t> progress;
        ReadOptions ro;
        ro.chunk_size = 4 * MiB;
        ro.threads = 4;
        ro.progress = [&](std::uint64_t done, std::uint64_t) {
            progress.push_back(done);
            return true;
        };
        auto report = populate_imports(p.m, p.plan, p.mapped.files(), ro);
        REQUIRE(report.ok());
        REQUIRE_FALSE(progress.empty());
        CHECK(progress.back() == report->bytes);
        CHECK(std::adjacent_find(progress.begin(), progress.end()) == progress.end()); // no repeat
    }
}

TEST_CASE("populate and the copy fail naming file and offset when the file shrank after planning") {
    PlannedFile p;
    REQUIRE(::truncate(p.file.path().c_str(), 22 * MiB) == 0);
    const std::size_t fds = open_fds();
    auto populated = populate_imports(p.m, p.plan, p.mapped.files());
    REQUIRE_FALSE(populated.ok());
    CHECK(populated.error().kind == ErrorKind::io);
    CHECK_THAT(populated.error().message,
               Catch::Contains(p.file.path()) && Catch::Contains("ends at offset 23068672") &&
                   Catch::Contains("[20971520, +4194304)"));
    std::vector<std::byte> dst(8 * MiB);
    Plan fallback = p.plan;
    for (TensorPlacement& t : fallback.tensors) t.run = no_index;
    CopyDestination to;
    to.address = [&](std::uint32_t) { return static_cast<void*>(dst.data()); };
    auto copied = copy_fallback_tensors(p.m, fallback, to);
    REQUIRE_FALSE(copied.ok());
    CHECK_THAT(copied.error().message, Catch::Contains(p.file.path()) && Catch::Contains("20971520"));
    CHECK(open_fds() == fds);
}

TEST_CASE("copy_fallback_tensors copies exactly the fallback tensors, to addresses or a sink") {
    wm::test::TempFile file(32 * MiB);
    const ModelDesc m = one_file_model(file.path(), file.size());
    PlanOptions o;
    o.import_enabled = false; // every device tensor falls back
    auto plan = make_plan(m, o);
    REQUIRE(plan.ok());

    std::vector<std::vector<std::uint8_t>> host(3);
    for (std::uint32_t t = 0; t < 3; ++t) host[t].assign(m.tensors[t].size, 0);
    CopyDestination to;
    to.address = [&](std::uint32_t t) { return static_cast<void*>(host[t].data()); };
    ReadOptions ro;
    ro.chunk_size = 3 * MiB + 7; // chunks that do not divide the tensors
    auto copied = copy_fallback_tensors(m, *plan, to, ro);
    REQUIRE(copied.ok());
    CHECK(copied->bytes == m.tensors[0].size + m.tensors[2].size);
    CHECK(wm::test::equals_file_bytes(host[0], m.tensors[0].offset));
    CHECK(wm::test::equals_file_bytes(host[2], m.tensors[2].offset));
    CHECK(std::all_of(host[1].begin(), host[1].end(), [](std::uint8_t b) { return b == 0; }));

    std::mutex mutex;
    std::vector<std::vector<std::uint8_t>> sunk(3);
    for (std::uint32_t t = 0; t < 3; ++t) sunk[t].assign(m.tensors[t].size, 0);
    CopyDestination sink;
    sink.sink = [&](std::uint32_t t, std::uint64_t offset, const void* data, std::uint64_t size) {
        std::lock_guard lock(mutex);
        REQUIRE(offset + size <= sunk[t].size());
        std::memcpy(sunk[t].data() + offset, data, size);
        return Status{};
    };
    REQUIRE(copy_fallback_tensors(m, *plan, sink, ro).ok());
    CHECK(sunk[0] == host[0]);
    CHECK(sunk[2] == host[2]);

    // a failing sink stops the copy with its own error; both or neither destination is refused
    CopyDestination failing;
    failing.sink = [](std::uint32_t, std::uint64_t, const void*, std::uint64_t) {
        return Status{make_error(ErrorKind::import_failed, "device full")};
    };
    auto failed = copy_fallback_tensors(m, *plan, failing, ro);
    REQUIRE_FALSE(failed.ok());
    CHECK(failed.error().message == "device full");
    CopyDestination both = to;
    both.sink = sink.sink;
    CHECK(copy_fallback_tensors(m, *plan, both).error().kind == ErrorKind::invalid_argument);
    CHECK(copy_fallback_tensors(m, *plan, CopyDestination{}).error().kind ==
          ErrorKind::invalid_argument);

    // imported tensors are the importer's, not the copy's
    PlanOptions importing;
    importing.import_enabled = true;
    auto imported = make_plan(m, importing);
    REQUIRE(imported.ok());
    auto none = copy_fallback_tensors(m, *imported, to, ro);
    REQUIRE(none.ok());
    CHECK(none->bytes == 0);
}

TEST_CASE("a cancel from the progress callback stops populate and the copy, nothing left open") {
    wm::test::TempFile a(16 * MiB), b(16 * MiB, ".b"), c(16 * MiB, ".c");
    ModelDesc m;
    m.files = {{a.path(), a.size()}, {b.path(), b.size()}, {c.path(), c.size()}};
    TargetDesc gpu{"GPU0", "fake", {}};
    gpu.caps.device_memory = DeviceMemory::unified;
    m.targets = {gpu};
    for (std::uint32_t f = 0; f < 3; ++f) m.tensors.push_back({"t", f, 0, 16 * MiB, 0});
    PlanOptions o;
    o.import_enabled = true;
    auto plan = make_plan(m, o);
    REQUIRE(plan.ok());
    const std::string paths[] = {a.path(), b.path(), c.path()};
    auto mapped = MappedModel::open(paths, MappingAccess::read_only, {});
    REQUIRE(mapped.ok());
    const std::size_t fds = open_fds();

    // One thread, so that the calling thread reads every chunk and the cancel lands on its
    // third report; with more threads the stop is the same flag, but how many chunks the
    // calling thread itself reads depends on timing.
    ReadOptions ro;
    ro.chunk_size = MiB;
    ro.threads = 1;
    int calls = 0;
    ro.progress = [&](std::uint64_t, std::uint64_t) { return ++calls < 3; };
    auto populated = populate_imports(m, *plan, mapped->files(), ro);
    REQUIRE_FALSE(populated.ok());
    CHECK(populated.error().kind == ErrorKind::aborted);
    CHECK(calls == 3);

    // across three files on three threads, all of it when not cancelled
    ro.progress = nullptr;
    ro.threads = 3;
    auto all = populate_imports(m, *plan, mapped->files(), ro);
    REQUIRE(all.ok());
    CHECK(all->bytes == 48 * MiB);

    Plan fallback = *plan;
    for (TensorPlacement& t : fallback.tensors) t.run = no_index;
    std::vector<std::byte> dst(16 * MiB);
    CopyDestination to;
    to.address = [&](std::uint32_t) { return static_cast<void*>(dst.data()); };
    calls = 0;
    ro.threads = 1;
    ro.progress = [&](std::uint64_t, std::uint64_t) { return ++calls < 2; };
    auto copied = copy_fallback_tensors(m, fallback, to, ro);
    REQUIRE_FALSE(copied.ok());
    CHECK(copied.error().kind == ErrorKind::aborted);
    CHECK(open_fds() == fds);
}

// std::thread calls std::terminate for an exception that leaves it: a sink that throws (an
// engine's ggml_backend_tensor_set wrapper, bad_alloc) must become the call's error instead,
// whichever thread ran it, with every other thread stopped and joined.
TEST_CASE("an exception from the copy's sink is the call's error, on any thread") {
    wm::test::TempFile a(8 * MiB), b(8 * MiB, ".b");
    ModelDesc m;
    m.files = {{a.path(), a.size()}, {b.path(), b.size()}};
    TargetDesc gpu{"GPU0", "fake", {}};
    gpu.caps.device_memory = DeviceMemory::unified;
    m.targets = {gpu};
    m.tensors = {{"a", 0, 0, 8 * MiB, 0}, {"b", 1, 0, 8 * MiB, 0}};
    Plan plan;
    plan.tensors.resize(2); // both fall back (run == no_index): both are copied
    const std::size_t fds = open_fds();
    for (std::uint32_t threads : {1u, 2u, 4u}) {
        INFO("threads " << threads);
        ReadOptions ro;
        ro.chunk_size = MiB;
        ro.threads = threads;
        std::atomic<int> calls{0};
        CopyDestination to;
        to.sink = [&](std::uint32_t, std::uint64_t, const void*, std::uint64_t) -> Status {
            if (++calls == 3) throw std::runtime_error("the engine's sink threw");
            return {};
        };
        auto copied = copy_fallback_tensors(m, plan, to, ro);
        REQUIRE_FALSE(copied.ok());
        CHECK(copied.error().kind == ErrorKind::internal);
        CHECK_THAT(copied.error().message, Catch::Contains("the engine's sink threw"));
        CHECK(open_fds() == fds);
    }
}
