// SPDX-License-Identifier: MIT
// registry.hpp - the one explicit table of importers this build knows.
//
// No static self-registration (a linker drops unreferenced objects from static libraries, and the
// importer silently vanishes). Order is preference: the native APIs (HSA, CUDA), then Vulkan, then
// the CPU passthrough last as the fallback that is always available. Every list of importer names
// (create_importer's message, wm-load --importer) is read from this table.
#pragma once

#include <memory>
#include <string_view>

#include "weightmap/export.h"
#include "weightmap/importer.hpp"
#include "weightmap/result.hpp"
#include "weightmap/span.hpp"

namespace wm {

struct ImporterEntry {
    std::string_view name;       ///< what create_importer() takes, e.g. "cpu"
    bool built = false;          ///< compiled into this build (Meson feature option)
    std::string_view build_note; ///< when !built: which option or package was missing
    /// Static caps: an importer of this entry may ask for a writable mapping up front
    /// (caps().needs_writable_mapping; CUDA without read-only registration). HSA does not: it
    /// maps read-only first. decide_mapping() with no importer list creates only such entries' importers
    /// (to ask whether they are available), never a Vulkan device or an HSA runtime for nothing.
    bool may_need_writable_mapping = false;
    /// Creates the importer with its default configuration (HSA: the runtime found by dlopen and
    /// every GPU agent; Vulkan: an instance and device of its own on the first device with
    /// VK_EXT_external_memory_host). Null when !built. The result may still be unavailable():
    /// ask it.
    std::unique_ptr<Importer> (*create_default)() = nullptr;
};

/// The table, in preference order, CPU last. Static storage; thread-safe.
WM_API Span<const ImporterEntry> importer_registry() noexcept;

/// Creates an importer by registry name, or with "auto" the first one that is built and
/// available. Fails with `unsupported` naming the missing option or the importer's own reason.
WM_API Result<std::unique_ptr<Importer>> create_importer(std::string_view name);

/// The CPU passthrough importer: handle = the pointer, pins nothing, never asks for a writable
/// mapping; release only checks that it handed the buffer out.
WM_API std::unique_ptr<Importer> make_cpu_importer();

} // namespace wm
