// SPDX-License-Identifier: MIT
#include "weightmap/planner.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>
#include <string_view>
#include <unistd.h>

#include <fmt/format.h>

#include "internal/align.hpp"

namespace wm {

const char* to_string(PlanMode mode) noexcept {
    switch (mode) {
    case PlanMode::span: return "span";
    case PlanMode::gate: return "gate";
    case PlanMode::runs: return "runs";
    }
    return "?";
}

const char* to_string(Decision decision) noexcept {
    return decision == Decision::import ? "import" : "fallback";
}

std::uint64_t tightness_limit(std::uint64_t ctx_bytes) noexcept {
    // Saturating: a limit that would pass UINT64_MAX admits every span anyway.
    return sat_add(sat_add(ctx_bytes, ctx_bytes / 8), tightness_gate_slack);
}

bool passes_tightness_gate(std::uint64_t first, std::uint64_t last,
                           std::uint64_t ctx_bytes) noexcept {
    return last - first <= tightness_limit(ctx_bytes);
}

std::uint64_t host_page_size() noexcept {
    static const std::uint64_t page = [] {
        long value = sysconf(_SC_PAGESIZE);
        return value > 0 ? static_cast<std::uint64_t>(value) : std::uint64_t{4096};
    }();
    return page;
}

namespace {

std::string describe_gate_failure(std::uint64_t first, std::uint64_t last, std::uint64_t ctx) {
    return fmt::format("span {} bytes [{:#x}, {:#x}) holds {} bytes of its own tensors; "
                       "gate limit {} (ctx + ctx/8 + 1 MiB)",
                       last - first, first, last, ctx, tightness_limit(ctx));
}

// A candidate import while runs are being formed: tensors [begin, end) of the region's sorted
// tensor list.
struct Piece {
    std::size_t begin = 0, end = 0;
    std::uint64_t first = 0, last = 0, ctx = 0;
};

struct RegionBuilder {
    const ModelDesc& model;
    const PlanOptions& options;
    std::uint64_t page;
    std::uint64_t align;        // max(page, importer alignment)
    std::uint64_t mapped_len;   // file size rounded up to whole pages
    std::uint64_t max_import;   // 0: unlimited
    PlanRegion& region;
    std::vector<TensorPlacement>& placements;

    const TensorDesc& tensor_at(std::size_t i) const { return model.tensors[region.tensors[i]]; }
    std::uint64_t aligned_start(std::size_t i) const { return align_down(tensor_at(i).offset, align); }
    std::uint64_t aligned_end(std::size_t i) const {
        const TensorDesc& t = tensor_at(i);
        return align_up_saturating(t.offset + t.size, align);
    }

    Piece piece(std::size_t begin, std::size_t end) const {
        Piece p{begin, end, UINT64_MAX, 0, 0};
        for (std::size_t i = begin; i < end; ++i) {
            const TensorDesc& t = tensor_at(i);
            p.first = std::min(p.first, t.offset);
            p.last = std::max(p.last, t.offset + t.size);
            p.ctx = sat_add(p.ctx, t.size);
        }
        return p;
    }

    void fallback_tensor(std::size_t i, std::string reason) {
        TensorPlacement& place = placements[region.tensors[i]];
        place.run = no_index;
        place.reason = std::move(reason);
    }

    // Emits a run for piece p, or makes its tensors fall back when its extent would pass the
    // mapped length or the importer's size limit.
    void emit(const Piece& p, std::uint32_t region_index) {
        std::uint64_t start = align_down(p.first, align);
        std::uint64_t end = align_up_saturating(p.last, align);
        std::string refusal;
        if (end > mapped_len) {
            refusal = fmt::format("aligned extent [{:#x}, {:#x}) runs past the mapped length {:#x} "
                                  "of file {} (importer alignment {} > page size {})",
                                  start, end, mapped_len, describe_file(), align, page);
        } else if (max_import != 0 && end - start > max_import) {
            refusal = fmt::format("tensor of {} bytes needs an import of {} bytes, over the "
                                  "importer's maximum import size {}",
                                  p.ctx, end - start, max_import);
        }
        if (!refusal.empty()) {
            for (std::size_t i = p.begin; i < p.end; ++i) fallback_tensor(i, refusal);
            return;
        }
        PlanRun run;
        run.first = p.first;
        run.last = p.last;
        run.extent_offset = start;
        run.extent_size = end - start;
        auto run_index = static_cast<std::uint32_t>(region.runs.size());
        for (std::size_t i = p.begin; i < p.end; ++i) {
            std::uint32_t ti = region.tensors[i];
            run.tensors.push_back(ti);
            placements[ti] = TensorPlacement{region_index, run_index,
                                             model.tensors[ti].offset - start, {}};
        }
        region.runs.push_back(std::move(run));
    }

