// SPDX-License-Identifier: MIT
// The planner: tensors in, plan out. docs/planner.md describes the algorithm and its measurements;
// the comments here say why a step is the way it is.
//
// Everything works on index ranges of one array: every tensor sorted by (target, file, offset), so
// a region is a slice of it and a run a sub-slice. Statistics of any slice are O(1) (prefix sums
// of sizes, sorted offsets and ends; O(log n) from a segment tree only when tensors nest), which
// keeps every pass linear or n log n whatever the layout. Per-tensor vectors are built once, at
// the end.
#include "weightmap/planner.hpp"

#include <algorithm>
#include <cassert>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string_view>

#include <fmt/format.h>

#include "internal/align.hpp"
#include "planner/plan_core.hpp"

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

namespace {

// What the extents of `target`'s regions are aligned to: the page, and for a device the
// importer's alignment and tensor alignment too.
std::uint64_t extent_alignment(const TargetDesc& target, std::uint64_t page) {
    if (target.caps.is_cpu) return page;
    return std::max({page, target.caps.alignment, target.caps.tensor_alignment});
}


constexpr std::uint32_t none = no_index;
constexpr std::uint64_t no_lane = UINT64_MAX; // the CPU: passthrough shares pages freely

std::string describe_gate_failure(std::uint64_t first, std::uint64_t last, std::uint64_t ctx) {
    return fmt::format("span {} bytes [{:#x}, {:#x}) holds {} bytes of its own tensors; "
                       "gate limit {} (ctx + ctx/8 + 1 MiB)",
                       last - first, first, last, ctx, tightness_limit(ctx));
}

// Highest value over [begin, end) of a fixed array, O(log n) per query (bottom-up segment tree).
class RangeMax {
public:
    explicit RangeMax(const std::vector<std::uint64_t>& leaves)
        : n_(leaves.size()), tree_(2 * n_) {
        std::copy(leaves.begin(), leaves.end(), tree_.begin() + static_cast<std::ptrdiff_t>(n_));
        for (std::size_t i = n_; i-- > 1;) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
    }
    std::uint64_t max(std::size_t begin, std::size_t end) const {
        assert(begin < end && end <= n_);
        std::uint64_t best = 0;
        for (begin += n_, end += n_; begin < end; begin >>= 1, end >>= 1) {
            if (begin & 1) best = std::max(best, tree_[begin++]);
            if (end & 1) best = std::max(best, tree_[--end]);
        }
        return best;
    }

private:
    std::size_t n_;
    std::vector<std::uint64_t> tree_;
};

// One (target, file) group of the sorted array. A device group whose importer has a tensor
// alignment holds its aligned tensors first, [begin, aligned_end), then the misaligned ones,
// [aligned_end, end), each part in offset order: runs are planned over the first part alone.
struct Group {
    std::uint32_t begin, end, target, file;
    std::uint32_t aligned_end = end;
};

// Tensors [b, e) of the sorted array.
struct Slice {
    std::uint32_t b = 0, e = 0;
    bool empty() const { return b >= e; }
};

// The planner's working state for one region.
struct RegionWork {
    std::uint32_t begin = 0, end = 0; // slice of the sorted array runs are planned over
    std::uint32_t group_end = 0;      // end of the region's slice: [end, group_end) are tensors
                                      // misaligned for the importer's tensor alignment
    std::uint64_t align = 0;          // max(page, importer alignment, tensor alignment)
    std::uint64_t mapped_len = 0;     // file size rounded up to whole pages
    std::uint64_t max_import = 0;     // 0: unlimited
    std::uint64_t lane = no_lane;     // (importer, file) group for shared pages
    std::vector<Slice> runs;           // sorted, disjoint once planned
    // What happened, for the region's reason.
    std::uint32_t clusters = 0;            // page-disjoint clusters (mode runs, region not tight)
    std::uint32_t threshold_merges = 0;    // merges across gaps below merge_gap
    std::uint32_t gate_kept_open = 0;      // gaps below merge_gap left open for the gate
    std::uint32_t limit_cuts = 0;          // extra imports made by the size limit
    std::uint32_t budget_merges = 0;
    std::uint32_t budget_dropped_runs = 0;
    std::uint32_t budget_needed = 0;       // importable runs before the budget left some out
    std::uint64_t refused_tensors = 0;     // tensors that fall back alone, any reason
    std::uint64_t refused_bytes = 0;
    std::uint64_t shared_dropped_tensors = 0; // of those, left out for a shared page
    std::uint64_t shared_dropped_bytes = 0;
    std::uint64_t misaligned_tensors = 0;  // of those, left out for the tensor alignment
    std::uint64_t misaligned_bytes = 0;
    std::uint32_t first_refused = none;    // sorted index of the first tensor that fell back
    bool whole_fallback = false;           // decided before any run was formed
    std::string base_reason;
};

class Planner {
public:
    Planner(const ModelDesc& model, const PlanOptions& options, std::uint64_t page)
        : model_(model), options_(options), page_(page),
          budget_(std::max<std::uint32_t>(options.max_imports_per_region, 1)),
          runs_mode_(options.mode == PlanMode::runs) {
        policy_refusals_.reserve(model.targets.size());
        for (const TargetDesc& target : model.targets)
            policy_refusals_.push_back(
                import_policy_refusal(target.caps, effective_import_policy(target, options),
                                      target.device_memory_note));
    }

    Plan run(const internal::ImportSwitch& import_switch);

private:
    const ModelDesc& model_;
    const PlanOptions& options_;
    const std::uint64_t page_;
    const std::size_t budget_;
    const bool runs_mode_;
    Plan plan_;
    std::vector<RegionWork> work_;
    std::vector<std::string> policy_refusals_; // per target; empty: its policy lets it import

    // The sorted array: position k holds ModelDesc tensor order_[k].
    std::vector<std::uint32_t> order_;
    std::vector<std::uint64_t> offset_;       // ascending within each region
    std::vector<std::uint64_t> prefix_;       // prefix_[k]: sum of the sizes before position k
    std::vector<std::uint64_t> end_;          // offset + size
    std::vector<std::uint8_t> cluster_start_; // 1 where a page-disjoint cluster begins
    std::vector<Group> groups_;
    // Only when some tensor ends before an earlier one of its region (nested or zero-size
    // tensors); otherwise ends ascend with offsets and a slice's last end is its last tensor's.
    std::unique_ptr<RangeMax> nested_ends_;

