// SPDX-License-Identifier: MIT
#include "weightmap/loader.hpp"

#include <set>

#include <fmt/format.h>

#include "internal/writable_reopen.hpp"
#include "planner/import_switch.hpp"
#include "planner/plan_core.hpp"
#include "planner/plan_edit.hpp"

namespace wm {

struct LoadedModel::Impl {
    // Declaration order is teardown order reversed: the placement's imports go before the
    // mappings they point into.
    ModelDesc model;
    MappingDecision decision;
    MappedModel mapping;
    Placement placement;
    std::string reprotect_note;
    ReadReport populate; // empty when not populated
};

LoadedModel::LoadedModel() : impl_(std::make_unique<Impl>()) {}
LoadedModel::LoadedModel(LoadedModel&&) noexcept = default;
LoadedModel& LoadedModel::operator=(LoadedModel&& other) noexcept {
    if (this != &other) {
        unload();
        impl_ = std::move(other.impl_);
    }
    return *this;
}
LoadedModel::~LoadedModel() { unload(); }

const ModelDesc& LoadedModel::model() const noexcept { return impl_->model; }
const MappingDecision& LoadedModel::mapping_decision() const noexcept { return impl_->decision; }
const MappedModel& LoadedModel::mapping() const noexcept { return impl_->mapping; }
const Placement& LoadedModel::placement() const noexcept { return impl_->placement; }
TensorLocation LoadedModel::locate(std::uint32_t index) const {
    return impl_->placement.locate(index);
}
bool LoadedModel::read_only() const noexcept { return impl_->mapping.is_read_only(); }
const std::string& LoadedModel::reprotect_note() const noexcept { return impl_->reprotect_note; }
const ReadReport& LoadedModel::populate_report() const noexcept { return impl_->populate; }

void LoadedModel::unload() noexcept {
    if (!impl_) return;
    impl_->placement.release_all();
    impl_->mapping = MappedModel();
}

namespace {

// The mapping decision over the importers whose targets' policies let them import: a target
// that will fall back for its policy (a discrete card under unified_only) must not make the
// weight files writable.
MappingDecision decide_mapping_for_policies(const ModelDesc& model,
                                            const std::vector<std::string>& paths,
                                            Span<Importer* const> importers,
                                            const PlanOptions& options) {
    std::vector<Importer*> importing;
    for (std::size_t t = 0; t < importers.size() && t < model.targets.size(); ++t) {
        Importer* importer = importers[t];
        if (importer == nullptr) continue;
        const ImporterCaps caps = importer->caps();
        const ImportPolicy policy = effective_import_policy(model.targets[t], options);
        if (!caps.is_cpu && import_policy_refusal(caps, policy).empty())
            importing.push_back(importer);
    }
    if (importing.empty()) {
        MappingDecision decision;
        decision.reason = "read-only: the import policy lets no device importer of this model "
                          "import";
        return decision;
    }
    return decide_mapping(paths, importing, ImportPolicy::always); // already filtered
}

// The files: one importer per target, a path per file.
Result<std::vector<std::string>> checked_paths(const ModelDesc& model,
                                               Span<Importer* const> importers) {
    if (importers.size() != model.targets.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("load_model: {} importers given for {} targets",
                                      importers.size(), model.targets.size()));
    std::vector<std::string> paths;
    for (std::size_t i = 0; i < model.files.size(); ++i) {
        if (model.files[i].path.empty())
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("load_model: file {} has no path", i));
        paths.push_back(model.files[i].path);
    }
    return paths;
}

// Decide the mapping. The control arm maps exactly as an engine without imports would: read-only.
MappingDecision decide_load_mapping(const ModelDesc& model, const std::vector<std::string>& paths,
                                    Span<Importer* const> importers, const PlanOptions& options,
                                    const internal::ImportSwitch& import_switch) {
    if (import_switch.enabled) return decide_mapping_for_policies(model, paths, importers, options);
    MappingDecision decision;
    decision.access = MappingAccess::read_only;
    decision.reason = "read-only: import " + import_switch.why_not;
    return decision;
}

// Map: base_alignment 0 asks for the largest importer alignment above a page.
Result<MappedModel> map_files(const std::vector<std::string>& paths, MappingAccess access,
                              Span<Importer* const> importers, MappingOptions options) {
    if (options.base_alignment == 0) {
        for (Importer* importer : importers)
            if (importer != nullptr)
                options.base_alignment =
                    std::max(options.base_alignment, importer->caps().alignment);
        if (options.base_alignment <= host_page_size()) options.base_alignment = 0;
    }
    return MappedModel::open(paths, access, options);
}

// The real sizes are the truth: a size of 0 is filled from them, and a tensor past the end
// would read beyond the mapping.
Status check_file_sizes(ModelDesc& model, Span<const std::uint64_t> sizes,
                        const std::vector<std::string>& paths) {
    for (std::size_t i = 0; i < model.files.size(); ++i) {
        if (model.files[i].size == 0) model.files[i].size = sizes[i];
        if (model.files[i].size != sizes[i])
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("'{}' is {} bytes, but the model description says {}",
                                          paths[i], sizes[i], model.files[i].size));
    }
    for (const TensorDesc& t : model.tensors) {
        if (t.file < sizes.size() && (t.offset > sizes[t.file] || t.size > sizes[t.file] - t.offset))
            return make_error(ErrorKind::format,
                              fmt::format("'{}' is shorter than tensor '{}' needs: {} bytes, "
                                          "tensor ends at {}", paths[t.file], t.name,
                                          sizes[t.file], t.offset + t.size));
    }
    return {};
}

