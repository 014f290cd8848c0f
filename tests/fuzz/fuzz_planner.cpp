// SPDX-License-Identifier: MIT
// libFuzzer target: arbitrary bytes decoded into files, targets and tensors, planned in all three
// modes. The planner must either refuse an inconsistent description or return a plan in which
// every imported tensor resolves to extent + offset == its file offset, inside its extent; every
// non-CPU extent is aligned, inside the file's mapped length and within the importer's limit; in
// mode runs every import passes the gate on its own; no two extents of one importer in one file
// overlap; and the totals add up. Traps on any broken promise.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "weightmap/planner.hpp"

namespace {

struct Bytes {
    const std::uint8_t* data;
    std::size_t size, pos = 0;
    std::uint64_t take(int n) {
        std::uint64_t v = 0;
        for (int i = 0; i < n; ++i) v = v << 8 | (pos < size ? data[pos++] : 0);
        return v;
    }
};

void check(const wm::ModelDesc& m, wm::PlanMode mode) {
    wm::PlanOptions o;
    o.mode = mode;
    o.page_size = 4096;
    o.import_enabled = true;
    o.merge_gap = 1 << 16;
    o.max_imports_per_region = 4;
    auto r = wm::make_plan(m, o);
    if (!r) {
        if (r.error().message.empty()) __builtin_trap();
        return;
    }
    const wm::Plan& p = *r;
    if (p.tensors.size() != m.tensors.size()) __builtin_trap();
    std::uint64_t device = 0, imported = 0;
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
        const wm::TensorDesc& t = m.tensors[i];
        const wm::TensorPlacement& place = p.tensors[i];
        if (place.region >= p.regions.size()) __builtin_trap();
        const wm::PlanRegion& region = p.regions[place.region];
        if (region.target != t.target || region.file != t.file) __builtin_trap();
        bool cpu = m.targets[t.target].caps.is_cpu;
        if (!cpu) device += t.size;
        if (place.run == wm::no_index) continue;
        if (place.run >= region.runs.size()) __builtin_trap();
        const wm::PlanRun& run = region.runs[place.run];
        if (run.extent_offset + place.offset_in_run != t.offset) __builtin_trap();
        if (place.offset_in_run + t.size > run.extent_size) __builtin_trap();
        if (!cpu && region.decision == wm::Decision::import) imported += t.size;
    }
    if (p.totals.device_bytes != device || p.totals.imported_bytes != imported ||
        p.totals.fallback_bytes != device - imported)
        __builtin_trap();
    std::map<std::pair<std::string, std::uint32_t>, std::vector<std::pair<std::uint64_t, std::uint64_t>>> extents;
    for (const wm::PlanRegion& region : p.regions) {
        const wm::TargetDesc& target = m.targets[region.target];
        if (target.caps.is_cpu || region.decision != wm::Decision::import) continue;
        std::uint64_t align = std::max<std::uint64_t>(4096, target.caps.alignment);
        std::uint64_t mapped = (m.files[region.file].size + 4095) / 4096 * 4096;
        for (const wm::PlanRun& run : region.runs) {
            if (run.extent_offset % align != 0 || run.extent_size % align != 0) __builtin_trap();
            if (run.extent_offset + run.extent_size > mapped) __builtin_trap();
            if (target.caps.max_import_size != 0 && run.extent_size > target.caps.max_import_size)
                __builtin_trap();
            if (mode == wm::PlanMode::runs && !wm::passes_tightness_gate(run.first, run.last, run.ctx_bytes))
                __builtin_trap();
            extents[{target.importer_key, region.file}].push_back({run.extent_offset, run.extent_size});
        }
    }
    for (auto& [key, list] : extents) {
        std::sort(list.begin(), list.end());
        for (std::size_t i = 1; i < list.size(); ++i)
            if (list[i - 1].first + list[i - 1].second > list[i].first) __builtin_trap();
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    Bytes in{data, size};
    wm::ModelDesc m;
    std::uint32_t files = 1 + in.take(1) % 3;
    for (std::uint32_t f = 0; f < files; ++f) m.files.push_back({"f", in.take(3) << 4});
    std::uint32_t targets = 1 + in.take(1) % 3;
    for (std::uint32_t t = 0; t < targets; ++t) {
        std::uint64_t bits = in.take(1);
        wm::TargetDesc target;
        target.name = "t" + std::to_string(t);
        target.importer_key = bits & 1 ? "shared" : target.name;
        target.caps.is_cpu = (bits & 6) == 6;
        target.caps.alignment = std::uint64_t{1} << (bits >> 3 & 31) % 20;
        target.caps.max_import_size = bits & 0x80 ? (in.take(2) + 1) << 12 : 0;
        m.targets.push_back(target);
    }
    while (in.pos < in.size && m.tensors.size() < 4096) {
        wm::TensorDesc t;
        t.file = static_cast<std::uint32_t>(in.take(1) % (files + 1)); // sometimes out of range
        t.target = static_cast<std::uint32_t>(in.take(1) % targets);
        t.offset = in.take(3) << 4;
        t.size = in.take(3);
        m.tensors.push_back(t);
    }
    for (wm::PlanMode mode : {wm::PlanMode::span, wm::PlanMode::gate, wm::PlanMode::runs})
        check(m, mode);
    return 0;
}
