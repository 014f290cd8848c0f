// SPDX-License-Identifier: MIT
// The HSA importer on the fake runtime: availability and its reasons, the agents it locks for,
// page-aligned writable locks in place, refusals that never reach the runtime, the lock budget,
// release bookkeeping, teardown, and concurrent use.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <hsa/hsa.h>

#include "hsa/fake_hsa.hpp"
#include "support/alloc_fault.hpp"
#include "support/capture_log.hpp"
#include "support/temp_file.hpp"
#include "weightmap/backends/hsa.hpp"
#include "weightmap/log.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::FakeHsa;
using wm::test::FileMapping;

namespace {
const std::uint64_t page = host_page_size();

struct WritableFile {
    wm::test::TempFile file{64 * page};
    FileMapping map{file.path(), file.size(), true};
};

} // namespace

TEST_CASE("an importer on the fake runtime is available with the HSA caps", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    const int before = fake.init_count();
    {
        auto hsa = fake.importer();
        CHECK(hsa->name() == "hsa");
        Availability a = hsa->available();
        CHECK(a.available);
        CHECK(a.reason.empty());
        ImporterCaps caps = hsa->caps();
        CHECK_FALSE(caps.needs_writable_mapping); // read-only first
        CHECK(caps.alignment == page);
        CHECK(caps.max_import_size == 0);
        CHECK_FALSE(caps.is_cpu);
        CHECK_FALSE(caps.survives_read_only_reprotect);
        CHECK(fake.init_count() == before + 1); // hsa_init once per importer
    }
    CHECK(fake.init_count() == before); // hsa_shut_down in the destructor
}

TEST_CASE("device memory comes from the agents' profile and memory properties", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    using Memory = FakeHsa::Memory;
    struct Case {
        Memory model;
        DeviceMemory expect;
        const char* note;
    };
    const Case cases[] = {
        {Memory::newer_apu, DeviceMemory::unified, "gfx1151: AGENT_IS_APU"},
        {Memory::newer_dgpu, DeviceMemory::discrete,
         "gfx1151: HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES without AGENT_IS_APU"},
        {Memory::full_profile, DeviceMemory::unified, "gfx1151: HSA_AGENT_INFO_PROFILE FULL"},
        {Memory::rocm52_base, DeviceMemory::unknown, "ROCm 5.2 cannot tell an APU"},
    };
    for (const Case& c : cases) {
        INFO(c.note);
        fake.set_memory_model(c.model);
        auto importer = fake.importer();
        CHECK(importer->caps().device_memory == c.expect);
        CHECK_THAT(std::string(importer->notes().device_memory), Catch::Contains(c.note));
    }
    // Two discrete agents locked together are discrete; the engine's word overrides the
    // runtime's when it knows better (ROCm 5.2 on an APU).
    fake.set_memory_model(Memory::newer_dgpu);
    fake.set_gpu_agent_count(2);
    CHECK(fake.importer()->caps().device_memory == DeviceMemory::discrete);
    fake.set_memory_model(Memory::rocm52_base);
    HsaImporterParams params;
    params.device_memory = DeviceMemory::unified;
    auto told = fake.importer(params);
    CHECK(told->caps().device_memory == DeviceMemory::unified);
    CHECK_THAT(std::string(told->notes().device_memory),
               Catch::StartsWith("HsaImporterParams::device_memory; the runtime says unknown"));
}

TEST_CASE("a failing hsa_init makes the importer unavailable with the runtime's string", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    fake.set_init_status(HSA_STATUS_ERROR_OUT_OF_RESOURCES); // what the real one says sans /dev/kfd
    auto hsa = fake.importer();
    Availability a = hsa->available();
    CHECK_FALSE(a.available);
    CHECK_THAT(a.reason, Catch::Contains("hsa_init failed") &&
                             Catch::Contains("HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime") &&
                             Catch::Contains(wm::test::fake_hsa_path));
    WritableFile f;
    auto imported = hsa->import(f.map.base(), page);
    REQUIRE_FALSE(imported.ok());
    CHECK(imported.error().kind == ErrorKind::unsupported);
    CHECK_THAT(imported.error().message, Catch::Contains("hsa_init failed"));
    CHECK(fake.lock_calls() == 0);
    CHECK(fake.init_count() == 0);
}

