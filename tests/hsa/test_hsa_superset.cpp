// SPDX-License-Identifier: MIT
// hsa_lock_superset: an arbitrary (unaligned) range is locked as its page-aligned superset, the
// delta is kept so the agent address points at the requested byte, and the lock is RAII.
#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>

#include "hsa/fake_hsa.hpp"
#include "support/temp_file.hpp"
#include "weightmap/backends/hsa.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::FakeHsa;
using wm::test::FileMapping;

namespace {
const std::uint64_t page = host_page_size();
}

TEST_CASE("an unaligned range locks its page-aligned superset and keeps the delta", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    wm::test::TempFile file(16 * page + 123);
    FileMapping map(file.path(), file.size(), true);
    auto hsa = fake.importer();

    // A tensor as the loader sees it: mapping + an unaligned offset, an unaligned size.
    const std::uint64_t offset = 2 * page + 904, size = 3 * page + 17;
    std::byte* tensor = map.base() + offset;
    {
        auto locked = hsa_lock_superset(*hsa, tensor, size);
        REQUIRE(locked.ok());
        const HsaLockedRange& range = locked.value();
        CHECK(range.locked());
        CHECK(range.delta() == 904);
        // Start aligned down, end aligned up: pages 2..5 (the tensor ends inside page 5).
        CHECK(range.buffer().host_address == map.base() + 2 * page);
        CHECK(range.buffer().size == 4 * page);
        CHECK(fake.is_locked(map.base() + 2 * page, 4 * page));
        // The agent address is the runtime's pointer for the aligned start, plus the delta.
        CHECK(range.agent_address() == tensor + fake.agent_aperture());
        CHECK(static_cast<std::byte*>(range.buffer().device_address) + range.delta() ==
              range.agent_address());
        // The superset covers every byte asked for.
        auto* first = static_cast<const unsigned char*>(range.buffer().host_address) + range.delta();
        CHECK(first[0] == wm::test::pattern_byte(offset));
        CHECK(first[size - 1] == wm::test::pattern_byte(offset + size - 1));
    }
    CHECK(fake.live_locks() == 0); // destruction unlocked it
}

TEST_CASE("an aligned range is locked as it is, with delta 0", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    wm::test::TempFile file(8 * page);
    FileMapping map(file.path(), file.size(), true);
    auto hsa = fake.importer();
    auto locked = hsa_lock_superset(*hsa, map.base() + page, 2 * page);
    REQUIRE(locked.ok());
    CHECK(locked->delta() == 0);
    CHECK(locked->buffer().host_address == map.base() + page);
    CHECK(locked->buffer().size == 2 * page);
    CHECK(locked->agent_address() == locked->buffer().device_address);
    REQUIRE(locked->release().ok());
    CHECK_FALSE(locked->locked());
    CHECK(fake.live_locks() == 0);
    CHECK(locked->release().ok()); // a no-op once released
    CHECK(fake.unlock_calls() == 1);
}

TEST_CASE("a locked range moves with its lock and unlocks exactly once", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    wm::test::TempFile file(8 * page);
    FileMapping map(file.path(), file.size(), true);
    auto hsa = fake.importer();
    {
        auto locked = hsa_lock_superset(*hsa, map.base() + 10, 20);
        REQUIRE(locked.ok());
        HsaLockedRange moved(std::move(locked).value());
        CHECK(moved.locked());
        HsaLockedRange assigned;
        assigned = std::move(moved);
        CHECK_FALSE(moved.locked()); // NOLINT(bugprone-use-after-move): the contract under test
        CHECK(assigned.locked());
        CHECK(fake.live_locks() == 1);

        // Assigning over a live range releases the old lock first.
        auto other = hsa_lock_superset(*hsa, map.base() + 4 * page, 1);
        REQUIRE(other.ok());
        CHECK(fake.live_locks() == 2);
        assigned = std::move(other).value();
        CHECK(fake.live_locks() == 1);
        CHECK(fake.is_locked(map.base() + 4 * page, page));
    }
    CHECK(fake.live_locks() == 0);
    CHECK(fake.unlock_calls() == 2);
    CHECK(fake.misuse_count() == 0);
}

TEST_CASE("a read-only mapping fails the superset lock on a runtime that refuses read-only "
          "pages and leaves nothing locked", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    fake.set_refuse_read_only(true);
    wm::test::TempFile file(8 * page);
    FileMapping ro(file.path(), file.size(), false);
    auto hsa = fake.importer();
    auto locked = hsa_lock_superset(*hsa, ro.base() + 100, page);
    REQUIRE_FALSE(locked.ok());
    CHECK(locked.error().kind == ErrorKind::import_failed);
    CHECK_THAT(locked.error().message,
               Catch::Contains("hsa_lock_superset(") &&
                   Catch::Contains("HSA_STATUS_ERROR: A generic error has occurred.") &&
                   Catch::Contains(std::string(read_only_refusal_marker)));
    CHECK(fake.lock_calls() == 1);
    CHECK(fake.live_locks() == 0);
}

TEST_CASE("the superset helper refuses other importers and unusable ranges", "[hsa]") {
    FakeHsa& fake = FakeHsa::fresh();
    wm::test::TempFile file(4 * page);
    FileMapping map(file.path(), file.size(), true);

    auto cpu = make_cpu_importer();
    auto not_hsa = hsa_lock_superset(*cpu, map.base(), page);
    REQUIRE_FALSE(not_hsa.ok());
    CHECK(not_hsa.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(not_hsa.error().message, Catch::Contains("'cpu' was not made by make_hsa_importer"));

    auto hsa = fake.importer();
    CHECK_FALSE(hsa_lock_superset(*hsa, nullptr, page).ok());
    CHECK_FALSE(hsa_lock_superset(*hsa, map.base(), 0).ok());
    const void* near_top = reinterpret_cast<const void*>(UINTPTR_MAX - page);
    auto wraps = hsa_lock_superset(*hsa, near_top, 2 * page);
    REQUIRE_FALSE(wraps.ok());
    CHECK_THAT(wraps.error().message, Catch::Contains("wraps the address space"));
    CHECK(fake.lock_calls() == 0);
}
