// SPDX-License-Identifier: MIT
// The HSA importer: hsa_amd_memory_lock of page-aligned ranges of the weight mapping, for the
// agents the engine names (or every GPU agent).
#include "weightmap/backends/hsa.hpp"

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "hsa_pages.hpp"
#include "hsa_runtime.hpp"
#include "internal/align.hpp"
#include "internal/held_ranges.hpp"
#include "backend_factories.hpp"
#include "internal/dl_resolve.hpp"
#include "internal/nothrow.hpp"
#include "internal/undo.hpp"
#include "weightmap/log.hpp"
#include "weightmap/planner.hpp"

namespace wm {
namespace {


std::string list_agents(const std::vector<hsa::Runtime::AgentInfo>& agents) {
    std::string out;
    for (const auto& a : agents)
        out += fmt::format("{}{:#x} {} '{}'", out.empty() ? "" : ", ", a.handle,
                           a.is_gpu ? "GPU" : "non-GPU", a.name);
    return out.empty() ? "none" : out;
}

struct MemoryVerdict {
    DeviceMemory memory = DeviceMemory::unknown;
    std::string note;
};

// One agent's word on how it reaches host memory.
MemoryVerdict classify_agent(const hsa::Runtime::AgentInfo& agent) {
    const std::string name = agent.name.empty() ? "agent" : agent.name;
    if (agent.full_profile) return {DeviceMemory::unified, name + ": HSA_AGENT_INFO_PROFILE FULL"};
    if (agent.is_apu)
        return *agent.is_apu
                   ? MemoryVerdict{DeviceMemory::unified, name + ": AGENT_IS_APU"}
                   : MemoryVerdict{DeviceMemory::discrete,
                                   name + ": HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES without "
                                          "AGENT_IS_APU"};
    return {DeviceMemory::unknown,
            name + ": BASE profile and no HSA_AMD_AGENT_INFO_MEMORY_PROPERTIES (ROCm 5.2 cannot "
                   "tell an APU from a discrete card; HsaImporterParams::device_memory can)"};
}

// The locking agents together: any discrete is discrete (its reads cross the bus), all
// unified is unified, anything else unknown.
MemoryVerdict classify_agents(const std::vector<hsa::Runtime::AgentInfo>& known,
                              const std::vector<hsa_agent_t>& locking) {
    MemoryVerdict all{DeviceMemory::unified, {}};
    for (const hsa_agent_t& agent : locking)
        for (const auto& info : known) {
            if (info.handle != agent.handle) continue;
            MemoryVerdict one = classify_agent(info);
            all.note += (all.note.empty() ? "" : "; ") + one.note;
            if (one.memory == DeviceMemory::discrete || all.memory == DeviceMemory::discrete)
                all.memory = DeviceMemory::discrete;
            else if (one.memory == DeviceMemory::unknown)
                all.memory = DeviceMemory::unknown;
        }
    if (all.note.empty()) all.memory = DeviceMemory::unknown;
    return all;
}

class HsaImporter final : public Importer {
public:
    // runtime == nullptr: unavailable for `reason`.
    HsaImporter(std::unique_ptr<hsa::Runtime> runtime, std::vector<hsa_agent_t> agents,
                std::uint64_t budget, std::string reason, MemoryVerdict memory = {})
        : runtime_(std::move(runtime)), agents_(std::move(agents)), page_(host_page_size()),
          budget_(budget), availability_{runtime_ != nullptr, std::move(reason)},
          memory_(std::move(memory)) {}

    ~HsaImporter() override {
        // Every lock must be gone before hsa_shut_down (the Runtime's destructor) and dlclose.
        std::uint64_t bytes = 0;
        for (const auto& [address, lock] : locks_) {
            bytes += lock.size;
            runtime_->api().memory_unlock(reinterpret_cast<void*>(address));
            internal::drop_range(reinterpret_cast<void*>(address), lock.size);
        }
        if (!locks_.empty())
            log_message({}, LogLevel::warning,
                        fmt::format("hsa importer destroyed with {} lock(s) of {} bytes still "
                                    "held; unlocked them (release every buffer first)",
                                    locks_.size(), bytes));
    }

    std::string_view name() const noexcept override { return "hsa"; }