    std::string describe_file() const {
        const FileDesc& f = model.files[region.file];
        return f.path.empty() ? fmt::format("#{}", region.file) : f.path;
    }

    // Splits a piece whose extent is over the importer's limit at tensor boundaries, greedily;
    // a tensor that alone is over the limit falls back (emit() says so).
    void emit_within_limit(const Piece& p, std::uint32_t region_index) {
        if (max_import == 0 ||
            align_up_saturating(p.last, align) - align_down(p.first, align) <= max_import) {
            emit(p, region_index);
            return;
        }
        std::size_t begin = p.begin;
        while (begin < p.end) {
            std::size_t end = begin + 1;
            std::uint64_t start = aligned_start(begin);
            std::uint64_t reach = aligned_end(begin);
            while (end < p.end) {
                std::uint64_t next_reach = std::max(reach, aligned_end(end));
                if (next_reach - start > max_import) break;
                reach = next_reach;
                ++end;
            }
            emit(piece(begin, end), region_index);
            begin = end;
        }
    }

    // Mode runs for a region that fails the gate: aligned extents merged where they touch,
    // then across gaps < merge_gap, each run re-checked against the gate, then merged across
    // the smallest gaps down to the budget.
    std::vector<Piece> form_runs() const {
        const std::size_t n = region.tensors.size();
        // Boundaries between tensor i-1 and i are "cuts" unless their aligned extents touch.
        std::vector<Piece> pieces;
        std::size_t begin = 0;
        std::uint64_t reach = aligned_end(0);
        for (std::size_t i = 1; i < n; ++i) {
            std::uint64_t start = aligned_start(i);
            bool touches = start <= reach;
            bool small_gap = !touches && start - reach < options.merge_gap;
            if (!touches && !small_gap) {
                pieces.push_back(piece(begin, i));
                begin = i;
            }
            reach = std::max(reach, aligned_end(i));
        }
        pieces.push_back(piece(begin, n));

        // A gap merge may have produced a run that is not tight: split it at its gaps (the
        // touching clusters inside it), largest gap first, until every part passes.
        std::vector<Piece> tight;
        for (const Piece& p : pieces) split_until_tight(p, tight);

        return merge_to_budget(std::move(tight));
    }

    void split_until_tight(const Piece& p, std::vector<Piece>& out) const {
        if (p.end - p.begin <= 1 || passes_tightness_gate(p.first, p.last, p.ctx)) {
            out.push_back(p);
            return;
        }
        // Find the widest gap between consecutive tensors (by aligned extents, then raw).
        std::size_t cut = 0;
        std::uint64_t widest = 0;
        std::uint64_t reach = aligned_end(p.begin);
        std::uint64_t raw_reach = tensor_at(p.begin).offset + tensor_at(p.begin).size;
        bool found = false;
        for (std::size_t i = p.begin + 1; i < p.end; ++i) {
            std::uint64_t start = tensor_at(i).offset;
            std::uint64_t gap = start > raw_reach ? start - raw_reach : 0;
            if (!found || gap > widest) {
                widest = gap;
                cut = i;
                found = true;
            }
            reach = std::max(reach, aligned_end(i));
            raw_reach = std::max(raw_reach, tensor_at(i).offset + tensor_at(i).size);
        }
        split_until_tight(piece(p.begin, cut), out);
        split_until_tight(piece(cut, p.end), out);
    }

