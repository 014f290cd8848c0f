// SPDX-License-Identifier: MIT
// The importer conformance suite's view of one importer ("subject"): how to make it, how to
// watch what it does to its driver, and which optional entries it claims. The cases
// (conformance_cases.cpp) are written once against this description and run over every subject
// the executable lists (subjects_host.cpp: CPU, HSA on the fake runtime, the test fakes;
// subjects_vulkan.cpp: the Vulkan importer on lavapipe, default and engine-owned).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weightmap/importer.hpp"

namespace wm::conformance {

/// What a subject lets the suite observe of an importer instance's driver. Each field is
/// empty where the subject has no way to see it; every field that is set is checked.
struct Observation {
    /// Driver calls made so far, all kinds together (monotonic; process-wide is fine as long
    /// as it includes this instance's calls). Vulkan: the recording vkGetDeviceProcAddr
    /// wrapper's calls; HSA: the fake runtime's lock + unlock calls.
    std::optional<std::int64_t> driver_calls;
    /// Driver objects (or imports) alive now. Vulkan: VkDeviceMemory + VkBuffer made through
    /// the recorder and not destroyed; HSA: the fake runtime's live locks; FakeImporter:
    /// live_imports().
    std::optional<std::int64_t> live;
    /// Imports made / released so far (monotonic), for the concurrency balance. Vulkan:
    /// successful imported vkAllocateMemory / vkFreeMemory; HSA: lock / unlock calls;
    /// FakeImporter: imports() / releases().
    std::optional<std::int64_t> made;
    std::optional<std::int64_t> destroyed;
};

/// One live importer of a subject. Members are destroyed in reverse order: `importer` before
/// `keep_alive` (e.g. the test's Vulkan device, which must outlive the importer).
struct Instance {
    std::shared_ptr<void> keep_alive;
    std::unique_ptr<Importer> importer;
    std::function<Observation()> observe; ///< never empty (may return all-empty fields)
};

struct Subject {
    /// Name in the report and in every Catch2 section: "cpu", "vulkan-default", ...
    std::string name;
    /// What Importer::name() must return.
    std::string importer_name;
    /// Only the CPU passthrough may (and must) say caps().is_cpu.
    bool expect_cpu = false;
    /// What caps().device_memory must say on this machine (lavapipe: a CPU device, unified;
    /// the fake HSA runtime's default agent: an APU).
    DeviceMemory expect_memory = DeviceMemory::unified;
    /// read_back() works (not `unsupported`) on this subject's imports.
    bool has_read_back = true;
    /// allocate_copy()/free_copy() work (not `unsupported`).
    bool has_copies = false;
    /// ImportedBuffer::device_address of an import is a host pointer to the same bytes.
    bool device_address_is_host = false;
    /// Non-empty: this subject cannot run on this machine (and why); its cases report SKIP.
    std::function<std::string()> skip_reason;
    /// Makes an importer. A second call while the first instance is alive must make another,
    /// independent importer of the same kind (case 4 hands one's buffers to the other).
    std::function<Instance()> make;
};

/// The subjects of this executable (defined once per executable).
const std::vector<Subject>& subjects();

// --- the per-importer report (conformance_report.cpp) ------------------------------------------

/// Records that `subject` skipped case `case_number` (1-based) and prints WARN("SKIP ...").
void record_skip(const std::string& subject, int case_number, const std::string& reason);

/// Section names are "<subject> | case <n>: <title>"; the report listener parses them.
std::string section_name(const std::string& subject, int case_number, const char* title);

} // namespace wm::conformance
