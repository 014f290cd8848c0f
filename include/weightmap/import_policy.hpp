// SPDX-License-Identifier: MIT
// import_policy.hpp - whether an import pays on a device: how the device reaches imported
// memory (a capability the importer reports) and when to import (a policy the engine sets).
//
// An import puts a weight where the device reads it from host memory. On a unified-memory device
// (an APU, GB10, GH200, Jetson; lavapipe) that removes a second copy of the same bytes: the seed
// measured 3927 -> 1245 MiB of GTT and 49.4 -> 53.1 t/s on a Strix Halo APU. On a discrete GPU
// it moves every read of that weight onto the PCIe bus, which is why llama.cpp restricted CUDA's
// mmap import to integrated GPUs (PR #22120). docs/planner.md has the sources.
#pragma once

#include <cstdint>

#include "weightmap/export.h"

namespace wm {

/// How the device an importer serves reaches the memory it imports. Reported by the importer
/// from the API (Vulkan: VkPhysicalDeviceType and the memory heaps; HSA: the agent's profile and
/// host-access attribute; CUDA: the integrated attribute), never guessed from a name.
enum class DeviceMemory : std::uint8_t {
    /// The importer cannot tell. Under ImportPolicy::unified_only such a target falls back: the
    /// engine's own copy is never slower than today, an import on a discrete card might be.
    unknown = 0,
    /// The device's memory is host memory (or it reads host memory coherently at memory speed):
    /// an import removes a copy and costs no bandwidth. The CPU is unified.
    unified = 1,
    /// The device has its own memory behind a bus: an imported weight is read over the bus on
    /// every use.
    discrete = 2,
    /// The device has its own memory and reads host memory coherently over a CPU link (GH200,
    /// GB200, GB300: NVLink-C2C, ~450 GB/s each way against HBM3's ~4 TB/s, NVIDIA's GH200
    /// datasheet): an import works, but decode would read every weight over the link. Copied
    /// by default, like discrete; ImportPolicy::always imports (a model larger than the HBM).
    coherent = 3,
};
WM_API const char* to_string(DeviceMemory memory) noexcept;

/// When a non-CPU target imports. The CPU's passthrough is not an import and ignores it.
enum class ImportPolicy : std::uint8_t {
    /// The default: import only on a device that reports DeviceMemory::unified.
    unified_only = 0,
    /// Import wherever the importer accepts (a discrete card trades bus reads for device memory:
    /// worth it when the weights would not fit otherwise).
    always = 1,
    /// Never import: every region of the target falls back (a per-target control arm).
    never = 2,
};
WM_API const char* to_string(ImportPolicy policy) noexcept;

/// True when `policy` lets a device of kind `memory` import.
WM_API bool import_allowed(ImportPolicy policy, DeviceMemory memory) noexcept;

} // namespace wm