    // For a fixed number of imports, pinned bytes = extents + the gaps merged over, so keeping
    // the largest gaps open (merging the smallest) minimises what is pinned.
    std::vector<Piece> merge_to_budget(std::vector<Piece> pieces) const {
        std::size_t budget = std::max<std::uint32_t>(options.max_imports_per_region, 1);
        if (pieces.size() <= budget) return pieces;
        std::vector<std::size_t> gaps(pieces.size() - 1);
        std::iota(gaps.begin(), gaps.end(), std::size_t{0});
        auto gap_bytes = [&](std::size_t g) {
            std::uint64_t left_end = align_up_saturating(pieces[g].last, align);
            std::uint64_t right_start = align_down(pieces[g + 1].first, align);
            return right_start > left_end ? right_start - left_end : std::uint64_t{0};
        };
        // Keep the (budget - 1) widest gaps open; ties broken by position for determinism.
        std::sort(gaps.begin(), gaps.end(), [&](std::size_t a, std::size_t b) {
            std::uint64_t ga = gap_bytes(a), gb = gap_bytes(b);
            return ga != gb ? ga > gb : a < b;
        });
        std::vector<bool> open(pieces.size() - 1, false);
        for (std::size_t k = 0; k + 1 < budget; ++k) open[gaps[k]] = true;
        std::vector<Piece> merged;
        std::size_t start = 0;
        for (std::size_t g = 0; g < open.size(); ++g) {
            if (open[g]) {
                merged.push_back(piece(pieces[start].begin, pieces[g].end));
                start = g + 1;
            }
        }
        merged.push_back(piece(pieces[start].begin, pieces.back().end));
        return merged;
    }
};

bool import_enabled(const PlanOptions& options, std::string& why_not) {
    if (options.import_enabled.has_value()) {
        if (!*options.import_enabled) why_not = "disabled by PlanOptions::import_enabled = false";
        return *options.import_enabled;
    }
    const char* env = std::getenv("WEIGHTMAP_IMPORT");
    if (env != nullptr && std::string_view(env) == "0") {
        why_not = "disabled by WEIGHTMAP_IMPORT=0";
        return false;
    }
    return true;
}

Status validate(const ModelDesc& model, std::uint64_t page) {
    if (!is_power_of_two(page))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("page size {} is not a power of two", page));
    for (std::size_t i = 0; i < model.targets.size(); ++i) {
        std::uint64_t a = model.targets[i].caps.alignment;
        if (a != 0 && !is_power_of_two(a))
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("target {} ('{}'): alignment {} is not a power of two",
                                          i, model.targets[i].name, a));
    }
    for (std::size_t i = 0; i < model.tensors.size(); ++i) {
        const TensorDesc& t = model.tensors[i];
        if (t.file >= model.files.size())
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("tensor {} ('{}'): file index {} out of range ({} files)",
                                          i, t.name, t.file, model.files.size()));
        if (t.target >= model.targets.size())
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("tensor {} ('{}'): target index {} out of range ({} "
                                          "targets)", i, t.name, t.target, model.targets.size()));
        std::uint64_t end = 0;
        const FileDesc& f = model.files[t.file];
        if (__builtin_add_overflow(t.offset, t.size, &end) || end > f.size)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("tensor {} ('{}'): bytes [{}, {}+{}) pass the end of "
                                          "file '{}' ({} bytes)",
                                          i, t.name, t.offset, t.offset, t.size, f.path, f.size));
    }
    return {};
}

