// SPDX-License-Identifier: MIT
// The import policy's one home: its names, the rule (import_allowed), a target's policy and the
// reason a refused target falls back with. The planner, the mapping decision and the executor
// each apply it through these, once.
#include "weightmap/import_policy.hpp"

#include <string>

#include <fmt/format.h>

#include "weightmap/planner.hpp" // effective_import_policy, import_policy_refusal

namespace wm {

const char* to_string(DeviceMemory memory) noexcept {
    switch (memory) {
    case DeviceMemory::unknown: return "unknown";
    case DeviceMemory::unified: return "unified";
    case DeviceMemory::discrete: return "discrete";
    case DeviceMemory::coherent: return "coherent";
    }
    return "?";
}

const char* to_string(ImportPolicy policy) noexcept {
    switch (policy) {
    case ImportPolicy::unified_only: return "unified_only";
    case ImportPolicy::always: return "always";
    case ImportPolicy::never: return "never";
    }
    return "?";
}

bool import_allowed(ImportPolicy policy, DeviceMemory memory) noexcept {
    switch (policy) {
    case ImportPolicy::always: return true;
    case ImportPolicy::never: return false;
    case ImportPolicy::unified_only: return memory == DeviceMemory::unified;
    }
    return false;
}

ImportPolicy effective_import_policy(const TargetDesc& target,
                                     const PlanOptions& options) noexcept {
    return target.import_policy.value_or(options.import_policy);
}

std::string import_policy_refusal(const ImporterCaps& caps, ImportPolicy policy,
                                  std::string_view device_memory_note) {
    const DeviceMemory memory = caps.device_memory;
    if (caps.is_cpu || import_allowed(policy, memory)) return {};
    if (policy == ImportPolicy::never) return "import_policy=never";
    const std::string note =
        device_memory_note.empty() ? "" : fmt::format(" ({})", device_memory_note);
    // unified_only refusing: the device is discrete or nobody can tell.
    if (memory == DeviceMemory::discrete)
        return "discrete device" + note + ": imported weights would be read over the bus on "
               "every use; import_policy=always to import anyway";
    if (memory == DeviceMemory::coherent)
        return "coherent device with memory of its own" + note + ": its kernels would read "
               "imported weights over the CPU link (NVLink-C2C, ~450 GB/s each way) instead of "
               "its HBM (~4 TB/s), so a copy decodes faster; import_policy=always to import "
               "anyway (a model larger than the device's memory)";
    return "device memory unknown" + note + ": the importer does not say whether the device "
           "reads host memory at memory speed; import_policy=always to import anyway";
}

} // namespace wm
