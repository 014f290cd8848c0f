// SPDX-License-Identifier: MIT
// Everything a plan promises (planner.hpp's list), checked in one place for the unit tests and
// the fuzzer alike. Returns the broken promises as text; empty means the plan keeps them all.
// O(n log n), so it runs on every randomised layout. No test framework: the fuzzer traps on a
// non-empty answer, the Catch2 tests CHECK it (plan_fixtures.hpp: check_plan).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "weightmap/planner.hpp"

namespace wm::test {

namespace detail {

struct Violations {
    std::vector<std::string> list;
    template <class... Parts>
    void add(const Parts&... parts) {
        std::ostringstream line;
        (line << ... << parts);
        list.push_back(line.str());
    }
};

inline std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

using ExtentsByImporter =
    std::map<std::pair<std::string, std::uint32_t>, std::vector<std::pair<std::uint64_t, std::uint64_t>>>;

// A region's own bookkeeping: its tensors are its target's in its file, by offset, and its
// first/last/ctx_bytes add up.
inline void check_region(const ModelDesc& m, const PlanRegion& region, std::uint32_t r,
                         Violations& v) {
    std::uint64_t first = UINT64_MAX, last = 0, ctx = 0, previous = 0;
    for (std::uint32_t t : region.tensors) {
        if (t >= m.tensors.size()) {
            v.add("region ", r, " lists tensor ", t, " of ", m.tensors.size());
            return;
        }
        const TensorDesc& td = m.tensors[t];
        if (td.target != region.target || td.file != region.file)
            v.add("region ", r, " lists tensor ", t, " of another target or file");
        if (td.offset < previous) v.add("region ", r, " tensors are not sorted by offset");
        previous = td.offset;
        first = std::min(first, td.offset);
        last = std::max(last, td.offset + td.size);
        ctx += td.size;
    }
    if (!region.tensors.empty() && (region.first != first || region.last != last))
        v.add("region ", r, " first/last ", region.first, "/", region.last, " != ", first, "/",
              last);
    if (region.ctx_bytes != ctx) v.add("region ", r, " ctx_bytes ", region.ctx_bytes, " != ", ctx);
    if ((region.decision == Decision::import) == region.runs.empty())
        v.add("region ", r, " decision disagrees with its ", region.runs.size(), " runs");
    if (region.reason.empty()) v.add("region ", r, " has no reason");
}

// One run: aligned, inside the mapped length, within the limit, in file order, its tensors
// resolving to extent_offset + offset_in_run == file offset inside the extent, each
// offset_in_run a multiple of the importer's tensor alignment.
inline void check_run(const ModelDesc& m, const Plan& p, std::uint32_t r, std::uint32_t k,
                      std::uint64_t& previous_end, std::vector<std::uint32_t>& seen,
                      Violations& v) {
    const PlanRegion& region = p.regions[r];
    const PlanRun& run = region.runs[k];
    const TargetDesc& target = m.targets[region.target];
    const bool cpu = target.caps.is_cpu;
    const std::uint64_t align =
        cpu ? p.page_size
            : std::max({p.page_size, target.caps.alignment, target.caps.tensor_alignment});
    const std::uint64_t tensor_align = cpu ? 1 : std::max<std::uint64_t>(target.caps.tensor_alignment, 1);
    const std::uint64_t mapped = round_up(m.files[region.file].size, p.page_size);
    const auto where = [&] {
        std::ostringstream s;
        s << "region " << r << " run " << k << " [" << run.extent_offset << ", +"
          << run.extent_size << "): ";
        return s.str();
    };
    if (run.tensors.empty()) return v.add(where(), "serves no tensor");
    if (run.extent_offset % align != 0 || run.extent_size % align != 0)
        v.add(where(), "not aligned to ", align);
    if (run.extent_offset + run.extent_size > mapped) v.add(where(), "past the mapped length ", mapped);
    if (run.extent_offset < previous_end) v.add(where(), "overlaps the run before it");
    previous_end = run.extent_offset + run.extent_size;
    if (!cpu && run.extent_size == 0) v.add(where(), "is empty");
    if (!cpu && target.caps.max_import_size != 0 && run.extent_size > target.caps.max_import_size)
        v.add(where(), "over the importer's limit ", target.caps.max_import_size);
    std::uint64_t first = UINT64_MAX, last = 0, ctx = 0, previous_offset = 0;
    for (std::uint32_t t : run.tensors) {
        if (t >= m.tensors.size()) return v.add(where(), "serves tensor ", t, " of ", m.tensors.size());
        const TensorDesc& td = m.tensors[t];
        const TensorPlacement& place = p.tensors[t];
        if (td.target != region.target || td.file != region.file)
            v.add(where(), "serves tensor ", t, " of another target or file");
        if (td.offset < previous_offset) v.add(where(), "tensors are not sorted by offset");
        previous_offset = td.offset;
        first = std::min(first, td.offset);
        last = std::max(last, td.offset + td.size);
        ctx += td.size;
        ++seen[t];
        if (place.region != r || place.run != k)
            v.add(where(), "serves tensor ", t, ", which is placed in region ", place.region,
                  " run ", place.run);
        // Buffer base (mapping base + extent_offset) + offset_in_run == mapping base + file
        // offset, and the tensor lies wholly inside the import.
        if (run.extent_offset + place.offset_in_run != td.offset ||
            place.offset_in_run + td.size > run.extent_size)
            v.add(where(), "tensor ", t, " at ", td.offset, " +", td.size,
                  " does not resolve (offset_in_run ", place.offset_in_run, ")");
        if (place.offset_in_run % tensor_align != 0)
            v.add(where(), "tensor ", t, " offset_in_run ", place.offset_in_run,
                  " is not a multiple of the importer's tensor alignment ", tensor_align);
        if (!place.reason.empty()) v.add(where(), "imported tensor ", t, " has a reason");
    }
    if (run.first != first || run.last != last || run.ctx_bytes != ctx)
        v.add(where(), "first/last/ctx ", run.first, "/", run.last, "/", run.ctx_bytes, " != ",
              first, "/", last, "/", ctx);
    if (!cpu && p.mode == PlanMode::runs && !passes_tightness_gate(first, last, ctx))
        v.add(where(), "fails the tightness gate on its own");
}

} // namespace detail

/// The promises `p` (planned from `m` with a budget of `max_imports_per_region`) breaks.
inline std::vector<std::string> plan_violations(const ModelDesc& m, const Plan& p,
                                                std::uint32_t max_imports_per_region = 256) {
    detail::Violations v;
    const std::size_t n = m.tensors.size();
    if (p.tensors.size() != n) {
        v.add("plan has ", p.tensors.size(), " placements for ", n, " tensors");
        return v.list;
    }
    const std::uint64_t budget = std::max<std::uint32_t>(max_imports_per_region, 1);
    std::vector<std::uint32_t> seen(n, 0);
    detail::ExtentsByImporter extents;
    PlanTotals expect;
    for (std::uint32_t r = 0; r < p.regions.size(); ++r) {
        const PlanRegion& region = p.regions[r];
        if (region.target >= m.targets.size() || region.file >= m.files.size()) {
            v.add("region ", r, " names target ", region.target, " file ", region.file);
            continue;
        }
        const TargetDesc& target = m.targets[region.target];
        detail::check_region(m, region, r, v);
        if (!target.caps.is_cpu && region.runs.size() > budget)
            v.add("region ", r, " has ", region.runs.size(), " imports, budget ", budget);
        if (!target.caps.is_cpu && region.decision == Decision::import &&
            !import_allowed(target.import_policy.value_or(p.import_policy),
                            target.caps.device_memory))
            v.add("region ", r, " imports on a target its import policy refuses");
        std::uint64_t previous_end = 0;
        for (std::uint32_t k = 0; k < region.runs.size(); ++k) {
            detail::check_run(m, p, r, k, previous_end, seen, v);
            if (target.caps.is_cpu) continue;
            const PlanRun& run = region.runs[k];
            const std::string& key = target.importer_key.empty() ? target.name : target.importer_key;
            extents[{key, region.file}].push_back({run.extent_offset, run.extent_offset + run.extent_size});
            expect.pinned_bytes += run.extent_size;
            ++expect.imports;
        }
    }
    for (std::uint32_t i = 0; i < n; ++i) {
        const TensorDesc& t = m.tensors[i];
        const TensorPlacement& place = p.tensors[i];
        if (place.region >= p.regions.size() || p.regions[place.region].target != t.target ||
            p.regions[place.region].file != t.file) {
            v.add("tensor ", i, " is not in its (target, file) region");
            continue;
        }
        if (place.run == no_index && (seen[i] != 0 || place.reason.empty()))
            v.add("tensor ", i, " falls back ", seen[i] != 0 ? "but a run serves it" : "without a reason");
        if (place.run != no_index && seen[i] != 1)
            v.add("tensor ", i, " is served by ", seen[i], " runs");
        if (m.targets[t.target].caps.is_cpu) continue;
        expect.device_bytes += t.size;
        if (place.run != no_index) expect.imported_bytes += t.size;
    }
    expect.fallback_bytes = expect.device_bytes - expect.imported_bytes;
    const PlanTotals& got = p.totals;
    if (got.device_bytes != expect.device_bytes || got.imported_bytes != expect.imported_bytes ||
        got.fallback_bytes != expect.fallback_bytes || got.pinned_bytes != expect.pinned_bytes ||
        got.imports != expect.imports)
        v.add("totals device/imported/fallback/pinned/imports ", got.device_bytes, "/",
              got.imported_bytes, "/", got.fallback_bytes, "/", got.pinned_bytes, "/", got.imports,
              " != ", expect.device_bytes, "/", expect.imported_bytes, "/", expect.fallback_bytes,
              "/", expect.pinned_bytes, "/", expect.imports);
    // No two imports of one importer in one file share a byte (so no page: extents are aligned).
    for (auto& [key, list] : extents) {
        std::sort(list.begin(), list.end());
        for (std::size_t i = 1; i < list.size(); ++i)
            if (list[i].first < list[i - 1].second)
                v.add("importer '", key.first, "' file ", key.second, ": extents at ",
                      list[i - 1].first, " and ", list[i].first, " overlap");
    }
    return v.list;
}

} // namespace wm::test
