// SPDX-License-Identifier: MIT
// load_model end to end: a writable-needing importer gets writable shared pages, the model file's
// bytes are unchanged afterwards, the mapping is dropped to PROT_READ where the importer allows
// it, and a model that cannot be mapped writable falls back with "weight file not writable".
#include <catch2/catch.hpp>

#include <csignal>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

#include "fakes/fake_importers.hpp"
#include "support/child.hpp"
#include "support/skip.hpp"
#include "support/temp_file.hpp"
#include "weightmap/loader.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::FakeImporter;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

// How many lines of /proc/self/maps name `path`.
int mappings_of(const std::string& path) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line)) n += line.find(path) != std::string::npos;
    return n;
}

ModelDesc two_file_model(const std::string& a, std::uint64_t a_size, const std::string& b,
                         std::uint64_t b_size, const ImporterCaps& device) {
    ModelDesc m;
    m.files = {{a, a_size}, {b, 0}}; // 0: filled from the file
    (void)b_size;
    m.targets = {TargetDesc{"GPU0", "fake", device}, TargetDesc{"CPU", "cpu", {}}};
    m.targets[1].caps.is_cpu = true;
    m.tensors = {{"a.attn", 0, 100, 2 * MiB, 0}, {"a.exps", 0, 3 * MiB, 4 * MiB, 1},
                 {"a.out", 0, 7 * MiB + 5, MiB, 0}, {"b.attn", 1, 0, MiB + 3, 0},
                 {"b.exps", 1, 2 * MiB, MiB, 1}};
    return m;
}

ImporterCaps hsa_like_caps(bool survives_reprotect) {
    ImporterCaps caps = wm::test::device_caps(4096, /*needs_writable=*/true);
    caps.survives_read_only_reprotect = survives_reprotect;
    return caps;
}
} // namespace

TEST_CASE("writable load: file bytes unchanged, mapping re-protected, stray store faults",
          "[loader][death]") {
    wm::test::TempFile a(9 * MiB), b(4 * MiB);
    const std::uint64_t hash_a = wm::test::hash_file(a.path()), hash_b = wm::test::hash_file(b.path());
    FakeImporter device("fake", hsa_like_caps(true));
    device.reject_read_only = true; // proves the pages really were writable at import time
    device.reject_unaligned = true;
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&device, cpu.get()};
    LoadOptions options;
    options.plan.import_enabled = true;
    {
        auto loaded = load_model(two_file_model(a.path(), a.size(), b.path(), b.size(),
                                                device.caps()),
                                 importers, options);
        REQUIRE(loaded.ok());
        CHECK(loaded->mapping_decision().access == MappingAccess::writable);
        CHECK(loaded->model().files[1].size == 4 * MiB);
        const PlanTotals& totals = loaded->placement().plan().totals;
        CHECK(totals.fallback_bytes == 0);
        CHECK(totals.imported_bytes == 4 * MiB + 3);
        CHECK(device.live_imports() >= 2);
        CHECK(loaded->read_only());
        CHECK(loaded->reprotect_note() == "re-protected PROT_READ after importing");
        // Every tensor reads back the file's bytes.
        for (std::uint32_t i = 0; i < loaded->model().tensors.size(); ++i) {
            const TensorDesc& t = loaded->model().tensors[i];
            TensorLocation where = loaded->locate(i);
            CHECK(where.imported);
            auto* p = reinterpret_cast<const unsigned char*>(where.host_address);
            CHECK(p[0] == wm::test::pattern_byte(t.offset));
            CHECK(p[t.size - 1] == wm::test::pattern_byte(t.offset + t.size - 1));
        }
        // A stray store into the weights now faults instead of reaching the file.
        auto* weights = const_cast<std::byte*>(loaded->locate(0).host_address);
        auto child = wm::test::run_in_child([&] {
            *reinterpret_cast<volatile unsigned char*>(weights) = 0;
            return 0;
        });
        CHECK_FALSE(child.exited);
        CHECK(child.signal == SIGSEGV);
    }
    CHECK(device.live_imports() == 0);
    CHECK(mappings_of(a.path()) == 0);
    CHECK(wm::test::hash_file(a.path()) == hash_a);
    CHECK(wm::test::hash_file(b.path()) == hash_b);
}

