// SPDX-License-Identifier: MIT
// The tests' handle on the fake HSA runtime (fake_hsa_runtime.cpp) and on the mappings they lock.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <dlfcn.h>

#include "support/file_mapping.hpp"
#include "weightmap/backends/hsa.hpp"
#include "weightmap/executor.hpp"

#ifndef WEIGHTMAP_FAKE_HSA_PATH
#error "tests/hsa/meson.build passes the fake runtime's path as WEIGHTMAP_FAKE_HSA_PATH"
#endif

namespace wm::test {

inline constexpr const char* fake_hsa_path = WEIGHTMAP_FAKE_HSA_PATH;

/// Opens the fake (the importer's dlopen of the same path then shares this instance) and keeps
/// it open for the whole process, so its unload-time leak check runs at exit.
class FakeHsa {
public:
    /// The process's one handle, reset to the default configuration: call it at the start of
    /// every test case.
    static FakeHsa& fresh() {
        static FakeHsa fake;
        fake.reset();
        return fake;
    }

    FakeHsa() {
        handle_ = dlopen(fake_hsa_path, RTLD_NOW | RTLD_LOCAL);
        if (handle_ == nullptr) throw std::runtime_error(std::string("dlopen fake: ") + dlerror());
        bind(reset_, "fake_hsa_reset");
        bind(set_init_status_, "fake_hsa_set_init_status");
        bind(set_gpu_agent_count_, "fake_hsa_set_gpu_agent_count");
        bind(set_fail_lock_at_, "fake_hsa_set_fail_lock_at");
        bind(set_memory_model_, "fake_hsa_set_memory_model");
        bind(live_locks_, "fake_hsa_live_locks");
        bind(live_bytes_, "fake_hsa_live_bytes");
        bind(is_locked_, "fake_hsa_is_locked");
        bind(lock_calls_, "fake_hsa_lock_calls");
        bind(unlock_calls_, "fake_hsa_unlock_calls");
        bind(init_count_, "fake_hsa_init_count");
        bind(misuse_count_, "fake_hsa_misuse_count");
        bind(last_lock_agents_, "fake_hsa_last_lock_agents");
        bind(agent_handle_, "fake_hsa_agent_handle");
        bind(agent_aperture_, "fake_hsa_agent_aperture");
        bind(set_refuse_read_only_, "fake_hsa_set_refuse_read_only");
        bind(lock_record_count_, "fake_hsa_lock_record_count");
        bind(lock_record_, "fake_hsa_lock_record");
        bind(overlaps_lock_, "fake_hsa_overlaps_lock");
    }
    // The handle is deliberately never closed (see above).
    FakeHsa(const FakeHsa&) = delete;
    FakeHsa& operator=(const FakeHsa&) = delete;

    /// One CPU and one GPU agent, hsa_init succeeds, no injected failure, counters zeroed.
    void reset() { reset_(); }
    void set_init_status(int status) { set_init_status_(status); }
    void set_gpu_agent_count(int count) { set_gpu_agent_count_(count); }
    /// What the GPU agents report about their memory (the fake's MemoryModel).
    enum class Memory { rocm52_base = 0, newer_apu = 1, newer_dgpu = 2, full_profile = 3 };
    void set_memory_model(Memory model) { set_memory_model_(static_cast<int>(model)); }
    /// The n-th lock from now (1-based) fails with `status`; 0: never.
    void set_fail_lock_at(long n, int status) { set_fail_lock_at_(n, status); }
    long live_locks() const { return live_locks_(); }
    std::uint64_t live_bytes() const { return live_bytes_(); }
    bool is_locked(const void* host, std::uint64_t size) const { return is_locked_(host, size) != 0; }
    long lock_calls() const { return lock_calls_(); }
    long unlock_calls() const { return unlock_calls_(); }
    int init_count() const { return init_count_(); }
    long misuse_count() const { return misuse_count_(); }
    std::vector<std::uint64_t> last_lock_agents() const {
        std::vector<std::uint64_t> out(16);
        int n = last_lock_agents_(out.data(), static_cast<int>(out.size()));
        out.resize(static_cast<std::size_t>(n));
        return out;
    }
    /// Refuse locks of pages mapped without PROT_WRITE (HSA_STATUS_ERROR), as a runtime that
    /// locks read-write only; the default accepts them.
    void set_refuse_read_only(bool refuse) { set_refuse_read_only_(refuse ? 1 : 0); }
    /// A lock call as the fake saw its pages: how many, how many were in the page cache
    /// (mincore) and how many mapped in the process (pagemap) at that moment.
    struct LockRecord {
        std::uint64_t pages = 0, resident = 0, mapped = 0;
    };
    /// The lock calls since the last reset that reached the page checks, in order.
    std::vector<LockRecord> lock_records() const {
        std::vector<LockRecord> out(static_cast<std::size_t>(lock_record_count_()));
        for (std::size_t i = 0; i < out.size(); ++i)
            lock_record_(static_cast<long>(i), &out[i].pages, &out[i].resident, &out[i].mapped);
        return out;
    }
    /// Whether any byte of [host, host + size) is in a live lock.
    bool overlaps_lock(const void* host, std::uint64_t size) const {
        return overlaps_lock_(host, size) != 0;
    }
    /// 0: the CPU agent; 1..: the GPU agents.
    std::uint64_t agent_handle(int index) const { return agent_handle_(index); }
    std::uint64_t agent_aperture() const { return agent_aperture_(); }

    /// An HSA importer on the fake with `params` (library_path filled in).
    std::unique_ptr<Importer> importer(HsaImporterParams params = {}) const {
        params.library_path = fake_hsa_path;
        auto made = make_hsa_importer(params);
        if (!made) throw std::runtime_error("make_hsa_importer: " + made.error().message);
        return std::move(made).value();
    }

private:
    template <class Fn>
    void bind(Fn& fn, const char* name) {
        fn = reinterpret_cast<Fn>(dlsym(handle_, name));
        if (fn == nullptr) throw std::runtime_error(std::string("fake lacks ") + name);
    }
    void* handle_ = nullptr;
    void (*reset_)() = nullptr;
    void (*set_init_status_)(int) = nullptr;
    void (*set_gpu_agent_count_)(int) = nullptr;
    void (*set_fail_lock_at_)(long, int) = nullptr;
    void (*set_memory_model_)(int) = nullptr;
    long (*live_locks_)() = nullptr;
    std::uint64_t (*live_bytes_)() = nullptr;
    int (*is_locked_)(const void*, std::uint64_t) = nullptr;
    long (*lock_calls_)() = nullptr;
    long (*unlock_calls_)() = nullptr;
    int (*init_count_)() = nullptr;
    long (*misuse_count_)() = nullptr;
    int (*last_lock_agents_)(std::uint64_t*, int) = nullptr;
    std::uint64_t (*agent_handle_)(int) = nullptr;
    std::uint64_t (*agent_aperture_)() = nullptr;
    void (*set_refuse_read_only_)(int) = nullptr;
    long (*lock_record_count_)() = nullptr;
    int (*lock_record_)(long, std::uint64_t*, std::uint64_t*, std::uint64_t*) = nullptr;
    int (*overlaps_lock_)(const void*, std::uint64_t) = nullptr;
};

} // namespace wm::test