TEST_CASE("no GPU agent makes the importer unavailable, naming the agents found", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    fake.set_gpu_agent_count(0);
    auto hsa = fake.importer();
    CHECK_FALSE(hsa->available().available);
    CHECK_THAT(hsa->available().reason,
               Catch::Contains("no GPU agent") && Catch::Contains("non-GPU 'fake-cpu'"));
    CHECK(fake.init_count() == 0); // the failed importer did not keep the runtime initialised
}

TEST_CASE("a runtime that cannot be loaded or lacks an entry point is a reason, not a crash",
          "[hsa]") {
    FakeHsa::fresh();
    HsaImporterParams params;
    params.library_path = "/nonexistent/libhsa-runtime64.so.1";
    auto missing = make_hsa_importer(params);
    REQUIRE(missing.ok());
    CHECK_FALSE(missing.value()->available().available);
    CHECK_THAT(missing.value()->available().reason,
               Catch::Contains("cannot load the HSA runtime '/nonexistent/libhsa-runtime64.so.1'"));

    params.library_path = "libm.so.6"; // loads, but is no HSA runtime
    auto wrong = make_hsa_importer(params);
    REQUIRE(wrong.ok());
    CHECK_FALSE(wrong.value()->available().available);
    CHECK_THAT(wrong.value()->available().reason,
               Catch::Contains("'libm.so.6' lacks hsa_init"));
}

TEST_CASE("WEIGHTMAP_HSA_LIBRARY selects the runtime of the default importer", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    bool listed = false;
    for (const ImporterEntry& e : importer_registry())
        if (e.name == "hsa") listed = e.built && e.create_default != nullptr;
    REQUIRE(listed);

    REQUIRE(setenv("WEIGHTMAP_HSA_LIBRARY", wm::test::fake_hsa_path, 1) == 0);
    {
        auto hsa = create_importer("hsa");
        REQUIRE(hsa.ok());
        CHECK(hsa.value()->name() == "hsa");
        CHECK(fake.init_count() == 1); // it is the fake that was initialised
        auto first = create_importer("auto");
        REQUIRE(first.ok());
        CHECK(first.value()->name() == "hsa"); // HSA first in the registry's preference
    }
    REQUIRE(setenv("WEIGHTMAP_HSA_LIBRARY", "/nonexistent/libfake.so", 1) == 0);
    auto absent = create_importer("hsa");
    REQUIRE_FALSE(absent.ok());
    CHECK(absent.error().kind == ErrorKind::unsupported);
    CHECK_THAT(absent.error().message, Catch::Contains("/nonexistent/libfake.so"));
    // An explicit path wins over the variable.
    auto explicit_path = fake.importer();
    CHECK(explicit_path->available().available);
    unsetenv("WEIGHTMAP_HSA_LIBRARY");
}

TEST_CASE("a page-aligned writable range is locked in place and unlocked on release", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    WritableFile f;
    auto hsa = fake.importer();
    std::byte* address = f.map.base() + 3 * page;
    auto imported = hsa->import(address, 5 * page);
    REQUIRE(imported.ok());
    const ImportedBuffer& buffer = imported.value();
    CHECK(buffer.host_address == address);
    CHECK(buffer.size == 5 * page);
    // The runtime's agent pointer, not the host address.
    CHECK(buffer.device_address == address + fake.agent_aperture());
    CHECK(buffer.imported);
    CHECK(buffer.native_memory == 0);
    CHECK(fake.is_locked(address, 5 * page));
    CHECK(fake.last_lock_agents() == std::vector<std::uint64_t>{fake.agent_handle(1)});

    // read_back reads the locked pages themselves (the agent pointer is not host memory).
    std::vector<unsigned char> bytes(100);
    REQUIRE(hsa->read_back(buffer, page - 50, bytes.size(), bytes.data()).ok());
    for (std::size_t i = 0; i < bytes.size(); ++i)
        REQUIRE(bytes[i] == wm::test::pattern_byte(3 * page + page - 50 + i));
    CHECK_FALSE(hsa->read_back(buffer, 5 * page - 10, 11, bytes.data()).ok());

    REQUIRE(hsa->release(buffer).ok());
    CHECK(fake.live_locks() == 0);
    CHECK(fake.unlock_calls() == 1);
}