// On a read-only mapping the regions of importers that need writable pages fall back.
void fall_back_needing_writable(Plan& plan, Span<Importer* const> importers,
                                const MappingDecision& decision) {
    for (std::uint32_t r = 0; r < plan.regions.size(); ++r) {
        const PlanRegion& region = plan.regions[r];
        Importer* importer = importers[region.target];
        if (region.decision != Decision::import || importer == nullptr) continue;
        if (!importer->caps().needs_writable_mapping) continue;
        internal::fall_back_region(
            plan, r,
            decision.unwritable_path.empty()
                ? fmt::format("{} importer needs a writable mapping: {}", importer->name(),
                              decision.reason)
                : fmt::format("weight file not writable: {}", decision.unwritable_path));
    }
}

// The importers holding an import now that refuse PROT_READ, quoted: a region may keep some
// runs and lose others, so the placement says who holds what.
std::string reprotect_blockers(const Placement& placement, Span<Importer* const> importers) {
    std::set<Importer*> holders;
    for (std::size_t i = 0; i < placement.import_count(); ++i)
        if (Importer* importer = importers[placement.import_at(i).target]) holders.insert(importer);
    std::string blockers;
    for (Importer* importer : holders)
        if (!importer->caps().survives_read_only_reprotect)
            blockers += fmt::format("{}'{}'", blockers.empty() ? "" : ", ", importer->name());
    return blockers;
}

// On a writable mapping, after importing: back to PROT_READ where every holder allows it. The
// note says what happened.
std::string reprotect_after_import(MappedModel& mapping, const Placement& placement,
                                   Span<Importer* const> importers, const LoadOptions& options) {
    if (!options.reprotect_read_only)
        return "left writable: LoadOptions::reprotect_read_only is off";
    if (std::string blockers = reprotect_blockers(placement, importers); !blockers.empty())
        return fmt::format("left writable: importer {} does not declare that its imports survive "
                           "PROT_READ", blockers);
    if (Status s = mapping.make_read_only(); !s) {
        std::string note = fmt::format("left writable: {}", s.error().message);
        log_message(options.execute.log, LogLevel::warning, note);
        return note;
    }
    return "re-protected PROT_READ after importing";
}

// The importers whose imports in `placement` were refused only for read-only pages
// (read_only_refusal_marker), quoted; empty when none.
std::string read_only_refusers(const Placement& placement, Span<Importer* const> importers) {
    const Plan& plan = placement.plan();
    std::set<Importer*> refusers;
    for (const TensorPlacement& t : plan.tensors)
        if (t.region < plan.regions.size() &&
            t.reason.find(read_only_refusal_marker) != std::string::npos)
            if (Importer* importer = importers[plan.regions[t.region].target])
                refusers.insert(importer);
    std::string names;
    for (Importer* importer : refusers)
        names += fmt::format("{}'{}'", names.empty() ? "" : ", ", importer->name());
    return names;
}

// Why the files may not be mapped writable, naming the file; empty when every one may.
std::string writable_refusal(const std::vector<std::string>& paths, std::string& refused_path) {
    for (const std::string& path : paths)
        if (Status s = internal::check_writable(path); !s) {
            refused_path = path;
            return s.error().message;
        }
    return {};
}

