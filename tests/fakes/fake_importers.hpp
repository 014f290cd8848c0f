// SPDX-License-Identifier: MIT
// Fake importers for tests: each enforces one requirement a real importer has, and records
// every call so tests can prove what was (and was not) handed to it.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "weightmap/importer.hpp"

namespace wm::test {

/// Default caps (alignment 1) of a device with unified memory: what the default policy imports.
inline ImporterCaps unified_caps() {
    ImporterCaps caps;
    caps.device_memory = DeviceMemory::unified;
    return caps;
}

/// Records every import and release; can refuse the N-th import, unaligned input, or pages that
/// are not writable. Counts live imports so a test can assert nothing stays imported.
class FakeImporter : public Importer {
public:
    struct Call {
        void* address;
        std::uint64_t size;
    };

    /// The default caps: alignment 1, a unified device (so the default policy imports).
    explicit FakeImporter(std::string name = "fake", ImporterCaps caps = unified_caps());

    std::string_view name() const noexcept override { return name_; }
    ImporterCaps caps() const noexcept override { return caps_; }
    ImporterNotes notes() const noexcept override {
        return {file_pages_note_, device_memory_note_, {}, {}};
    }
    Availability available() const override { return availability_; }
    Status release_checked(const ImportedBuffer& buffer) noexcept override;

    // --- behaviour switches -------------------------------------------------------------
    /// The N-th import (1-based) fails; 0 never.
    std::uint64_t fail_import_at = 0;
    /// The N-th release (1-based) reports failure (the buffer is still dropped); 0 never.
    std::uint64_t fail_release_at = 0;
    /// Refuse an address or size not aligned to this (0: caps.alignment).
    bool reject_unaligned = false;
    /// Refuse a range whose pages are not all PROT_WRITE (read from /proc/self/maps), like
    /// hsa_amd_memory_lock on a PROT_READ mapping.
    bool reject_read_only = false;
    /// Return host_address + this instead of host_address (a broken importer).
    std::uint64_t misalign_result_by = 0;
    void set_unavailable(std::string reason) { availability_ = {false, std::move(reason)}; }
    /// What caps() reports from now on (a device that changed its answer after planning).
    void set_caps(ImporterCaps caps) { caps_ = caps; }
    /// What notes() reports; set before the importer is shared with other threads.
    void set_notes(std::string file_pages, std::string device_memory) {
        file_pages_note_ = std::move(file_pages);
        device_memory_note_ = std::move(device_memory);
    }

    // --- what happened ------------------------------------------------------------------
    std::vector<Call> imports() const;
    std::vector<Call> releases() const;
    std::int64_t live_imports() const;

protected:
    Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) override;

private:
    std::string name_;
    ImporterCaps caps_;
    std::string file_pages_note_, device_memory_note_ = "a test's fake, unified by construction";
    Availability availability_{true, {}};
    mutable std::mutex mutex_;
    std::vector<Call> imports_, releases_;
    std::uint64_t import_calls_ = 0, release_calls_ = 0;
    std::int64_t live_ = 0;
    std::multiset<std::pair<void*, std::uint64_t>> outstanding_; // live imports, by (host, size)
};

/// True when every page of [address, address + size) lies in a mapping with 'w' permission.
bool range_is_writable(const void* address, std::uint64_t size);

/// Caps of a device importer like HSA: needs writable pages, page alignment; unified memory.
ImporterCaps device_caps(std::uint64_t alignment = 4096, bool needs_writable = false);

} // namespace wm::test