TEST_CASE("locks are for every GPU agent by default, or exactly the engine's agents", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    fake.set_gpu_agent_count(3);
    WritableFile f;
    {
        auto hsa = fake.importer();
        auto imported = hsa->import(f.map.base(), page);
        REQUIRE(imported.ok());
        CHECK(fake.last_lock_agents() == std::vector<std::uint64_t>{
                                             fake.agent_handle(1), fake.agent_handle(2),
                                             fake.agent_handle(3)});
        REQUIRE(hsa->release(imported.value()).ok());
    }
    HsaImporterParams params;
    params.agents = {fake.agent_handle(3), fake.agent_handle(0)}; // a GPU and the CPU, in order
    auto hsa = fake.importer(params);
    REQUIRE(hsa->available().available);
    auto imported = hsa->import(f.map.base(), page);
    REQUIRE(imported.ok());
    CHECK(fake.last_lock_agents() == params.agents);
    REQUIRE(hsa->release(imported.value()).ok());
}

TEST_CASE("unusable agent params are refused", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    HsaImporterParams params;
    params.library_path = wm::test::fake_hsa_path;

    params.agents = {fake.agent_handle(1), 0};
    auto zero = make_hsa_importer(params);
    REQUIRE_FALSE(zero.ok());
    CHECK(zero.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(zero.error().message, Catch::Contains("HsaImporterParams::agents[1] is 0"));

    params.agents = {fake.agent_handle(1), fake.agent_handle(1)};
    auto repeated = make_hsa_importer(params);
    REQUIRE_FALSE(repeated.ok());
    CHECK_THAT(repeated.error().message, Catch::Contains("agents[1] = 0x2000 repeats agents[0]"));

    params.agents = {0xdead0};
    auto unknown = make_hsa_importer(params);
    REQUIRE_FALSE(unknown.ok());
    CHECK(unknown.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(unknown.error().message,
               Catch::Contains("agents[0] = 0xdead0 is not an agent of the HSA runtime"));
    CHECK(fake.init_count() == 0); // nothing kept initialised by the refusals
}

TEST_CASE("an unaligned request is refused before the runtime sees it", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    WritableFile f;
    auto hsa = fake.importer();
    auto address = hsa->import(f.map.base() + 100, page);
    REQUIRE_FALSE(address.ok());
    CHECK(address.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(address.error().message,
               Catch::Contains("not aligned") && Catch::Contains("hsa_lock_superset"));
    auto size = hsa->import(f.map.base(), page + 1);
    REQUIRE_FALSE(size.ok());
    CHECK(size.error().kind == ErrorKind::invalid_argument);
    auto null = hsa->import(nullptr, page);
    REQUIRE_FALSE(null.ok());
    CHECK(null.error().kind == ErrorKind::invalid_argument);
    CHECK(fake.lock_calls() == 0);
}

TEST_CASE("a runtime that accepts read-only pages locks a PROT_READ mapping as it is", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    wm::test::TempFile file(8 * page);
    FileMapping ro(file.path(), file.size(), false);
    auto hsa = fake.importer();
    auto imported = hsa->import(ro.base(), 2 * page);
    REQUIRE(imported.ok());
    CHECK(fake.is_locked(ro.base(), 2 * page));
    CHECK(hsa->release(imported.value()).ok());
    CHECK(fake.live_locks() == 0);
}

TEST_CASE("a runtime that refuses read-only pages: import_failed saying it refused a read-only "
          "lock", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    fake.set_refuse_read_only(true);
    wm::test::TempFile file(8 * page);
    FileMapping ro(file.path(), file.size(), false);
    auto hsa = fake.importer();
    auto imported = hsa->import(ro.base(), 2 * page);
    REQUIRE_FALSE(imported.ok());
    CHECK(imported.error().kind == ErrorKind::import_failed);
    CHECK_THAT(imported.error().message,
               Catch::Contains("hsa_amd_memory_lock") &&
                   Catch::Contains("HSA_STATUS_ERROR: A generic error has occurred.") &&
                   Catch::Contains(std::string(read_only_refusal_marker)) &&
                   Catch::Contains("PROT_WRITE"));
    CHECK(fake.lock_calls() == 1);
    CHECK(fake.live_locks() == 0);

    // The same status on writable pages is not a read-only refusal: no writable retry for it.
    WritableFile f;
    fake.set_fail_lock_at(1, HSA_STATUS_ERROR);
    auto generic = hsa->import(f.map.base(), page);
    REQUIRE_FALSE(generic.ok());
    CHECK_THAT(generic.error().message, Catch::Contains("HSA_STATUS_ERROR:") &&
                                            !Catch::Contains(std::string(read_only_refusal_marker)));
}

TEST_CASE("an injected lock failure carries its status string and leaves nothing locked",
          "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    WritableFile f;
    auto hsa = fake.importer();
    fake.set_fail_lock_at(2, HSA_STATUS_ERROR_OUT_OF_RESOURCES);
    auto first = hsa->import(f.map.base(), page);
    REQUIRE(first.ok());
    auto second = hsa->import(f.map.base() + page, page);
    REQUIRE_FALSE(second.ok());
    CHECK_THAT(second.error().message,
               Catch::Contains("HSA_STATUS_ERROR_OUT_OF_RESOURCES") &&
                   !Catch::Contains("PROT_WRITE")); // the hint is for HSA_STATUS_ERROR alone
    CHECK(fake.live_locks() == 1);
    REQUIRE(hsa->release(first.value()).ok());
    CHECK(fake.live_locks() == 0);
}

TEST_CASE("the lock budget refuses what would pass it and frees on release", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    WritableFile f;
    HsaImporterParams params;
    params.lock_budget_bytes = 4 * page;
    auto hsa = fake.importer(params);
    CHECK(hsa->caps().max_import_size == 0); // a refusal, not a size for the planner to split to

    auto too_big = hsa->import(f.map.base(), 5 * page);
    REQUIRE_FALSE(too_big.ok());
    CHECK(too_big.error().kind == ErrorKind::limit);
    CHECK_THAT(too_big.error().message,
               Catch::Contains(std::to_string(5 * page) + " bytes") &&
                   Catch::Contains("lock_budget_bytes) is " + std::to_string(4 * page)));
    CHECK(fake.lock_calls() == 0);

    auto three = hsa->import(f.map.base(), 3 * page);
    REQUIRE(three.ok());
    auto two = hsa->import(f.map.base() + 8 * page, 2 * page);
    REQUIRE_FALSE(two.ok());
    CHECK_THAT(two.error().message,
               Catch::Contains(std::to_string(3 * page) + " bytes already locked"));
    auto one = hsa->import(f.map.base() + 8 * page, page);
    REQUIRE(one.ok()); // exactly the budget
    REQUIRE(hsa->release(three.value()).ok());
    auto again = hsa->import(f.map.base() + 16 * page, 3 * page);
    REQUIRE(again.ok());
    REQUIRE(hsa->release(again.value()).ok());
    REQUIRE(hsa->release(one.value()).ok());
    CHECK(fake.live_locks() == 0);

    // A failed lock gives its reservation back.
    fake.set_fail_lock_at(1, HSA_STATUS_ERROR);
    REQUIRE_FALSE(hsa->import(f.map.base(), 4 * page).ok());
    auto whole = hsa->import(f.map.base(), 4 * page);
    REQUIRE(whole.ok());
    REQUIRE(hsa->release(whole.value()).ok());
}

TEST_CASE("release refuses a buffer it did not lock, without calling the runtime", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    WritableFile f;
    auto hsa = fake.importer();
    auto imported = hsa->import(f.map.base(), 2 * page);
    REQUIRE(imported.ok());

    ImportedBuffer forged = imported.value();
    forged.size = page; // same address, another size
    auto wrong = hsa->release(forged);
    REQUIRE_FALSE(wrong.ok());
    CHECK(wrong.error().kind == ErrorKind::invalid_argument);
    // Importer::release refuses it before the HSA importer's own record is asked
    CHECK_THAT(wrong.error().message, Catch::Contains("not a live import of this importer"));
    CHECK(fake.unlock_calls() == 0);

    REQUIRE(hsa->release(imported.value()).ok());
    auto twice = hsa->release(imported.value());
    REQUIRE_FALSE(twice.ok());
    CHECK(fake.unlock_calls() == 1);

    // Another importer's buffer is not this one's to unlock.
    auto other = fake.importer();
    auto theirs = other->import(f.map.base() + 4 * page, page);
    REQUIRE(theirs.ok());
    CHECK_FALSE(hsa->release(theirs.value()).ok());
    CHECK(fake.live_locks() == 1);
    REQUIRE(other->release(theirs.value()).ok());
    CHECK(fake.misuse_count() == 0);
}

TEST_CASE("overlapping locks of the same start page are counted one unlock each", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    WritableFile f;
    auto hsa = fake.importer();
    auto small = hsa->import(f.map.base(), page);
    auto large = hsa->import(f.map.base(), 4 * page);
    REQUIRE(small.ok());
    REQUIRE(large.ok());
    CHECK(fake.live_locks() == 2);
    REQUIRE(hsa->release(large.value()).ok());
    REQUIRE(hsa->release(small.value()).ok());
    CHECK(fake.live_locks() == 0);
    CHECK(fake.misuse_count() == 0);
}

TEST_CASE("destroying the importer unlocks what the caller forgot, then shuts down", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    WritableFile f;
    wm::test::CaptureLog log;
    {
        auto hsa = fake.importer();
        REQUIRE(hsa->import(f.map.base(), page).ok());
        REQUIRE(hsa->import(f.map.base() + 2 * page, 2 * page).ok());
        CHECK(fake.live_locks() == 2);
    }
    CHECK(fake.live_locks() == 0);
    CHECK(fake.init_count() == 0);
    CHECK(fake.misuse_count() == 0); // unlocked before hsa_shut_down, not dropped by it
    REQUIRE(log.warnings.size() == 1);
    CHECK_THAT(log.warnings[0], Catch::Contains("2 lock(s) of " + std::to_string(3 * page)));
}

TEST_CASE("imports and releases from several threads, and the budget holds under contention",
          "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    constexpr int threads = 6, rounds = 40;
    wm::test::TempFile file(threads * 2 * page);
    FileMapping map(file.path(), file.size(), true);
    HsaImporterParams params;
    params.lock_budget_bytes = 3 * page; // fewer than the threads: some must be refused
    auto hsa = fake.importer(params);
    std::atomic<std::uint64_t> worst{0};
    std::atomic<int> done{0}, refused{0}, failed{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            std::byte* mine = map.base() + static_cast<std::uint64_t>(t) * 2 * page;
            for (int i = 0; i < rounds; ++i) {
                auto imported = hsa->import(mine, page);
                if (!imported) {
                    ++(imported.error().kind == ErrorKind::limit ? refused : failed);
                    std::this_thread::yield();
                    continue;
                }
                std::uint64_t live = fake.live_bytes();
                for (std::uint64_t w = worst.load(); live > w && !worst.compare_exchange_weak(w, live);) {}
                if (!hsa->release(imported.value())) ++failed;
                ++done;
            }
        });
    }
    for (auto& th : pool) th.join();
    CHECK(failed == 0);
    CHECK(done + refused == threads * rounds);
    CHECK(done > 0);
    CHECK(worst <= 3 * page);
    CHECK(fake.live_locks() == 0);
    CHECK(fake.lock_calls() == fake.unlock_calls());
}

TEST_CASE("an import whose record runs out of memory is unlocked, and says out of memory",
          "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    auto hsa = fake.importer();
    WritableFile f;
    const std::uint64_t faults = wm::test::check_import_out_of_memory(
        *hsa, f.map.base(), 4 * page, [&] { return fake.live_locks(); });
    CHECK(faults >= 1);
}