    // --- slice statistics: O(1), or O(log n) for nested tensors -------------------------------
    std::uint64_t size_at(std::uint32_t k) const { return end_[k] - offset_[k]; }
    std::uint64_t ctx(Slice s) const { return prefix_[s.e] - prefix_[s.b]; }
    std::uint64_t first(Slice s) const { return offset_[s.b]; }
    std::uint64_t last(Slice s) const {
        return nested_ends_ ? nested_ends_->max(s.b, s.e) : end_[s.e - 1];
    }
    std::uint64_t start(const RegionWork& w, Slice s) const {
        return align_down(first(s), w.align);
    }
    std::uint64_t stop(const RegionWork& w, Slice s) const {
        return align_up_saturating(last(s), w.align);
    }
    std::uint64_t extent(const RegionWork& w, Slice s) const { return stop(w, s) - start(w, s); }
    bool tight(Slice s) const { return passes_tightness_gate(first(s), last(s), ctx(s)); }
    // A run worth importing: holds bytes, and in mode runs passes the gate on its own.
    bool importable(Slice s) const { return !s.empty() && ctx(s) > 0 && (!runs_mode_ || tight(s)); }

    std::string file_name(std::uint32_t region) const {
        const std::uint32_t file = plan_.regions[region].file;
        return model_.files[file].path.empty() ? fmt::format("#{}", file) : model_.files[file].path;
    }
    const TargetDesc& target_of(std::uint32_t region) const {
        return model_.targets[plan_.regions[region].target];
    }
    static const std::string& importer_key(const TargetDesc& target) {
        return target.importer_key.empty() ? target.name : target.importer_key;
    }

    // Tensors of `s` fall back, each with `reason`.
    void refuse(std::uint32_t region, Slice s, const std::string& reason) {
        if (s.empty()) return;
        RegionWork& w = work_[region];
        for (std::uint32_t k = s.b; k < s.e; ++k) {
            TensorPlacement& place = plan_.tensors[order_[k]];
            place.run = no_index;
            place.reason = reason;
        }
        w.refused_tensors += s.e - s.b;
        w.refused_bytes += ctx(s);
        if (w.first_refused == none || s.b < w.first_refused) w.first_refused = s.b;
    }

    // --- sorting (sort_tensors) ---------------------------------------------------------------
    void sort_tensors();
    void group_by_counting();
    void group_by_comparison();
    void sort_group(const Group& g);
    void sort_group_by_offset(const Group& g);
    void order_equal_offsets(const Group& g);
    void put_misaligned_last(Group& g);

    // --- regions (run) ------------------------------------------------------------------------
    void add_regions();
    void plan_region(std::uint32_t region, const internal::ImportSwitch& import_switch);
    void refuse_misaligned(std::uint32_t region);
    std::string import_reason(const PlanRegion& region) const;
    std::string gate_reason(const PlanRegion& region) const;
    static std::string policy_note(DeviceMemory memory);
    std::string whole_fallback_reason(const PlanRegion& region,
                                      const internal::ImportSwitch& import_switch) const;
    void add_totals();

    // --- runs of one device region ------------------------------------------------------------
    void mark_clusters(const RegionWork& w);
    void plan_device_region(std::uint32_t region);
    std::uint32_t refuse_unmappable_tail(std::uint32_t region, std::uint32_t end);
    void append_clusters(Slice span, std::vector<Slice>& out) const;
    std::vector<Slice> split_to_limit(std::uint32_t region, const std::vector<Slice>& pieces);
    std::uint32_t cheapest_cut(const RegionWork& w, std::uint32_t i, std::uint32_t k) const;
    std::vector<Slice> merge_runs(std::uint32_t region, const std::vector<Slice>& units,
                                 std::uint64_t threshold);
    std::vector<std::uint32_t> merge_across_gaps(std::uint32_t region,
                                                 const std::vector<Slice>& units,
                                                 std::uint64_t threshold,
                                                 std::size_t& importable_groups);
    std::vector<Slice> runs_from_groups(std::uint32_t region, const std::vector<Slice>& units,
                                       const std::vector<std::uint32_t>& group_end,
                                       std::size_t importable_groups);
    std::vector<Slice> keep_within_budget(std::uint32_t region, const std::vector<Slice>& runs);

    // --- shared pages across runs of one importer and file ------------------------------------
    void separate_shared_pages();
    struct RunRef {
        std::uint64_t lane, start;
        std::uint32_t region, run;
    };
    // One way to stop a run sharing a page: leave out `drop`, keep `rest` if `rest_ok`; `loss`
    // is the tensor bytes that falls back (the whole run when the rest is not importable).
    struct Cut {
        Slice drop, rest;
        bool rest_ok = false;
        std::uint64_t loss = UINT64_MAX; // the default Cut is never the cheaper side
    };
    Slice& span_of(const RunRef& ref) { return work_[ref.region].runs[ref.run]; }
    std::uint64_t stop_of(const RunRef& ref) const {
        return stop(work_[ref.region], work_[ref.region].runs[ref.run]);
    }
    void separate_lane(const RunRef* refs, std::size_t count);
    bool separate_pair(const RunRef& a, const RunRef& b, bool overlaps_one);
    Cut cut_leading(const RegionWork& w, Slice run, std::uint64_t bound_below) const;
    Cut cut_trailing(const RegionWork& w, Slice run, std::uint64_t bound_above) const;
    std::string shared_reason(const RunRef& loser, const RunRef& other, std::uint64_t this_loss,
                              std::uint64_t other_loss, bool overlaps_one) const;
    void drop_shared(const RunRef& loser, const Cut& cut, const std::string& reason);

    // --- the plan's regions -------------------------------------------------------------------
    void finish_region(std::uint32_t region);
    void emit_runs(std::uint32_t region);
    std::string region_reason(std::uint32_t region);
    void append_import_details(std::uint32_t region, std::string& reason) const;
};

// Orders tensors by (target, file, offset). Engines hand tensors over in file order, so a
// stable counting sort by (target, file) leaves every group sorted already and the whole step
// is O(n); a group that is not (or a target x file space too large to count over) is sorted by
// comparison. A plain comparison sort of 1M tensors took most of the planning time.
void Planner::sort_tensors() {
    const std::size_t n = model_.tensors.size();
    const std::uint64_t files = model_.files.size(), targets = model_.targets.size();
    order_.resize(n);
    if (targets * files <= 2 * n + 1024 && targets * files < UINT32_MAX) group_by_counting();
    else group_by_comparison();
    offset_.resize(n);
    end_.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
        const TensorDesc& t = model_.tensors[order_[k]];
        offset_[k] = t.offset;
        end_[k] = t.offset + t.size; // validate(): cannot wrap
    }
    bool nested = false;
    for (Group& g : groups_) {
        sort_group(g);
        put_misaligned_last(g);
        // Each part of a group is in offset order; where the parts meet, ends may fall.
        for (std::uint32_t k = g.begin + 1; k < g.end && !nested; ++k)
            nested = k != g.aligned_end && end_[k] < end_[k - 1];
    }
    if (nested) nested_ends_ = std::make_unique<RangeMax>(end_);
    prefix_.resize(n + 1);
    prefix_[0] = 0;
    for (std::size_t k = 0; k < n; ++k) prefix_[k + 1] = prefix_[k] + (end_[k] - offset_[k]);
    cluster_start_.assign(n, 0);
}