// Two imports through one importer must not share a page: for HSA a page locked twice is
// unlocked by the first release while the other import still uses it. Adjacent runs of the same
// region merge when the merged run stays tight and within the size limit; otherwise (or across
// regions) the later run's leading tensors that share the page are left out.
void separate_shared_pages(const ModelDesc& model, Plan& plan, std::uint64_t page) {
    struct Ref { std::uint32_t region, run; };
    std::map<std::pair<std::string, std::uint32_t>, std::vector<Ref>> by_importer_file;
    for (std::uint32_t r = 0; r < plan.regions.size(); ++r) {
        const PlanRegion& region = plan.regions[r];
        const TargetDesc& target = model.targets[region.target];
        if (target.caps.is_cpu) continue;
        const std::string& key = target.importer_key.empty() ? target.name : target.importer_key;
        for (std::uint32_t k = 0; k < region.runs.size(); ++k)
            by_importer_file[{key, region.file}].push_back(Ref{r, k});
    }
    bool changed = false;
    for (auto& [key, refs] : by_importer_file) {
        auto run_of = [&](const Ref& ref) -> PlanRun& { return plan.regions[ref.region].runs[ref.run]; };
        std::sort(refs.begin(), refs.end(), [&](const Ref& a, const Ref& b) {
            return run_of(a).extent_offset < run_of(b).extent_offset;
        });
        std::size_t prev = 0;
        for (std::size_t i = 1; i < refs.size(); ++i) {
            PlanRun& a = run_of(refs[prev]);
            PlanRun& b = run_of(refs[i]);
            std::uint64_t a_end = a.extent_offset + a.extent_size;
            if (b.extent_offset >= a_end || b.tensors.empty() || a.tensors.empty()) {
                if (!b.tensors.empty()) prev = i;
                continue;
            }
            changed = true;
            const PlanRegion& ra = plan.regions[refs[prev].region];
            const TargetDesc& target = model.targets[ra.target];
            std::uint64_t align = std::max<std::uint64_t>(page, target.caps.alignment);
            std::uint64_t ctx = 0;
            for (auto t : a.tensors) ctx = sat_add(ctx, model.tensors[t].size);
            for (auto t : b.tensors) ctx = sat_add(ctx, model.tensors[t].size);
            std::uint64_t first = std::min(a.first, b.first), last = std::max(a.last, b.last);
            std::uint64_t end = std::max(a_end, b.extent_offset + b.extent_size);
            std::uint64_t max = target.caps.max_import_size;
            bool same_region = refs[prev].region == refs[i].region;
            if (same_region && passes_tightness_gate(first, last, ctx) &&
                (max == 0 || end - a.extent_offset <= max)) {
                a.first = first;
                a.last = last;
                a.extent_size = end - a.extent_offset;
                a.tensors.insert(a.tensors.end(), b.tensors.begin(), b.tensors.end());
                b.tensors.clear();
                continue;
            }
            // Leave out b's tensors that start on a page a already imports.
            std::vector<std::uint32_t> kept;
            for (auto t : b.tensors) {
                const TensorDesc& td = model.tensors[t];
                if (align_down(td.offset, align) < a_end) {
                    TensorPlacement& place = plan.tensors[t];
                    place.run = no_index;
                    place.reason = fmt::format(
                        "shares a page with import [{:#x}, {:#x}) of the same importer; left out "
                        "so no page is imported twice ({})",
                        a.extent_offset, a_end,
                        same_region ? "merging would break the gate or the size limit"
                                    : "the other import belongs to another target");
                } else {
                    kept.push_back(t);
                }
            }
            b.tensors = std::move(kept);
            if (!b.tensors.empty()) {
                b.first = UINT64_MAX;
                b.last = 0;
                for (auto t : b.tensors) {
                    b.first = std::min(b.first, model.tensors[t].offset);
                    b.last = std::max(b.last, model.tensors[t].offset + model.tensors[t].size);
                }
                std::uint64_t b_end = b.extent_offset + b.extent_size;
                b.extent_offset = align_down(b.first, align);
                b.extent_size = b_end - b.extent_offset;
                prev = i;
            }
        }
    }
    if (!changed) return;
    // Drop emptied runs and renumber placements.
    for (std::uint32_t r = 0; r < plan.regions.size(); ++r) {
        PlanRegion& region = plan.regions[r];
        std::vector<PlanRun> runs;
        for (PlanRun& run : region.runs) {
            if (run.tensors.empty()) continue;
            std::sort(run.tensors.begin(), run.tensors.end(), [&](auto x, auto y) {
                return model.tensors[x].offset < model.tensors[y].offset;
            });
            auto index = static_cast<std::uint32_t>(runs.size());
            for (auto t : run.tensors)
                plan.tensors[t] = TensorPlacement{r, index,
                                                  model.tensors[t].offset - run.extent_offset, {}};
            runs.push_back(std::move(run));
        }
        region.runs = std::move(runs);
        if (region.runs.empty() && region.decision == Decision::import) {
            region.decision = Decision::fallback;
            region.reason = "every tensor shares a page with another import of the same importer";
        }
    }
}

} // namespace

PlanTotals compute_totals(const ModelDesc& model, const Plan& plan) {
    PlanTotals totals;
    for (std::size_t i = 0; i < model.tensors.size(); ++i) {
        const TensorDesc& t = model.tensors[i];
        if (model.targets[t.target].caps.is_cpu) continue;
        totals.device_bytes += t.size;
        const TensorPlacement& place = plan.tensors[i];
        if (place.run != no_index && plan.regions[place.region].decision == Decision::import)
            totals.imported_bytes += t.size;
    }
    totals.fallback_bytes = totals.device_bytes - totals.imported_bytes;
    for (const PlanRegion& region : plan.regions) {
        if (model.targets[region.target].caps.is_cpu || region.decision != Decision::import)
            continue;
        for (const PlanRun& run : region.runs) {
            totals.pinned_bytes += run.extent_size;
            ++totals.imports;
        }
    }
    return totals;
}

