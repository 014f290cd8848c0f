// SPDX-License-Identifier: MIT
// model.hpp - how an engine describes its weights to the planner: files, targets and tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/importer.hpp"

namespace wm {

/// One file of the model (a split GGUF is one model of several files).
struct FileDesc {
    std::string path;        ///< for messages and for the mapping layer; may be empty in tests
    std::uint64_t size = 0;  ///< bytes; every tensor must end at or before it
};

/// Where the engine placed a group of tensors: a buffer type / device it chose. The CPU is a
/// target too. Targets that share an importer instance share `importer_key`, which is how the
/// planner keeps their imports from sharing pages.
struct TargetDesc {
    std::string name;          ///< engine's label, e.g. "Vulkan0", "CPU"
    std::string importer_key;  ///< importer identity, e.g. its name(); empty: the target's name
    ImporterCaps caps;         ///< of the importer that serves this target
    /// When this target imports; nullopt: PlanOptions::import_policy.
    std::optional<ImportPolicy> import_policy = std::nullopt;
    /// The importer's ImporterNotes, copied (a ModelDesc may outlive its importers): the
    /// planner's reasons quote them. Empty when unknown.
    std::string file_pages_note{};
    std::string device_memory_note{};
};

/// One weight tensor as the engine placed it.
struct TensorDesc {
    std::string name;
    std::uint32_t file = 0;      ///< index into ModelDesc::files
    std::uint64_t offset = 0;    ///< absolute byte offset of the data in that file
    std::uint64_t size = 0;      ///< bytes of data
    std::uint32_t target = 0;    ///< index into ModelDesc::targets
};

/// Everything the planner reads. Tensors may come in any order.
struct ModelDesc {
    std::vector<FileDesc> files;
    std::vector<TargetDesc> targets;
    std::vector<TensorDesc> tensors;
};

/// A target served by `importer` (its caps, notes and name as key).
WM_API TargetDesc target_for(std::string name, const Importer& importer);

} // namespace wm