// Stable counting sort by (target, file) into order_, and the groups it finds.
void Planner::group_by_counting() {
    const std::size_t n = model_.tensors.size();
    const std::uint64_t files = model_.files.size(), groups = model_.targets.size() * files;
    // One pass over the (large) TensorDesc array; the second reads the compact keys.
    std::vector<std::uint32_t> key(n), start(groups + 1, 0);
    for (std::uint32_t i = 0; i < n; ++i) {
        const TensorDesc& t = model_.tensors[i];
        key[i] = static_cast<std::uint32_t>(std::uint64_t{t.target} * files + t.file);
        ++start[key[i] + 1];
    }
    for (std::size_t g = 1; g < start.size(); ++g) start[g] += start[g - 1];
    for (std::size_t g = 0; g + 1 < start.size(); ++g)
        if (start[g] != start[g + 1])
            groups_.push_back({start[g], start[g + 1], static_cast<std::uint32_t>(g / files),
                               static_cast<std::uint32_t>(g % files)});
    for (std::uint32_t i = 0; i < n; ++i) order_[start[key[i]]++] = i;
}

// Comparison sort by (target, file, offset, index) into order_, and the groups it finds.
void Planner::group_by_comparison() {
    const std::size_t n = model_.tensors.size();
    std::iota(order_.begin(), order_.end(), 0u);
    std::sort(order_.begin(), order_.end(), [&](std::uint32_t a, std::uint32_t b) {
        const TensorDesc& x = model_.tensors[a];
        const TensorDesc& y = model_.tensors[b];
        if (x.target != y.target) return x.target < y.target;
        if (x.file != y.file) return x.file < y.file;
        return x.offset != y.offset ? x.offset < y.offset : a < b;
    });
    for (std::uint32_t k = 0; k < n;) {
        const TensorDesc& head = model_.tensors[order_[k]];
        std::uint32_t j = k + 1;
        while (j < n && model_.tensors[order_[j]].target == head.target &&
               model_.tensors[order_[j]].file == head.file)
            ++j;
        groups_.push_back({k, j, head.target, head.file});
        k = j;
    }
}

// Puts group `g` in (offset, index) order; offset_ and end_ follow order_.
void Planner::sort_group(const Group& g) {
    bool sorted = true;
    for (std::uint32_t k = g.begin + 1; k < g.end && sorted; ++k)
        sorted = offset_[k - 1] <= offset_[k];
    if (!sorted) sort_group_by_offset(g);
    else order_equal_offsets(g);
}

void Planner::sort_group_by_offset(const Group& g) {
    struct Entry {
        std::uint64_t offset;
        std::uint32_t index;
    };
    std::vector<Entry> entries(g.end - g.begin);
    for (std::uint32_t k = g.begin; k < g.end; ++k) entries[k - g.begin] = {offset_[k], order_[k]};
    // Ties by index: the plan must not depend on the order tensors came in.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.offset != b.offset ? a.offset < b.offset : a.index < b.index;
    });
    for (std::uint32_t k = g.begin; k < g.end; ++k) {
        const Entry& e = entries[k - g.begin];
        order_[k] = e.index;
        offset_[k] = e.offset;
        end_[k] = e.offset + model_.tensors[e.index].size;
    }
}

// Equal offsets keep input order from the stable counting sort; put them in index order so the
// plan does not depend on the input order.
void Planner::order_equal_offsets(const Group& g) {
    for (std::uint32_t k = g.begin + 1; k < g.end; ++k) {
        if (offset_[k - 1] != offset_[k] || order_[k - 1] < order_[k]) continue;
        std::uint32_t b = k - 1, e = k + 1;
        while (b > g.begin && offset_[b - 1] == offset_[k]) --b;
        while (e < g.end && offset_[e] == offset_[k]) ++e;
        std::sort(order_.begin() + b, order_.begin() + e);
        for (std::uint32_t q = b; q < e; ++q) end_[q] = offset_[q] + model_.tensors[order_[q]].size;
        k = e - 1;
    }
}

// A device tensor whose offset is not a multiple of its importer's tensor alignment can be served
// by no import (an engine places a tensor at buffer base + offset_in_run, and its buffer type
// needs that aligned): such tensors move behind the group's aligned ones, both parts keeping
// their offset order, so runs are planned over the aligned slice alone.
void Planner::put_misaligned_last(Group& g) {
    g.aligned_end = g.end;
    const ImporterCaps& caps = model_.targets[g.target].caps;
    const std::uint64_t a = caps.tensor_alignment;
    if (caps.is_cpu || a <= 1) return;
    std::vector<std::uint32_t> misaligned;
    std::uint32_t kept = g.begin;
    for (std::uint32_t k = g.begin; k < g.end; ++k) {
        if (offset_[k] % a != 0) {
            misaligned.push_back(order_[k]);
            continue;
        }
        order_[kept] = order_[k];
        offset_[kept] = offset_[k];
        end_[kept] = end_[k];
        ++kept;
    }
    g.aligned_end = kept;
    for (std::uint32_t index : misaligned) {
        const TensorDesc& t = model_.tensors[index];
        order_[kept] = index;
        offset_[kept] = t.offset;
        end_[kept] = t.offset + t.size;
        ++kept;
    }
}

// A cluster is a maximal run of tensors whose aligned extents overlap: they share a page (or an
// importer-alignment block), so two imports may only cut between clusters. Touching extents do
// not overlap, so they start a new cluster.
void Planner::mark_clusters(const RegionWork& w) {
    std::uint64_t reach = 0;
    for (std::uint32_t k = w.begin; k < w.end; ++k) {
        cluster_start_[k] = k == w.begin || align_down(offset_[k], w.align) >= reach;
        reach = std::max(reach, align_up_saturating(end_[k], w.align));
    }
}

// Mode runs: the last cluster of a file can need an extent past the mapped length (importer
// alignment above the page size); it alone falls back instead of the whole region.
std::uint32_t Planner::refuse_unmappable_tail(std::uint32_t region, std::uint32_t end) {
    const RegionWork& w = work_[region];
    Slice tail{end - 1, end};
    while (!cluster_start_[tail.b]) --tail.b; // w.begin always starts a cluster
    if (stop(w, tail) <= w.mapped_len) return end;
    refuse(region, tail,
           fmt::format("aligned extent [{:#x}, {:#x}) runs past the mapped length {:#x} of file "
                       "{} (alignment {} > page size {})",
                       start(w, tail), stop(w, tail), w.mapped_len, file_name(region), w.align,
                       page_));
    return tail.b;
}