Result<Plan> make_plan(const ModelDesc& model, const PlanOptions& options) {
    const std::uint64_t page = options.page_size != 0 ? options.page_size : host_page_size();
    if (Status s = validate(model, page); !s) return std::move(s).error();

    std::string disabled_reason;
    const bool enabled = import_enabled(options, disabled_reason);

    Plan plan;
    plan.mode = options.mode;
    plan.page_size = page;
    plan.tensors.resize(model.tensors.size());

    // Group by (target, file), tensors sorted by offset inside each group.
    std::vector<std::uint32_t> order(model.tensors.size());
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
        const TensorDesc& x = model.tensors[a];
        const TensorDesc& y = model.tensors[b];
        if (x.target != y.target) return x.target < y.target;
        if (x.file != y.file) return x.file < y.file;
        if (x.offset != y.offset) return x.offset < y.offset;
        return a < b;
    });

    for (std::size_t i = 0; i < order.size();) {
        const TensorDesc& head = model.tensors[order[i]];
        std::size_t j = i;
        PlanRegion region;
        region.target = head.target;
        region.file = head.file;
        region.first = UINT64_MAX;
        while (j < order.size() && model.tensors[order[j]].target == head.target &&
               model.tensors[order[j]].file == head.file) {
            const TensorDesc& t = model.tensors[order[j]];
            region.tensors.push_back(order[j]);
            region.first = std::min(region.first, t.offset);
            region.last = std::max(region.last, t.offset + t.size);
            region.ctx_bytes = sat_add(region.ctx_bytes, t.size);
            ++j;
        }
        i = j;
        region.gate = passes_tightness_gate(region.first, region.last, region.ctx_bytes);

        const auto region_index = static_cast<std::uint32_t>(plan.regions.size());
        for (auto t : region.tensors) plan.tensors[t].region = region_index;

        const TargetDesc& target = model.targets[region.target];
        const std::uint64_t align = std::max<std::uint64_t>(page, target.caps.alignment);
        RegionBuilder builder{model, options, page, align,
                              align_up_saturating(model.files[region.file].size, page),
                              target.caps.is_cpu ? 0 : target.caps.max_import_size,
                              region, plan.tensors};
        const Piece whole = builder.piece(0, region.tensors.size());

        if (target.caps.is_cpu) {
            // Passthrough pins nothing, so the span is always fine.
            builder.align = page;
            builder.emit(whole, region_index);
            region.decision = Decision::import;
            region.reason = "CPU passthrough";
        } else if (!enabled) {
            region.reason = disabled_reason;
        } else if (region.ctx_bytes == 0) {
            region.reason = "region holds no tensor bytes";
        } else if (options.mode == PlanMode::span || region.gate) {
            builder.emit_within_limit(whole, region_index);
            region.reason = region.gate ? "tight: passes the gate"
                                        : "span mode: whole span imported without the gate";
        } else if (options.mode == PlanMode::gate) {
            region.reason = describe_gate_failure(region.first, region.last, region.ctx_bytes);
        } else {
            for (const Piece& p : builder.form_runs()) builder.emit_within_limit(p, region_index);
            region.reason = fmt::format("not tight ({}); imported as tight runs",
                                        describe_gate_failure(region.first, region.last,
                                                              region.ctx_bytes));
        }
        if (!region.runs.empty()) {
            region.decision = Decision::import;
        } else if (region.decision != Decision::fallback || target.caps.is_cpu) {
            region.decision = Decision::fallback;
        }
        if (region.decision == Decision::fallback) {
            // A region that imports nothing: each tensor carries the region's reason unless
            // emit() gave it a more specific one.
            for (auto t : region.tensors) {
                plan.tensors[t].run = no_index;
                if (plan.tensors[t].reason.empty()) plan.tensors[t].reason = region.reason;
            }
            if (region.reason.empty() || region.reason.starts_with("tight") ||
                region.reason.starts_with("span mode") || region.reason.starts_with("not tight"))
                region.reason = plan.tensors[region.tensors.front()].reason;
        }
        plan.regions.push_back(std::move(region));
    }

    separate_shared_pages(model, plan, page);
    plan.totals = compute_totals(model, plan);
    return plan;
}

} // namespace wm