TEST_CASE("an importer that does not survive PROT_READ keeps the mapping writable, and says so",
          "[loader]") {
    wm::test::TempFile a(9 * MiB), b(4 * MiB);
    FakeImporter device("fake", hsa_like_caps(false));
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&device, cpu.get()};
    LoadOptions options;
    options.plan.import_enabled = true;
    auto loaded = load_model(two_file_model(a.path(), a.size(), b.path(), b.size(), device.caps()),
                             importers, options);
    REQUIRE(loaded.ok());
    CHECK_FALSE(loaded->read_only());
    CHECK_THAT(loaded->reprotect_note(), Catch::Contains("'fake' does not declare"));
}

TEST_CASE("an unwritable shard: read-only mapping, writable-needing regions fall back",
          "[loader][root][may_skip]") {
    if (geteuid() != 0) return wm::test::skip("needs root to drop privileges");
    wm::test::TempDir dir;
    chmod(dir.path().c_str(), 0755);
    std::string a = dir.path() + "/a.gguf", b = dir.path() + "/b.gguf";
    for (const std::string& p : {a, b}) {
        std::ofstream out(p, std::ios::binary);
        for (std::uint64_t i = 0; i < 9 * MiB; ++i) out.put(static_cast<char>(wm::test::pattern_byte(i)));
    }
    chown(a.c_str(), 65534, 65534);
    chmod(b.c_str(), 0444);
    auto child = wm::test::run_in_child([&] {
        if (!wm::test::drop_privileges_to_nobody()) return 10;
        FakeImporter device("fake", hsa_like_caps(true));
        device.reject_read_only = true;
        auto cpu = make_cpu_importer();
        std::vector<Importer*> importers{&device, cpu.get()};
        LoadOptions options;
        options.plan.import_enabled = true;
        auto loaded = load_model(two_file_model(a, 9 * MiB, b, 9 * MiB, device.caps()), importers,
                                 options);
        if (!loaded) return 1;
        if (loaded->mapping_decision().access != MappingAccess::read_only) return 2;
        if (!device.imports().empty()) return 3; // never even tried: the plan already said why
        for (const PlanRegion& r : loaded->placement().plan().regions) {
            if (r.target == 1) {
                if (r.decision != Decision::import) return 4; // the CPU still reads in place
            } else if (r.reason != "weight file not writable: " + b) {
                return 5;
            }
        }
        return 0;
    });
    CHECK(child.exited);
    CHECK(child.code == 0);
}

TEST_CASE("a file shorter than a tensor's end is an error naming both; nothing stays mapped",
          "[loader][errors]") {
    wm::test::TempFile a(9 * MiB), b(MiB); // b.attn needs MiB + 3 bytes
    FakeImporter device("fake", hsa_like_caps(true));
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&device, cpu.get()};
    auto loaded = load_model(two_file_model(a.path(), a.size(), b.path(), b.size(), device.caps()),
                             importers);
    REQUIRE_FALSE(loaded.ok());
    CHECK_THAT(loaded.error().message, Catch::Contains(b.path()) && Catch::Contains("'b.attn'"));
    CHECK(mappings_of(a.path()) == 0);
    CHECK(mappings_of(b.path()) == 0);
    CHECK(device.imports().empty());

    ModelDesc wrong_size = two_file_model(a.path(), a.size() + 1, b.path(), b.size(), device.caps());
    auto r = load_model(wrong_size, importers);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("model description says"));
}

TEST_CASE("WEIGHTMAP_IMPORT=0 through load_model: same mapping, every device region copies",
          "[loader][ab]") {
    wm::test::TempFile a(9 * MiB), b(4 * MiB);
    FakeImporter device("fake", hsa_like_caps(true));
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{&device, cpu.get()};
    setenv("WEIGHTMAP_IMPORT", "0", 1);
    auto loaded = load_model(two_file_model(a.path(), a.size(), b.path(), b.size(), device.caps()),
                             importers);
    unsetenv("WEIGHTMAP_IMPORT");
    REQUIRE(loaded.ok());
    CHECK(device.imports().empty());
    // The control arm maps exactly as before the change: read-only shared.
    CHECK(loaded->mapping_decision().access == MappingAccess::read_only);
    CHECK_THAT(loaded->mapping_decision().reason, Catch::Contains("WEIGHTMAP_IMPORT=0"));
    CHECK(loaded->placement().plan().totals.imported_bytes == 0);
    CHECK(loaded->placement().plan().regions[0].reason == "disabled by WEIGHTMAP_IMPORT=0");
}