// The clusters of `span`, in order (a span that starts inside a cluster starts a unit there).
void Planner::append_clusters(Slice span, std::vector<Slice>& out) const {
    std::uint32_t begin = span.b;
    for (std::uint32_t k = span.b + 1; k < span.e; ++k) {
        if (!cluster_start_[k]) continue;
        out.push_back({begin, k});
        begin = k;
    }
    out.push_back({begin, span.e});
}

// Splits every piece whose extent passes the importer's limit at tensor boundaries, each tensor
// wholly inside one import. A cut between clusters costs nothing; a cut inside a cluster makes
// two imports share a page, which separate_shared_pages() then resolves by leaving the cheaper
// side out. So among the cuts that keep the piece at least half the limit (at most twice the
// minimum number of imports), the cheapest is taken, the farthest on ties.
std::vector<Slice> Planner::split_to_limit(std::uint32_t region, const std::vector<Slice>& pieces) {
    RegionWork& w = work_[region];
    const std::uint64_t limit = w.max_import;
    std::vector<Slice> out;
    out.reserve(pieces.size());
    for (Slice p : pieces) {
        if (limit == 0 || extent(w, p) <= limit) {
            out.push_back(p);
            continue;
        }
        std::uint32_t i = p.b;
        while (i < p.e) {
            const std::uint64_t base = align_down(offset_[i], w.align);
            std::uint64_t reach = align_up_saturating(end_[i], w.align);
            if (reach - base > limit) {
                refuse(region, {i, i + 1},
                       fmt::format("needs an import of {} bytes for its {} bytes, over the "
                                   "importer's maximum import size {}",
                                   reach - base, size_at(i), limit));
                ++i;
                continue;
            }
            std::uint32_t k = i + 1;
            while (k < p.e) {
                const std::uint64_t next = std::max(reach, align_up_saturating(end_[k], w.align));
                if (next - base > limit) break;
                reach = next;
                ++k;
            }
            if (k == p.e) {
                out.push_back({i, k});
                break;
            }
            const std::uint32_t cut = cheapest_cut(w, i, k);
            out.push_back({i, cut});
            ++w.limit_cuts;
            i = cut;
        }
    }
    return out;
}

// Where to end a piece that starts at tensor i when [i, k) is the most that fits the limit:
// the cheapest cut in (i, k] among those that keep the piece at least half the limit, the
// farthest on ties. A cut between clusters is free; inside one it costs the smaller neighbour.
std::uint32_t Planner::cheapest_cut(const RegionWork& w, std::uint32_t i, std::uint32_t k) const {
    auto cut_cost = [&](std::uint32_t c) -> std::uint64_t {
        return cluster_start_[c] ? 0 : std::min(size_at(c - 1), size_at(c));
    };
    const std::uint64_t base = align_down(offset_[i], w.align);
    std::uint32_t best = k;
    std::uint64_t best_cost = cut_cost(k);
    std::uint64_t reach = align_up_saturating(end_[i], w.align);
    for (std::uint32_t c = i + 1; c < k; ++c) {
        if (reach - base >= w.max_import / 2) {
            const std::uint64_t cost = cut_cost(c);
            if (cost < best_cost || (cost == best_cost && best < c)) {
                best = c;
                best_cost = cost;
            }
        }
        reach = std::max(reach, align_up_saturating(end_[c], w.align));
    }
    return best;
}

// Merges units (clusters, or pieces cut by the size limit) into runs across gaps in ascending
// order, Kruskal-style: every gap below `threshold` (or touching) is merged when the merged run
// passes the gate (mode runs) and stays within the size limit, smallest first, so a chain of
// small gaps that would add up past the gate is merged as far as the gate allows and no
// further. Then, while there are more importable runs than the budget, the same order goes on
// across wider gaps. Pinned bytes are the units' extents plus the gaps merged over, so for a
// fixed number of imports, merging the smallest gaps is the minimum whenever the gate and the
// limit allow those merges (tests/test_planner_runs.cpp checks it against brute force). Runs
// that still cannot be imported fall back; if more runs remain than the budget, those with the
// fewest tensor bytes fall back too. O(m log m) for m units.
std::vector<Slice> Planner::merge_runs(std::uint32_t region, const std::vector<Slice>& units,
                                      std::uint64_t threshold) {
    if (units.empty()) return {};
    std::size_t importable_groups = 0;
    const std::vector<std::uint32_t> group_end =
        merge_across_gaps(region, units, threshold, importable_groups);
    std::vector<Slice> runs = runs_from_groups(region, units, group_end, importable_groups);
    if (runs.size() <= budget_) return runs;
    return keep_within_budget(region, runs);
}

// The merge step of merge_runs(): returns group_end, where group_end[i] is the last unit of the
// group that unit i starts (only read at a group's first unit), and the number of importable
// groups.
std::vector<std::uint32_t> Planner::merge_across_gaps(std::uint32_t region,
                                                      const std::vector<Slice>& units,
                                                      std::uint64_t threshold,
                                                      std::size_t& importable_groups) {
    RegionWork& w = work_[region];
    const std::size_t m = units.size();
    std::vector<std::uint64_t> gap(m - 1);
    for (std::size_t j = 0; j + 1 < m; ++j) {
        const std::uint64_t a = stop(w, units[j]), b = start(w, units[j + 1]);
        gap[j] = b > a ? b - a : 0; // pieces cut inside a cluster overlap: never mergeable
    }
    std::vector<std::uint32_t> by_gap(m - 1);
    std::iota(by_gap.begin(), by_gap.end(), 0u);
    std::sort(by_gap.begin(), by_gap.end(), [&](std::uint32_t a, std::uint32_t b) {
        return gap[a] != gap[b] ? gap[a] < gap[b] : a < b;
    });
    // Groups are contiguous: group_begin[last unit] and group_end[first unit] describe one.
    std::vector<std::uint32_t> group_begin(m), group_end(m);
    std::iota(group_begin.begin(), group_begin.end(), 0u);
    std::iota(group_end.begin(), group_end.end(), 0u);
    importable_groups = 0;
    for (Slice u : units) importable_groups += importable(u);
    for (std::uint32_t j : by_gap) {
        const bool below_threshold = gap[j] == 0 || gap[j] < threshold;
        if (!below_threshold && importable_groups <= budget_) break; // the rest are wider
        const std::uint32_t lo = group_begin[j], hi = group_end[j + 1];
        const Slice left{units[lo].b, units[j].e}, right{units[j + 1].b, units[hi].e};
        const Slice merged{left.b, right.e};
        if (w.max_import != 0 && extent(w, merged) > w.max_import) continue;
        if (runs_mode_ && !tight(merged)) {
            w.gate_kept_open += below_threshold;
            continue;
        }
        importable_groups = importable_groups + importable(merged) - importable(left) -
                            importable(right);
        group_end[lo] = hi;
        group_begin[hi] = lo;
        ++(below_threshold ? w.threshold_merges : w.budget_merges);
    }
    return group_end;
}