    ImporterCaps caps() const noexcept override {
        ImporterCaps caps;
        // Read-only first: KFD accepts file-backed read-only pages where the runtime allows it,
        // and a writable mapping makes KFD ask write access of every page (legacy-rocm-build
        // #6523). A runtime that refuses read-only pages gets a refusal with
        // read_only_refusal_marker, and the loader retries on a writable mapping.
        caps.needs_writable_mapping = false;
        caps.alignment = page_; // an unaligned address fails (measured)
        caps.max_import_size = 0;           // the budget is a refusal, not a size to plan around
        caps.is_cpu = false;
        // Unknown on real hardware, so conservative: KFD registers the user pointer for write
        // access, and mprotect of a locked range may invalidate it (docs/hsa.md).
        caps.survives_read_only_reprotect = false;
        caps.device_memory = memory_.memory;
        return caps;
    }

    ImporterNotes notes() const noexcept override {
        // Never handed to the runtime: it answers a bare HSA_STATUS_ERROR (measured upstream).
        return {{}, memory_.note,
                "the page size: hsa_amd_memory_lock rejects any other range; lock an arbitrary "
                "range with hsa_lock_superset", {}};
    }

    Availability available() const override { return availability_; }

protected:
    Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) override {
        if (!runtime_)
            return make_error(ErrorKind::unsupported,
                              fmt::format("hsa importer not available: {}", availability_.reason));
        const auto address = reinterpret_cast<std::uintptr_t>(host_address);
        {
            std::lock_guard<std::mutex> guard(mutex_);
            if (budget_ != 0 && size > budget_ - locked_bytes_)
                return make_error(
                    ErrorKind::limit,
                    fmt::format("hsa import of {} bytes at {} refused: {} bytes already locked and "
                                "the lock budget (HsaImporterParams::lock_budget_bytes) is {}; a "
                                "lock pins every page of its range",
                                size, host_address, locked_bytes_, budget_));
            locked_bytes_ += size; // reserved while the runtime works, so concurrent imports
                                   // cannot both pass the budget
        }
        // Not fatal when it fails: the lock faults in whatever is missing, only slower.
        (void)hsa::populate_for_lock(host_address, size);
        void* agent_pointer = nullptr;
        const hsa_status_t status =
            runtime_->api().memory_lock(host_address, size, agents_.data(),
                                        static_cast<int>(agents_.size()), &agent_pointer);
        if (status != HSA_STATUS_SUCCESS || agent_pointer == nullptr) {
            if (status == HSA_STATUS_SUCCESS) runtime_->api().memory_unlock(host_address);
            {
                std::lock_guard<std::mutex> guard(mutex_);
                locked_bytes_ -= size;
            }
            return lock_refusal(host_address, size, status);
        }
        // Unlocked again when recording it throws (bad_alloc): no lock may outlive its record.
        internal::Undo unlock([&] {
            runtime_->api().memory_unlock(host_address);
            std::lock_guard<std::mutex> guard(mutex_);
            locked_bytes_ -= size;
        });
        {
            std::lock_guard<std::mutex> guard(mutex_);
            locks_.emplace(address, Lock{size, agent_pointer});
        }
        internal::Undo forget([&] {
            std::lock_guard<std::mutex> guard(mutex_);
            auto [it, end] = locks_.equal_range(address);
            for (; it != end; ++it)
                if (it->second.agent_pointer == agent_pointer) {
                    locks_.erase(it);
                    break;
                }
        });
        // So the mapping layer never mprotects or munmaps it while the device may read it.
        internal::hold_range(host_address, size, "hsa");
        forget.dismiss();
        unlock.dismiss();
        ImportedBuffer buffer;
        buffer.host_address = host_address;
        buffer.size = size;
        buffer.device_address = agent_pointer;
        buffer.imported = true;
        return buffer;
    }

    // Why a lock failed. The address is aligned here, so a bare HSA_STATUS_ERROR over pages
    // without PROT_WRITE is the runtime refusing a read-only lock (measured on older ROCm):
    // the marker lets the loader retry on a writable mapping.
    Error lock_refusal(void* host_address, std::uint64_t size, hsa_status_t status) const {
        if (status == HSA_STATUS_SUCCESS)
            return make_error(ErrorKind::import_failed,
                              fmt::format("hsa_amd_memory_lock({}, {:#x}) succeeded but returned "
                                          "a null agent pointer; unlocked it",
                                          host_address, size));
        const bool read_only =
            status == HSA_STATUS_ERROR && !hsa::range_writable(host_address, size);
        return make_error(
            ErrorKind::import_failed,
            fmt::format("hsa_amd_memory_lock({}, {:#x}, {} agent(s)) failed: {}{}", host_address,
                        size, agents_.size(), runtime_->describe(status),
                        read_only ? fmt::format(" (the HSA runtime {}: the pages are mapped "
                                                "without PROT_WRITE; a writable MAP_SHARED "
                                                "mapping of the file may lock)",
                                                read_only_refusal_marker)
                                  : std::string{}));
    }

public:
    std::size_t agent_count() const noexcept { return agents_.size(); }

