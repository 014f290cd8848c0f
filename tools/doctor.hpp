// SPDX-License-Identifier: MIT
// What libweightmap would do with one model on this machine, per importer, before anything is
// loaded: wm-doctor's findings as data (doctor.cpp makes them, wm_doctor.cpp prints them).
//
// Every answer comes from the calls a load makes: the registry's importers and their caps and
// notes, import_allowed (the policy), decide_mapping, the planner on the model's own headers, one
// import of the file's first page read back through the device (what the load's first import
// would meet: RADV's file-page refusal, an HSA runtime that locks only writable pages, a
// filesystem that refuses pins), and a FileGuard on the file (the lease).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightmap/formats.hpp"
#include "weightmap/placement_rules.hpp"
#include "weightmap/planner.hpp"

namespace wm::doctor {

/// Whose load the doctor predicts. llama_cpp: the LLAMA_WEIGHTMAP series (tok_embd stays on the
/// CPU, llama-model.cpp's dev_input; the CUDA and HIP kernels' 32-byte tensor alignment, patch
/// 0016). library: wm::load_model as wm-load runs it (every tensor on the device unless a rule
/// says otherwise).
enum class Engine { llama_cpp, library };

struct Options {
    std::vector<std::string> files;
    std::vector<std::string> backends; ///< registry names; empty: every built non-CPU importer
    Engine engine = Engine::llama_cpp;
    PlacementRules rules;              ///< the user's -ot / --cpu-moe, before the engine's own
    PlanOptions plan;
    std::uint64_t tensor_alignment = 0; ///< --tensor-alignment; 0: the engine's and importer's
};

/// The file as the machine holds it.
struct FileFacts {
    std::string path;
    std::string filesystem;  ///< "ext4", "tmpfs", "nfs", ... or "unknown (0x...)"
    std::string mount_point; ///< from /proc/self/mountinfo; empty when not found
    bool dax = false;        ///< mounted -o dax: the kernel refuses long-term pins of its pages
    bool lease = false;      ///< a read lease was taken (and released again)
    std::string lease_reason; ///< why not (the kernel's answer), or a note on it
    std::string lease_advice; ///< without a lease: what a change of the file does, what to change
};

/// One group of tensors that differ only in their layer number ("blk.*.attn_q.weight").
struct TensorGroup {
    std::string name;
    std::uint32_t tensors = 0;
    std::uint64_t bytes = 0;
    std::uint32_t on_cpu = 0;      ///< placed on the CPU by a rule (neither imported nor copied)
    std::uint32_t fallbacks = 0;   ///< device tensors that would be copied
    std::string fallback_reason;   ///< the first one's
    std::uint32_t padded_rows = 0; ///< llama.cpp on CUDA/HIP: quantized rows not a multiple of 512
};

struct Device {
    std::string backend;      ///< registry name: "vulkan", "cuda", "hsa"
    bool usable = false;      ///< built, created and available
    std::string unusable_reason;
    std::string method;       ///< "vulkan import", "cuda direct", "cuda register", "hsa lock", "none"
    std::string device_class; ///< to_string(DeviceMemory)
    std::string device_note;  ///< what the class was read from
    bool policy_imports = false;
    std::string policy_reason;
    std::string mapping;      ///< to_string(MappingAccess)
    std::string mapping_reason;
    bool probe_ran = false;
    bool probe_ok = false;
    std::string probe_reason; ///< what the first page's import and read-back met
    std::uint64_t device_bytes = 0;
    std::uint64_t import_bytes = 0;
    std::uint64_t copy_bytes = 0;
    std::uint64_t cpu_bytes = 0;
    std::uint64_t pinned_bytes = 0;
    std::uint64_t imports = 0;
    std::uint64_t tensor_alignment = 1;
    std::vector<TensorGroup> groups;
    std::uint64_t saves_bytes = 0; ///< against upstream llama.cpp's default on this device
    std::string verdict;           ///< one line: imports, or why not
    std::vector<std::string> advice; ///< what to change, one line per "no"
};

struct Diagnosis {
    ModelInfo model;
    FileFacts file;
    std::vector<Device> devices;
};

/// The doctor's run; an unreadable or malformed model, or a bad option, is the error (naming the
/// file and field). A backend that cannot be used is a finding, not an error.
Result<Diagnosis> diagnose(const Options& options);

const char* to_string(Engine engine) noexcept;

} // namespace wm::doctor