// Read-only first; where a runtime refused read-only pages and LoadOptions::writable_retry is
// set, the whole execution again on a writable shared mapping when every file passes the rules. Otherwise the read-only placement
// stays, those regions copies, and the decision says why.
// (The pieces of LoadedModel::Impl, which only load_model may name.)
struct Loaded {
    const ModelDesc& model;
    MappingDecision& decision;
    MappedModel& mapping;
    Placement& placement;
};

Status retry_writable(Loaded impl, const Plan& plan, const std::vector<std::string>& paths,
                      Span<Importer* const> importers, const LoadOptions& options) {
    const std::string refusers = read_only_refusers(impl.placement, importers);
    if (refusers.empty()) return {};
    if (!options.writable_retry) {
        impl.decision.reason = fmt::format(
            "read-only: importer {} {}; a writable mapping would dirty the model file (the lock "
            "write-faults every page it locks), so its regions fall back "
            "(LoadOptions::writable_retry maps writable anyway)",
            refusers, read_only_refusal_marker);
        log_message(options.execute.log, LogLevel::warning, impl.decision.reason);
        return {};
    }
    std::string refused_path;
    std::string why = writable_refusal(paths, refused_path);
    Result<MappedModel> writable = make_error(ErrorKind::invalid_argument, why);
    if (why.empty()) writable = map_files(paths, MappingAccess::writable, importers, options.mapping);
    if (!writable) {
        impl.decision.unwritable_path = refused_path;
        impl.decision.reason = fmt::format("read-only: importer {} {}, and the files may not be "
                                           "mapped writable: {}; its regions fall back",
                                           refusers, read_only_refusal_marker,
                                           writable.error().message);
        log_message(options.execute.log, LogLevel::warning, impl.decision.reason);
        return {};
    }
    // Released before the read-only mapping goes: a locked range is never unmapped.
    impl.placement.release_all();
    impl.mapping = std::move(writable).value();
    auto placed = execute_plan(impl.model, plan, impl.mapping.files(), importers, options.execute);
    if (!placed) return std::move(placed).error();
    impl.placement = std::move(placed).value();
    impl.decision.access = MappingAccess::writable;
    impl.decision.reason = fmt::format("writable shared: importer {} {} on the read-only mapping, "
                                       "and all {} file(s) pass the rules (owned by this uid, "
                                       "owner-write bit, same inode)",
                                       refusers, read_only_refusal_marker, paths.size());
    return {};
}

} // namespace

Result<LoadedModel> load_model(ModelDesc model, Span<Importer* const> importers,
                               const LoadOptions& options) {
    auto paths = checked_paths(model, importers);
    if (!paths) return std::move(paths).error();
    // Resolved once, at this edge: the mapping and the plan see the same switch.
    const internal::ImportSwitch import_switch =
        internal::resolve_import_switch(options.plan.import_enabled);
    LoadedModel loaded;
    LoadedModel::Impl& impl = *loaded.impl_;
    impl.decision = decide_load_mapping(model, *paths, importers, options.plan, import_switch);
    auto mapped = map_files(*paths, impl.decision.access, importers, options.mapping);
    if (!mapped) return std::move(mapped).error();
    impl.mapping = std::move(mapped).value();
    if (Status s = check_file_sizes(model, impl.mapping.file_sizes(), *paths); !s)
        return std::move(s).error();
    impl.model = std::move(model);

    auto planned = internal::make_plan_with_switch(impl.model, options.plan, import_switch);
    if (!planned) return std::move(planned).error();
    Plan plan = std::move(planned).value();
    if (impl.mapping.access() == MappingAccess::read_only)
        fall_back_needing_writable(plan, importers, impl.decision);
    if (options.populate) {
        auto populated = populate_imports(impl.model, plan, impl.mapping.files(),
                                          options.populate_options);
        if (!populated) return std::move(populated).error();
        impl.populate = *populated;
    }
    const bool read_only = impl.mapping.access() == MappingAccess::read_only;
    Plan retry_plan = read_only ? plan : Plan{}; // the plan as made, for a writable retry
    auto placed = execute_plan(impl.model, std::move(plan), impl.mapping.files(), importers,
                               options.execute);
    if (!placed) return std::move(placed).error(); // ~LoadedModel unmaps
    impl.placement = std::move(placed).value();
    if (read_only)
        if (Status s = retry_writable({impl.model, impl.decision, impl.mapping, impl.placement},
                                      retry_plan, *paths, importers, options);
            !s)
            return std::move(s).error();
    if (impl.mapping.access() == MappingAccess::writable)
        impl.reprotect_note =
            reprotect_after_import(impl.mapping, impl.placement, importers, options);
    return loaded;
}

} // namespace wm