    // Formatting a message can throw bad_alloc, which a noexcept release must not let out:
    // status_nothrow turns it into out_of_memory. Nothing after the erase throws but the
    // message, so the bookkeeping stays consistent either way.
    Status release_checked(const ImportedBuffer& buffer) noexcept override {
        return internal::status_nothrow([&]() -> Status {
            if (!runtime_)
                return make_error(ErrorKind::invalid_argument,
                                  "hsa release: this importer is not available and holds no locks");
            if (Status forgotten = forget_lock(buffer); !forgotten) return forgotten;
            const hsa_status_t status = runtime_->api().memory_unlock(buffer.host_address);
            internal::drop_range(buffer.host_address, buffer.size);
            {
                // Only now: until the runtime has unlocked, the pages count against the budget.
                std::lock_guard<std::mutex> guard(mutex_);
                locked_bytes_ -= buffer.size;
            }
            if (status != HSA_STATUS_SUCCESS)
                return make_error(ErrorKind::import_failed,
                                  fmt::format("hsa_amd_memory_unlock({}) failed: {}",
                                              buffer.host_address, runtime_->describe(status)));
            return {};
        });
    }

    // Removes the record of `buffer`'s lock; an error when this importer holds no such lock
    // (hsa_amd_memory_unlock of a pointer it did not lock is undefined behaviour).
    Status forget_lock(const ImportedBuffer& buffer) {
        const auto address = reinterpret_cast<std::uintptr_t>(buffer.host_address);
        std::lock_guard<std::mutex> guard(mutex_);
        auto [begin, end] = locks_.equal_range(address);
        auto it = begin;
        while (it != end && (it->second.size != buffer.size ||
                             it->second.agent_pointer != buffer.device_address))
            ++it;
        if (it == end)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("hsa release: {} +{:#x} (agent pointer {}) is not "
                                          "locked by this importer",
                                          buffer.host_address, buffer.size,
                                          buffer.device_address));
        locks_.erase(it);
        return {};
    }

    // The agent pointer need not be host-addressable (on a dGPU it is a GPU virtual address);
    // the lock pins the mapping's own pages, so the host view is what the device reads.
    Status read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                             std::uint64_t size, void* dst) override {
        // A copy: this importer makes none (the base says unsupported).
        if (!buffer.imported) return Importer::read_back_checked(buffer, offset, size, dst);
        if (buffer.host_address == nullptr || offset > buffer.size || size > buffer.size - offset)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("hsa read_back [{}, +{}) outside a buffer of {} bytes at "
                                          "{}", offset, size, buffer.size, buffer.host_address));
        std::memcpy(dst, static_cast<const std::byte*>(buffer.host_address) + offset, size);
        return {};
    }

private:
    struct Lock {
        std::uint64_t size = 0;
        void* agent_pointer = nullptr;
    };

    std::unique_ptr<hsa::Runtime> runtime_; // null when unavailable
    std::vector<hsa_agent_t> agents_;       // passed to every lock; read-only after construction
    const std::uint64_t page_;
    const std::uint64_t budget_;
    const Availability availability_;
    const MemoryVerdict memory_;

    std::mutex mutex_;
    // Keyed by host address; a multimap because hsa_lock_superset() lets an engine lock
    // overlapping supersets (two can start on the same page). Whether ROCr counts two locks of
    // one page is not measured (no /dev/kfd here; docs/hsa.md), so the planner never gives one
    // importer two imports that share a page; this map only keeps one record per lock.
    std::multimap<std::uintptr_t, Lock> locks_;
    std::uint64_t locked_bytes_ = 0; // live locks plus reservations in flight
};

std::unique_ptr<Importer> unavailable(std::string reason) {
    return std::make_unique<HsaImporter>(nullptr, std::vector<hsa_agent_t>{}, 0,
                                         std::move(reason));
}

} // namespace