// The groups merge_across_gaps() formed, in file order; those that cannot be imported fall back.
std::vector<Slice> Planner::runs_from_groups(std::uint32_t region, const std::vector<Slice>& units,
                                            const std::vector<std::uint32_t>& group_end,
                                            std::size_t importable_groups) {
    std::vector<Slice> runs;
    runs.reserve(importable_groups);
    for (std::uint32_t i = 0; i < units.size(); i = group_end[i] + 1) {
        const Slice g{units[i].b, units[group_end[i]].e};
        if (importable(g)) {
            runs.push_back(g);
        } else if (ctx(g) == 0) {
            refuse(region, g, "holds no tensor bytes: nothing to import");
        } else {
            // Only a unit that no merge could make tight gets here: a cluster (or a part of one
            // the size limit cut) whose tensors share pages, so it cannot be cut any further.
            refuse(region, g,
                   fmt::format("in a cluster of tensors that share pages, [{:#x}, {:#x}) spans {} "
                               "bytes for {} bytes of tensors: it fails the gate on its own "
                               "(limit {}) and cannot be cut without two imports sharing a page",
                               first(g), last(g), last(g) - first(g), ctx(g),
                               tightness_limit(ctx(g))));
        }
    }
    return runs;
}

// More runs than the budget even after every merge: the budget's worth with the most tensor
// bytes stay (ties: the earlier run), the others fall back.
std::vector<Slice> Planner::keep_within_budget(std::uint32_t region,
                                              const std::vector<Slice>& runs) {
    RegionWork& w = work_[region];
    std::vector<std::uint32_t> rank(runs.size());
    std::iota(rank.begin(), rank.end(), 0u);
    std::sort(rank.begin(), rank.end(), [&](std::uint32_t a, std::uint32_t b) {
        const std::uint64_t ca = ctx(runs[a]), cb = ctx(runs[b]);
        return ca != cb ? ca > cb : a < b;
    });
    std::vector<std::uint8_t> keep(runs.size(), 0);
    for (std::size_t r = 0; r < budget_; ++r) keep[rank[r]] = 1;
    std::vector<Slice> kept;
    kept.reserve(budget_);
    for (std::size_t i = 0; i < runs.size(); ++i) {
        if (keep[i]) {
            kept.push_back(runs[i]);
            continue;
        }
        ++w.budget_dropped_runs;
        refuse(region, runs[i],
               fmt::format("left out by the import budget (max_imports_per_region = {}): its run "
                           "of {} bytes is among the {} smallest of {}",
                           budget_, ctx(runs[i]), runs.size() - budget_, runs.size()));
    }
    w.budget_needed = static_cast<std::uint32_t>(runs.size());
    return kept;
}

void Planner::plan_device_region(std::uint32_t region) {
    RegionWork& w = work_[region];
    if (w.begin == w.end) return; // every tensor is off the importer's tensor alignment
    mark_clusters(w);
    std::uint32_t end = w.end;
    if (runs_mode_) end = refuse_unmappable_tail(region, end);
    if (w.begin == end) return;
    const Slice usable{w.begin, end};
    std::vector<Slice> units;
    std::uint64_t threshold = 0; // span and gate: merges only to fit the budget
    if (options_.mode == PlanMode::span || plan_.regions[region].gate) {
        // One import, as upstream, unless the size limit cuts it.
        units = split_to_limit(region, {usable});
        if (runs_mode_) {
            // A part of a tight region can fail the gate on its own (its gaps, less of the
            // region's slack): such a part is planned from its clusters like any other run.
            std::vector<Slice> parts;
            for (Slice u : units) {
                if (tight(u)) parts.push_back(u);
                else append_clusters(u, parts);
            }
            units = std::move(parts);
            threshold = options_.merge_gap;
        }
    } else {
        std::vector<Slice> clusters;
        append_clusters(usable, clusters);
        w.clusters = static_cast<std::uint32_t>(clusters.size());
        units = split_to_limit(region, clusters);
        threshold = options_.merge_gap;
    }
    for (Slice p : merge_runs(region, units, threshold)) {
        if (stop(w, p) > w.mapped_len)
            refuse(region, p,
                   fmt::format("aligned extent [{:#x}, {:#x}) runs past the mapped length {:#x} "
                               "of file {} (alignment {} > page size {})",
                               start(w, p), stop(w, p), w.mapped_len, file_name(region), w.align,
                               page_));
        else
            w.runs.push_back(p);
    }
}

// Two imports through one importer must not share a page: for HSA, a page locked twice is
// unlocked by the first release while the other import still uses it. Within a region, runs are
// cut only between clusters, so they cannot share one, except where the size limit cut inside a
// cluster (and merging back would pass the limit). Across regions (targets with one importer),
// an import serves one target, so merging is impossible. Either way one side's boundary tensors
// are left out: the side that loses fewer bytes, counting a run whose rest would no longer be
// importable as lost whole.
void Planner::separate_shared_pages() {
    std::vector<RunRef> refs;
    for (std::uint32_t r = 0; r < work_.size(); ++r) {
        const RegionWork& w = work_[r];
        if (w.lane == no_lane) continue;
        for (std::uint32_t i = 0; i < w.runs.size(); ++i)
            refs.push_back({w.lane, start(w, w.runs[i]), r, i});
    }
    std::sort(refs.begin(), refs.end(), [](const RunRef& a, const RunRef& b) {
        if (a.lane != b.lane) return a.lane < b.lane;
        if (a.start != b.start) return a.start < b.start;
        if (a.region != b.region) return a.region < b.region;
        return a.run < b.run;
    });
    for (std::size_t i = 0; i < refs.size();) {
        std::size_t j = i + 1;
        while (j < refs.size() && refs[j].lane == refs[i].lane) ++j;
        if (j - i > 1) separate_lane(refs.data() + i, j - i);
        i = j;
    }
    for (RegionWork& w : work_)
        w.runs.erase(std::remove_if(w.runs.begin(), w.runs.end(),
                                    [](Slice s) { return s.empty(); }),
                     w.runs.end());
}

// Walks one lane's runs in file order; each run that shares a page with the runs kept so far
// loses its boundary tensors, or the last kept run loses its own (separate_pair()).
void Planner::separate_lane(const RunRef* refs, std::size_t count) {
    std::vector<RunRef> kept; // disjoint, in file order; the last one reaches farthest
    for (std::size_t n = 0; n < count; ++n) {
        const RunRef& b = refs[n];
        const std::uint64_t b_start = start(work_[b.region], span_of(b));
        if (kept.empty() || stop_of(kept.back()) <= b_start) {
            kept.push_back(b);
            continue;
        }
        // B overlaps the last kept import, and maybe more before it; only "one or more" matters
        // (counting them all would make interleaved spans quadratic).
        const bool overlaps_one = kept.size() < 2 || stop_of(kept[kept.size() - 2]) <= b_start;
        const RunRef a = kept.back();
        if (separate_pair(a, b, overlaps_one)) {
            if (span_of(a).empty()) kept.pop_back();
            kept.push_back(b);
        } else if (!span_of(b).empty()) {
            kept.push_back(b);
        }
    }
}

