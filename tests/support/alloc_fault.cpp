// SPDX-License-Identifier: MIT
// Replaces operator new and delete with malloc and free plus a countdown (alloc_fault.hpp).
// Every variant is replaced, so that AddressSanitizer sees matching pairs (malloc/free).
#include "support/alloc_fault.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<std::uint64_t> countdown{0}; // 0: disarmed; otherwise allocations left until the fault
std::atomic<bool> fault_fired{false};

// True when this allocation is the armed one.
bool fault_now() noexcept {
    std::uint64_t left = countdown.load(std::memory_order_relaxed);
    while (left != 0) {
        if (countdown.compare_exchange_weak(left, left - 1)) {
            if (left != 1) return false;
            fault_fired.store(true);
            return true;
        }
    }
    return false;
}

void* allocate(std::size_t size) {
    if (fault_now()) throw std::bad_alloc();
    if (void* p = std::malloc(size != 0 ? size : 1)) return p;
    throw std::bad_alloc();
}

void* allocate_nothrow(std::size_t size) noexcept {
    if (fault_now()) return nullptr;
    return std::malloc(size != 0 ? size : 1);
}
} // namespace

wm::test::AllocFault::AllocFault(std::uint64_t nth) {
    fault_fired.store(false);
    countdown.store(nth);
}
wm::test::AllocFault::~AllocFault() { countdown.store(0); }
bool wm::test::AllocFault::fired() const { return fault_fired.load(); }

void* operator new(std::size_t size) { return allocate(size); }
void* operator new[](std::size_t size) { return allocate(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return allocate_nothrow(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    return allocate_nothrow(size);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
