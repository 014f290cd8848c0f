// SPDX-License-Identifier: MIT
// Concurrency: models loaded and unloaded from several threads through one importer and the
// registry (CI also runs this under ThreadSanitizer), and one file loaded by two processes at
// once: the page cache stays shared, so the second process's RssAnon does not grow by the model.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "fakes/fake_importers.hpp"
#include "support/child.hpp"
#include "support/temp_file.hpp"
#include "weightmap/loader.hpp"
#include "weightmap/memstat.hpp"
#include "weightmap/registry.hpp"

using namespace wm;

namespace {
constexpr std::uint64_t MiB = 1024 * 1024;

ModelDesc describe(const std::string& path, std::uint64_t size, const ImporterCaps& device) {
    ModelDesc m;
    m.files = {{path, 0}};
    m.targets = {TargetDesc{"GPU0", "dev", device}, TargetDesc{"CPU", "cpu", {}}};
    m.targets[1].caps.is_cpu = true;
    std::uint32_t n = 0;
    for (std::uint64_t off = 0; off + MiB <= size; off += MiB, ++n)
        m.tensors.push_back({"t" + std::to_string(n), 0, off + 100, MiB - 200, n % 4 == 3 ? 1u : 0u});
    return m;
}
} // namespace

TEST_CASE("two models loaded and unloaded concurrently through one importer", "[concurrency]") {
    wm::test::TempFile a(24 * MiB), b(16 * MiB);
    ImporterCaps caps = wm::test::device_caps(4096, false);
    caps.survives_read_only_reprotect = true;
    wm::test::FakeImporter device("dev", caps);
    std::atomic<int> failures{0}, loads{0};
    auto worker = [&](int id) {
        for (int i = 0; i < 15; ++i) {
            auto cpu = create_importer("cpu"); // the registry, from several threads
            if (!cpu) {
                ++failures;
                return;
            }
            const wm::test::TempFile& file = (id + i) % 2 ? a : b;
            std::vector<Importer*> importers{&device, cpu.value().get()};
            LoadOptions o;
            o.plan.import_enabled = true;
            auto loaded = load_model(describe(file.path(), file.size(), caps), importers, o);
            if (!loaded) {
                ++failures;
                continue;
            }
            for (std::uint32_t t = 0; t < loaded->model().tensors.size(); ++t) {
                const TensorDesc& d = loaded->model().tensors[t];
                TensorLocation where = loaded->locate(t);
                auto* p = reinterpret_cast<const unsigned char*>(where.host_address);
                if (!where.imported || p[0] != wm::test::pattern_byte(d.offset) ||
                    p[d.size - 1] != wm::test::pattern_byte(d.offset + d.size - 1))
                    ++failures;
            }
            ++loads;
        }
    };
    std::vector<std::thread> threads;
    for (int id = 0; id < 4; ++id) threads.emplace_back(worker, id);
    for (auto& t : threads) t.join();
    CHECK(failures == 0);
    CHECK(loads == 60);
    CHECK(device.live_imports() == 0);
    CHECK(device.imports().size() == device.releases().size());
}

TEST_CASE("one file loaded by two processes: the page cache stays shared", "[concurrency][memory]") {
    const std::uint64_t size = 128 * MiB;
    wm::test::TempFile file(size);
    auto cpu = make_cpu_importer();
    std::vector<Importer*> importers{cpu.get(), cpu.get()};
    ImporterCaps cpu_caps = cpu->caps();
    LoadOptions o;
    o.mapping.populate = true;
    auto first = load_model(describe(file.path(), size, cpu_caps), importers, o);
    REQUIRE(first.ok());
    // The second process: its own load of the same file, measured from inside it.
    auto child = wm::test::run_in_child([&] {
        MemStat before = read_memstat();
        auto cpu2 = make_cpu_importer();
        std::vector<Importer*> mine{cpu2.get(), cpu2.get()};
        auto second = load_model(describe(file.path(), size, cpu2->caps()), mine, o);
        if (!second) return 1;
        MemStat after = read_memstat();
        auto anon = delta(before.rss_anon, after.rss_anon);
        auto file_rss = delta(before.rss_file, after.rss_file);
        if (!anon || !file_rss) return 2;
        if (*anon > static_cast<std::int64_t>(size / 50)) return 3;        // < 2% of the model
        if (*file_rss < static_cast<std::int64_t>(size - 4 * MiB)) return 4; // it is all mapped
        return 0;
    });
    CHECK(child.exited);
    CHECK(child.code == 0);
}