// Run B overlaps the kept run A (and more kept runs unless `overlaps_one`). Leaves out B's
// leading tensors or, when A is the only import B overlaps, A's trailing ones: the side that
// loses fewer bytes. Returns true when A lost.
bool Planner::separate_pair(const RunRef& a, const RunRef& b, bool overlaps_one) {
    const RegionWork& wa = work_[a.region];
    const RegionWork& wb = work_[b.region];
    const Slice A = span_of(a), B = span_of(b);
    // Within a region only a size-limit cut makes two runs share a page (runs are otherwise
    // cut between clusters), so merging them back is never possible.
    assert(a.region != b.region || wa.max_import != 0);
    const Cut b_cut = cut_leading(wb, B, stop(wa, A));
    Cut a_cut; // never the cheaper side unless computed
    if (overlaps_one) a_cut = cut_trailing(wa, A, start(wb, B));
    const bool use_a = a_cut.loss < b_cut.loss;
    if (use_a) drop_shared(a, a_cut, shared_reason(a, b, a_cut.loss, b_cut.loss, overlaps_one));
    else drop_shared(b, b_cut, shared_reason(b, a, b_cut.loss, a_cut.loss, overlaps_one));
    return use_a;
}

// Leave out the run's leading tensors: those whose aligned start lies below `bound_below` (the
// other import's end).
Planner::Cut Planner::cut_leading(const RegionWork& w, Slice run, std::uint64_t bound_below) const {
    const std::uint64_t bound = align_up_saturating(bound_below, w.align);
    const auto q = static_cast<std::uint32_t>(
        std::lower_bound(offset_.begin() + run.b, offset_.begin() + run.e, bound) -
        offset_.begin());
    Cut cut{{run.b, q}, {q, run.e}};
    cut.rest_ok = importable(cut.rest);
    cut.loss = cut.rest_ok ? ctx(cut.drop) : ctx(run);
    return cut;
}

// Leave out the run's trailing tensors: keep its longest prefix whose aligned end stays at or
// below `bound_above` (the other import's start).
Planner::Cut Planner::cut_trailing(const RegionWork& w, Slice run,
                                   std::uint64_t bound_above) const {
    const std::uint64_t limit_end = align_down(bound_above, w.align);
    std::uint32_t lo = run.b, hi = run.e; // prefix [run.b, lo) fits, [run.b, hi) does not
    while (hi - lo > 1) {
        const std::uint32_t mid = lo + (hi - lo) / 2;
        if (last({run.b, mid}) <= limit_end) lo = mid;
        else hi = mid;
    }
    Cut cut{{lo, run.e}, {run.b, lo}};
    cut.rest_ok = importable(cut.rest);
    cut.loss = cut.rest_ok ? ctx(cut.drop) : ctx(run);
    return cut;
}

// The reason of each tensor `loser` leaves out because it shares a page with `other`.
std::string Planner::shared_reason(const RunRef& loser, const RunRef& other,
                                   std::uint64_t this_loss, std::uint64_t other_loss,
                                   bool overlaps_one) const {
    const RegionWork& wo = work_[other.region];
    const Slice o = wo.runs[other.run];
    const TargetDesc& target = target_of(other.region);
    return fmt::format(
        "shares a page with import [{:#x}, {:#x}) of target '{}' in file {} (importer "
        "'{}'): left out so that no page is imported twice; {}{}",
        start(wo, o), stop(wo, o), target.name, file_name(other.region), importer_key(target),
        overlaps_one ? fmt::format("leaving out this side loses {} bytes, the other side "
                                   "{}", this_loss, other_loss)
                     : fmt::format("the other side is several imports, so this side is "
                                   "left out ({} bytes)", this_loss),
        loser.region == other.region
            ? fmt::format("; both imports serve this region and merging them "
                          "would pass the importer's maximum import size {}",
                          wo.max_import)
            : std::string());
}

// `loser` leaves out `cut.drop`, and the rest too when it would no longer be importable.
void Planner::drop_shared(const RunRef& loser, const Cut& cut, const std::string& reason) {
    RegionWork& wl = work_[loser.region];
    Slice& run = span_of(loser);
    refuse(loser.region, cut.drop, reason);
    wl.shared_dropped_tensors += cut.drop.e - cut.drop.b;
    wl.shared_dropped_bytes += ctx(cut.drop);
    if (cut.rest_ok) {
        run = cut.rest;
        return;
    }
    const Slice rest = cut.rest;
    if (!rest.empty())
        refuse(loser.region, rest,
               fmt::format("its run lost the tensors that share a page with another "
                           "import of importer '{}', and the rest [{:#x}, {:#x}) with {} "
                           "bytes {}; the run falls back",
                           importer_key(target_of(loser.region)), first(rest), last(rest),
                           ctx(rest),
                           ctx(rest) == 0 ? "holds no tensor bytes"
                                          : fmt::format("no longer passes the gate "
                                                        "(limit {})",
                                                        tightness_limit(ctx(rest)))));
    run = {run.e, run.e};
}

// Turns the region's working state into its PlanRegion: tensors, runs, decision and reason.
void Planner::finish_region(std::uint32_t r) {
    PlanRegion& region = plan_.regions[r];
    emit_runs(r);
    region.decision = region.runs.empty() ? Decision::fallback : Decision::import;
    region.reason = region_reason(r);
}

// The region's tensors and runs, and the placement of every tensor in a run.
void Planner::emit_runs(std::uint32_t r) {
    PlanRegion& region = plan_.regions[r];
    const RegionWork& w = work_[r];
    region.tensors.assign(order_.begin() + w.begin, order_.begin() + w.group_end);
    if (w.end != w.group_end) {
        // The misaligned tensors were put last; the region lists its tensors by offset.
        const auto by_offset = [&](std::uint32_t a, std::uint32_t b) {
            const std::uint64_t x = model_.tensors[a].offset, y = model_.tensors[b].offset;
            return x != y ? x < y : a < b;
        };
        std::inplace_merge(region.tensors.begin(), region.tensors.begin() + (w.end - w.begin),
                           region.tensors.end(), by_offset);
    }
    for (std::uint32_t k = w.begin; k < w.group_end; ++k) plan_.tensors[order_[k]].region = r;
    region.runs.reserve(w.runs.size());
    for (Slice s : w.runs) {
        PlanRun run;
        run.first = first(s);
        run.last = last(s);
        run.extent_offset = start(w, s);
        run.extent_size = stop(w, s) - run.extent_offset;
        run.ctx_bytes = ctx(s);
        run.tensors.assign(order_.begin() + s.b, order_.begin() + s.e);
        const auto index = static_cast<std::uint32_t>(region.runs.size());
        for (std::uint32_t k = s.b; k < s.e; ++k) {
            TensorPlacement& place = plan_.tensors[order_[k]];
            place.run = index;
            place.offset_in_run = offset_[k] - run.extent_offset;
            place.reason.clear();
        }
        region.runs.push_back(std::move(run));
    }
}

