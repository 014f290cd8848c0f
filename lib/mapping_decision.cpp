// SPDX-License-Identifier: MIT
// decide_mapping: which access the weight files need, from the importers that will import. A
// layer above the OS mapping (mapping.cpp): it asks the importers, creates the registry's
// defaults when the engine gave none, and applies the import policy.
#include "weightmap/mapping.hpp"

#include <memory>
#include <vector>

#include <fmt/format.h>

#include "internal/writable_reopen.hpp"
#include "weightmap/registry.hpp"

namespace wm {

MappingDecision decide_mapping(Span<const std::string> paths, Span<Importer* const> importers,
                               ImportPolicy policy) {
    // Registry defaults when the engine gave no list; they live only for this decision.
    std::vector<std::unique_ptr<Importer>> defaults;
    std::vector<Importer*> considered(importers.begin(), importers.end());
    if (considered.empty()) {
        for (const ImporterEntry& entry : importer_registry()) {
            if (!entry.built || entry.create_default == nullptr ||
                !entry.may_need_writable_mapping)
                continue;
            defaults.push_back(entry.create_default());
            considered.push_back(defaults.back().get());
        }
    }
    std::string needing;
    for (Importer* importer : considered) {
        if (importer == nullptr) continue;
        ImporterCaps caps = importer->caps();
        if (caps.is_cpu || !caps.needs_writable_mapping) continue;
        if (!import_allowed(policy, caps.device_memory)) continue; // it will not import
        if (!importer->available().available) continue;
        needing += fmt::format("{}'{}'", needing.empty() ? "" : ", ", importer->name());
    }
    MappingDecision decision;
    if (needing.empty()) {
        decision.reason = fmt::format("read-only: no available non-CPU importer needs a "
                                      "writable mapping (import_policy {})", to_string(policy));
        return decision;
    }
    // The mapping's own rules (owner + owner-write bit + same inode), not open(O_RDWR): root
    // opens a 0444 file O_RDWR, and its owner made it read-only for a reason.
    for (const std::string& path : paths) {
        if (Status s = internal::check_writable(path); !s) {
            decision.unwritable_path = path;
            decision.reason = fmt::format("read-only: importer {} needs a writable mapping but "
                                          "weight file not writable: {} ({})",
                                          needing, path, s.error().message);
            return decision;
        }
    }
    decision.access = MappingAccess::writable;
    decision.reason = fmt::format("writable shared: importer {} needs it and all {} file(s) "
                                  "are writable", needing, paths.size());
    return decision;
}

} // namespace wm