Result<std::unique_ptr<Importer>> make_hsa_importer(const HsaImporterParams& params) {
    for (std::size_t i = 0; i < params.agents.size(); ++i) {
        if (params.agents[i] == 0)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("HsaImporterParams::agents[{}] is 0, not an agent "
                                          "handle", i));
        for (std::size_t j = 0; j < i; ++j)
            if (params.agents[j] == params.agents[i])
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("HsaImporterParams::agents[{}] = {:#x} repeats "
                                              "agents[{}]", i, params.agents[i], j));
    }
    const std::string path = internal::library_path(params.library_path, "WEIGHTMAP_HSA_LIBRARY",
                                                   "libhsa-runtime64.so.1");
    auto runtime = hsa::Runtime::open(path);
    if (!runtime) return unavailable(std::move(runtime).error().message);

    auto known = runtime.value()->agents();
    if (!known) return unavailable(std::move(known).error().message);

    std::vector<hsa_agent_t> agents;
    if (params.agents.empty()) {
        for (const auto& a : known.value())
            if (a.is_gpu) agents.push_back(hsa_agent_t{a.handle});
        if (agents.empty())
            return unavailable(fmt::format("no GPU agent in the HSA runtime '{}' (agents: {})",
                                           path, list_agents(known.value())));
    } else {
        for (std::size_t i = 0; i < params.agents.size(); ++i) {
            bool found = false;
            for (const auto& a : known.value()) found = found || a.handle == params.agents[i];
            if (!found)
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("HsaImporterParams::agents[{}] = {:#x} is not an "
                                              "agent of the HSA runtime '{}' (agents: {})",
                                              i, params.agents[i], path,
                                              list_agents(known.value())));
            agents.push_back(hsa_agent_t{params.agents[i]});
        }
    }
    MemoryVerdict memory = classify_agents(known.value(), agents);
    if (params.device_memory != DeviceMemory::unknown)
        memory = {params.device_memory,
                  fmt::format("HsaImporterParams::device_memory; the runtime says {}: {}",
                              to_string(memory.memory), memory.note)};
    return std::unique_ptr<Importer>(std::make_unique<HsaImporter>(
        std::move(runtime).value(), std::move(agents), params.lock_budget_bytes, std::string{},
        std::move(memory)));
}

std::unique_ptr<Importer> create_default_hsa_importer() {
    auto importer = make_hsa_importer({});
    // Default params name no agents, so this cannot fail; stay non-null whatever happens.
    if (!importer) return unavailable(importer.error().message);
    return std::move(importer).value();
}

Result<std::uint32_t> hsa_lock_agent_count(const Importer& hsa_importer) {
    const auto* hsa = dynamic_cast<const HsaImporter*>(&hsa_importer);
    if (hsa == nullptr)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("hsa_lock_agent_count: importer '{}' was not made by "
                                      "make_hsa_importer", hsa_importer.name()));
    if (!hsa->available().available)
        return make_error(ErrorKind::unsupported,
                          fmt::format("hsa importer not available: {}",
                                      hsa->available().reason));
    return static_cast<std::uint32_t>(hsa->agent_count());
}

Result<HsaLockedRange> hsa_lock_superset(Importer& hsa_importer, const void* address,
                                         std::uint64_t size) {
    if (dynamic_cast<HsaImporter*>(&hsa_importer) == nullptr)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("hsa_lock_superset: importer '{}' was not made by "
                                      "make_hsa_importer", hsa_importer.name()));
    const auto begin = reinterpret_cast<std::uintptr_t>(address);
    if (address == nullptr || size == 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("hsa_lock_superset: null address ({}) or zero size ({})",
                                      address, size));
    const std::uint64_t page = hsa_importer.caps().alignment;
    if (size > UINTPTR_MAX - begin || begin + size > align_down(UINTPTR_MAX, page))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("hsa_lock_superset: {} +{:#x} wraps the address space "
                                      "when aligned to {} bytes", address, size, page));
    const std::uint64_t start = align_down(begin, page);
    const std::uint64_t end = align_up_saturating(begin + size, page);
    // The lock does not write through the pointer; HSA merely requires writable pages.
    auto imported =
        hsa_importer.import(reinterpret_cast<void*>(static_cast<std::uintptr_t>(start)),
                            end - start);
    if (!imported) {
        Error error = std::move(imported).error();
        error.message = fmt::format("hsa_lock_superset({} +{:#x}): {}", address, size,
                                    error.message);
        return error;
    }
    HsaLockedRange range;
    range.importer_ = &hsa_importer;
    range.buffer_ = imported.value();
    range.delta_ = begin - start;
    return range;
}

} // namespace wm