// The base reason, and for a device region that imports, what shaped its imports. Consumes
// the base reason.
std::string Planner::region_reason(std::uint32_t r) {
    const PlanRegion& region = plan_.regions[r];
    RegionWork& w = work_[r];
    if (w.whole_fallback) return std::move(w.base_reason);
    if (region.runs.empty())
        return w.first_refused == none
                   ? std::move(w.base_reason)
                   : fmt::format("{}; nothing imported: {}", w.base_reason,
                                 plan_.tensors[order_[w.first_refused]].reason);
    if (model_.targets[region.target].caps.is_cpu) return std::move(w.base_reason);
    std::string reason = fmt::format("{}; {} import{}", w.base_reason, region.runs.size(),
                                     region.runs.size() == 1 ? "" : "s");
    append_import_details(r, reason);
    return reason;
}

void Planner::append_import_details(std::uint32_t r, std::string& reason) const {
    const RegionWork& w = work_[r];
    if (w.clusters != 0)
        reason += fmt::format("; from {} page-disjoint clusters, {} merged across gaps < {} bytes",
                              w.clusters, w.threshold_merges, options_.merge_gap);
    if (w.gate_kept_open != 0)
        reason += fmt::format("; {} gap(s) < {} bytes left open so that every run passes the gate",
                              w.gate_kept_open, options_.merge_gap);
    if (w.limit_cuts != 0)
        reason += fmt::format("; {} cut(s) for the importer's maximum import size {}",
                              w.limit_cuts, w.max_import);
    if (w.budget_merges != 0)
        reason += fmt::format("; {} merge(s) across the smallest gaps for max_imports_per_region "
                              "= {}", w.budget_merges, budget_);
    if (w.budget_dropped_runs != 0)
        reason += fmt::format("; {} run(s) left out by that budget: {} runs remain after every "
                              "merge that keeps them {}, and those with the fewest tensor bytes "
                              "fall back",
                              w.budget_dropped_runs, w.budget_needed,
                              runs_mode_ ? "tight and within the size limit"
                                         : "within the size limit");
    if (w.shared_dropped_tensors != 0)
        reason += fmt::format("; {} tensor(s) ({} bytes) left out where a page is shared with "
                              "another import of importer '{}' (not merged: an import serves one "
                              "target, and within a region only a size-limit cut shares a page)",
                              w.shared_dropped_tensors, w.shared_dropped_bytes,
                              importer_key(target_of(r)));
    if (w.misaligned_tensors != 0)
        reason += fmt::format("; {} tensor(s) ({} bytes) left out: their offsets are not "
                              "multiples of the importer's tensor alignment {}",
                              w.misaligned_tensors, w.misaligned_bytes,
                              target_of(r).caps.tensor_alignment);
    if (w.refused_tensors != 0)
        reason += fmt::format("; {} tensor(s) ({} bytes) fall back in all, each with its reason",
                              w.refused_tensors, w.refused_bytes);
}

Plan Planner::run(const internal::ImportSwitch& import_switch) {
    plan_.mode = options_.mode;
    plan_.import_policy = options_.import_policy;
    plan_.page_size = page_;
    plan_.tensors.resize(model_.tensors.size());
    sort_tensors();
    add_regions();
    for (std::uint32_t r = 0; r < work_.size(); ++r) plan_region(r, import_switch);
    separate_shared_pages();
    for (std::uint32_t r = 0; r < work_.size(); ++r) finish_region(r);
    add_totals();
    return std::move(plan_);
}

// One region per (target, file) group, with what planning it needs from its target.
void Planner::add_regions() {
    std::map<std::string_view, std::uint32_t> importer_ids;
    for (const TargetDesc& t : model_.targets)
        importer_ids.emplace(importer_key(t), static_cast<std::uint32_t>(importer_ids.size()));

    plan_.regions.reserve(groups_.size());
    work_.reserve(groups_.size());
    for (const Group& g : groups_) {
        PlanRegion region;
        region.target = g.target;
        region.file = g.file;
        region.first = UINT64_MAX;
        for (Slice part : {Slice{g.begin, g.aligned_end}, Slice{g.aligned_end, g.end}}) {
            if (part.empty()) continue;
            region.first = std::min(region.first, first(part));
            region.last = std::max(region.last, last(part));
        }
        region.ctx_bytes = ctx({g.begin, g.end});
        region.gate = passes_tightness_gate(region.first, region.last, region.ctx_bytes);
        const TargetDesc& target = model_.targets[g.target];
        RegionWork w;
        w.begin = g.begin;
        w.end = g.aligned_end;
        w.group_end = g.end;
        w.align = extent_alignment(target, page_);
        w.mapped_len = align_up_saturating(model_.files[g.file].size, page_);
        w.max_import = target.caps.is_cpu ? 0 : target.caps.max_import_size;
        if (!target.caps.is_cpu)
            w.lane = (std::uint64_t{importer_ids.at(importer_key(target))} << 32) | g.file;
        plan_.regions.push_back(std::move(region));
        work_.push_back(std::move(w));
    }
}

// Decides how region r is served: passthrough, whole fallback, or planned runs.
void Planner::plan_region(std::uint32_t r, const internal::ImportSwitch& import_switch) {
    const PlanRegion& region = plan_.regions[r];
    RegionWork& w = work_[r];
    const Slice whole{w.begin, w.end};
    if (model_.targets[region.target].caps.is_cpu) {
        // Passthrough pins nothing, so the span is always fine.
        w.runs = {whole};
        w.base_reason = "CPU passthrough";
        return;
    }
    const ImporterCaps& caps = model_.targets[region.target].caps;
    if (!import_switch.enabled || caps.refuses_file_pages ||
        !policy_refusals_[region.target].empty() || region.ctx_bytes == 0 ||
        (options_.mode == PlanMode::gate && !region.gate)) {
        w.whole_fallback = true;
        w.base_reason = whole_fallback_reason(region, import_switch);
        refuse(r, {w.begin, w.group_end}, w.base_reason);
        return;
    }
    w.base_reason = import_reason(region);
    refuse_misaligned(r);
    plan_device_region(r);
}

