// SPDX-License-Identifier: MIT
// Allocation-failure injection: this file's translation unit (alloc_fault.cpp) replaces the
// global operator new of the test executable that links it, so a test can make the N-th
// allocation from now throw std::bad_alloc and prove that every acquire-then-record path left
// nothing mapped, locked, registered or open. Link it only into the tests that use it.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <new>

#include "weightmap/importer.hpp"

namespace wm::test {

/// Arms the fault for its lifetime: the `nth` allocation (1-based) made from now on, on any
/// thread, throws std::bad_alloc; later ones succeed again. Not nestable.
class AllocFault {
public:
    explicit AllocFault(std::uint64_t nth);
    ~AllocFault();
    AllocFault(const AllocFault&) = delete;
    AllocFault& operator=(const AllocFault&) = delete;
    /// Whether the armed allocation was reached (and threw).
    bool fired() const;
};

/// Runs `call` with its n-th allocation failing, for n = 1, 2, ... until a run completes without
/// reaching the fault, and `check` after each run (with nothing armed, so Catch2 may allocate).
/// Returns how many runs met the fault. A bad_alloc that `call` lets out is caught here; `call`
/// records what it needs for `check` rather than asserting while the fault is armed.
template <class Call, class Check>
std::uint64_t fail_each_allocation(Call call, Check check) {
    for (std::uint64_t n = 1; n < 100000; ++n) {
        bool fired = false;
        {
            AllocFault fault(n);
            try {
                call();
            } catch (const std::bad_alloc&) {
            }
            fired = fault.fired();
        }
        INFO("allocation " << n << " failed");
        check();
        if (!fired) return n - 1;
    }
    FAIL("the call never completed");
    return 0;
}

/// fail_each_allocation over one import (released when it succeeds) of `importer`: after each
/// run `held()` (what the backend's fake still holds: locks, registrations) must be 0, and a
/// refusal must say out_of_memory, or import_failed where the fake backend's own allocation
/// failed and it answered with an error code. Returns the runs that met the fault.
template <class Held>
std::uint64_t check_import_out_of_memory(Importer& importer, void* host, std::uint64_t size,
                                         Held held) {
    bool refused = false;
    ErrorKind kind = ErrorKind::internal;
    return fail_each_allocation(
        [&] {
            refused = false;
            auto imported = importer.import(host, size);
            if (!imported) {
                refused = true;
                kind = imported.error().kind;
            } else {
                (void)importer.release(imported.value());
            }
        },
        [&] {
            CHECK(held() == 0);
            if (refused)
                CHECK((kind == ErrorKind::out_of_memory || kind == ErrorKind::import_failed));
        });
}

} // namespace wm::test