// The region's tensors misaligned for its importer's tensor alignment fall back, each alone.
void Planner::refuse_misaligned(std::uint32_t r) {
    RegionWork& w = work_[r];
    const TargetDesc& target = target_of(r);
    for (std::uint32_t k = w.end; k < w.group_end; ++k)
        refuse(r, {k, k + 1},
               fmt::format("offset {:#x} is not a multiple of the importer's tensor alignment {} "
                           "(target '{}', importer '{}'): no import can serve it where its buffer "
                           "needs it aligned",
                           offset_[k], target.caps.tensor_alignment, target.name,
                           importer_key(target)));
    w.misaligned_tensors = w.group_end - w.end;
    w.misaligned_bytes = ctx({w.end, w.group_end});
}

// Why a device region falls back whole, before any run is planned.
std::string Planner::whole_fallback_reason(const PlanRegion& region,
                                           const internal::ImportSwitch& import_switch) const {
    if (!import_switch.enabled) return import_switch.why_not;
    const TargetDesc& target = model_.targets[region.target];
    // The importer's own probe found that its driver refuses file-backed pages (RADV), so no
    // import of the mapping can work: say so now rather than fail every import later.
    if (target.caps.refuses_file_pages)
        return target.file_pages_note.empty()
                   ? std::string("the importer refuses pages of a file mapping")
                   : target.file_pages_note;
    if (!policy_refusals_[region.target].empty()) return policy_refusals_[region.target];
    if (region.ctx_bytes == 0) return "region holds no tensor bytes";
    return describe_gate_failure(region.first, region.last, region.ctx_bytes);
}

// Why a device region is imported, before planning adds what shaped its imports.
std::string Planner::import_reason(const PlanRegion& region) const {
    return gate_reason(region) + policy_note(model_.targets[region.target].caps.device_memory);
}

// How the gate (and the mode) let a device region import.
std::string Planner::gate_reason(const PlanRegion& region) const {
    if (region.gate)
        return fmt::format("tight: passes the gate (span {} bytes for {} bytes of its own "
                           "tensors, limit {})",
                           region.last - region.first, region.ctx_bytes,
                           tightness_limit(region.ctx_bytes));
    const std::string failure = describe_gate_failure(region.first, region.last, region.ctx_bytes);
    if (options_.mode == PlanMode::span)
        return fmt::format("span mode: the whole span is imported without the gate ({})", failure);
    return fmt::format("not tight ({}); imported as tight runs of its own tensors", failure);
}

// An import the policy allowed on a device that is not known to be unified says what it costs.
std::string Planner::policy_note(DeviceMemory memory) {
    if (memory == DeviceMemory::discrete)
        return "; import_policy=always on a discrete device: every use reads over the bus";
    if (memory == DeviceMemory::coherent)
        return "; import_policy=always on a coherent device: every use reads over the CPU link";
    if (memory == DeviceMemory::unknown)
        return "; import_policy=always, device memory unknown";
    return {};
}

// What compute_totals() finds tensor by tensor, from the runs (no pass over every tensor).
void Planner::add_totals() {
    PlanTotals& totals = plan_.totals;
    for (const PlanRegion& region : plan_.regions) {
        if (model_.targets[region.target].caps.is_cpu) continue;
        totals.device_bytes += region.ctx_bytes;
        for (const PlanRun& run : region.runs) {
            totals.imported_bytes += run.ctx_bytes;
            totals.pinned_bytes += run.extent_size;
            ++totals.imports;
        }
    }
    totals.fallback_bytes = totals.device_bytes - totals.imported_bytes;
}

Status validate(const ModelDesc& model, std::uint64_t page) {
    if (!is_power_of_two(page))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("page size {} is not a power of two", page));
    if (model.tensors.size() >= no_index)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} tensors: the planner indexes at most {}",
                                      model.tensors.size(), no_index - 1));
    for (std::size_t i = 0; i < model.targets.size(); ++i) {
        std::uint64_t a = model.targets[i].caps.alignment;
        if (a != 0 && !is_power_of_two(a))
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("target {} ('{}'): alignment {} is not a power of two",
                                          i, model.targets[i].name, a));
        const std::uint64_t ta = model.targets[i].caps.tensor_alignment;
        if (ta != 0 && !is_power_of_two(ta))
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("target {} ('{}'): tensor_alignment {} is not a power "
                                          "of two", i, model.targets[i].name, ta));
    }
    std::uint64_t total = 0;
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
        // Every extent ends at a tensor end rounded up to the target's alignment: an end that
        // rounds past 2^64 gave a run that does not cover its tensor (issue 44 item 9).
        const std::uint64_t align = extent_alignment(model.targets[t.target], page);
        if (end > std::numeric_limits<std::uint64_t>::max() - (align - 1))
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("tensor {} ('{}'): its end {:#x} in file '{}' rounded "
                                          "up to the {} bytes of target '{}' passes 2^64: no "
                                          "mapping can hold it", i, t.name, end, f.path, align,
                                          model.targets[t.target].name));
        if (__builtin_add_overflow(total, t.size, &total))
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("tensor {} ('{}'): the tensor sizes sum past 2^64 bytes",
                                          i, t.name));
    }
    return {};
}

} // namespace

// Entries whose indices are out of range (a plan edited by hand, or made for another model)
// count as not imported and are skipped where nothing can be read: never an out-of-range read.
PlanTotals compute_totals(const ModelDesc& model, const Plan& plan) {
    const auto is_cpu = [&](std::uint32_t target) {
        return target >= model.targets.size() || model.targets[target].caps.is_cpu;
    };
    PlanTotals totals;
    for (std::size_t i = 0; i < model.tensors.size(); ++i) {
        const TensorDesc& t = model.tensors[i];
        if (is_cpu(t.target)) continue;
        totals.device_bytes += t.size;
        if (i >= plan.tensors.size()) continue;
        const TensorPlacement& place = plan.tensors[i];
        if (place.run != no_index && place.region < plan.regions.size() &&
            plan.regions[place.region].decision == Decision::import)
            totals.imported_bytes += t.size;
    }
    totals.fallback_bytes = totals.device_bytes - totals.imported_bytes;
    for (const PlanRegion& region : plan.regions) {
        if (is_cpu(region.target) || region.decision != Decision::import) continue;
        for (const PlanRun& run : region.runs) {
            totals.pinned_bytes += run.extent_size;
            ++totals.imports;
        }
    }
    return totals;
}

// The core reads no environment: the same inputs always give the same plan here.
Result<Plan> internal::make_plan_with_switch(const ModelDesc& model, const PlanOptions& options,
                                             const internal::ImportSwitch& import_switch) {
    const std::uint64_t page = options.page_size != 0 ? options.page_size : host_page_size();
    if (Status s = validate(model, page); !s) return std::move(s).error();
    return Planner(model, options, page).run(import_switch);
}

// The public edge: the one place make_plan resolves WEIGHTMAP_IMPORT (import_switch.cpp), once,
// before the core runs.
Result<Plan> make_plan(const ModelDesc& model, const PlanOptions& options) {
    return internal::make_plan_with_switch(model, options,
                                           internal::resolve_import_switch(options.import_enabled));
}

} // namespace wm
