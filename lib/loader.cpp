// SPDX-License-Identifier: MIT
#include "weightmap/loader.hpp"

#include <set>

#include <fmt/format.h>

#include "internal/import_switch.hpp"
#include "internal/plan_edit.hpp"

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

} // namespace

Result<LoadedModel> load_model(ModelDesc model, Span<Importer* const> importers,
                               const LoadOptions& options) {
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

    LoadedModel loaded;
    LoadedModel::Impl& impl = *loaded.impl_;
    // The control arm maps exactly as an engine without imports would: read-only.
    std::string disabled;
    if (internal::import_switch_enabled(options.plan.import_enabled, &disabled)) {
        impl.decision = decide_mapping_for_policies(model, paths, importers, options.plan);
    } else {
        impl.decision.access = MappingAccess::read_only;
        impl.decision.reason = "read-only: import " + disabled;
    }

    MappingOptions mapping_options = options.mapping;
    if (mapping_options.base_alignment == 0) {
        for (Importer* importer : importers)
            if (importer != nullptr)
                mapping_options.base_alignment =
                    std::max(mapping_options.base_alignment, importer->caps().alignment);
        if (mapping_options.base_alignment <= host_page_size()) mapping_options.base_alignment = 0;
    }
    auto mapped = MappedModel::open(paths, impl.decision.access, mapping_options);
    if (!mapped) return std::move(mapped).error();
    impl.mapping = std::move(mapped).value();

    // The real sizes are the truth; a tensor past the end would read beyond the mapping.
    auto sizes = impl.mapping.file_sizes();
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
    impl.model = std::move(model);

    auto planned = make_plan(impl.model, options.plan);
    if (!planned) return std::move(planned).error();
    Plan plan = std::move(planned).value();

    if (impl.mapping.access() == MappingAccess::read_only) {
        for (std::uint32_t r = 0; r < plan.regions.size(); ++r) {
            const PlanRegion& region = plan.regions[r];
            Importer* importer = importers[region.target];
            if (region.decision != Decision::import || importer == nullptr) continue;
            if (!importer->caps().needs_writable_mapping) continue;
            internal::fall_back_region(
                plan, r,
                impl.decision.unwritable_path.empty()
                    ? fmt::format("{} importer needs a writable mapping: {}", importer->name(),
                                  impl.decision.reason)
                    : fmt::format("weight file not writable: {}", impl.decision.unwritable_path));
        }
    }

    if (options.populate) {
        auto populated = populate_imports(impl.model, plan, impl.mapping.files(),
                                          options.populate_options);
        if (!populated) return std::move(populated).error();
        impl.populate = *populated;
    }

    auto placed = execute_plan(impl.model, std::move(plan), impl.mapping.files(), importers,
                               options.execute);
    if (!placed) return std::move(placed).error(); // ~LoadedModel unmaps
    impl.placement = std::move(placed).value();

    if (impl.mapping.access() == MappingAccess::writable) {
        // The importers that hold an import now: a region may keep some runs and lose others.
        std::set<Importer*> holders;
        for (std::size_t i = 0; i < impl.placement.import_count(); ++i)
            if (Importer* importer = importers[impl.placement.import_at(i).target])
                holders.insert(importer);
        std::string blockers;
        for (Importer* importer : holders)
            if (!importer->caps().survives_read_only_reprotect)
                blockers += fmt::format("{}'{}'", blockers.empty() ? "" : ", ", importer->name());
        if (!options.reprotect_read_only) {
            impl.reprotect_note = "left writable: LoadOptions::reprotect_read_only is off";
        } else if (!blockers.empty()) {
            impl.reprotect_note = fmt::format("left writable: importer {} does not declare that "
                                              "its imports survive PROT_READ", blockers);
        } else if (Status s = impl.mapping.make_read_only(); !s) {
            impl.reprotect_note = fmt::format("left writable: {}", s.error().message);
            log_message(options.execute.log, LogLevel::warning, impl.reprotect_note);
        } else {
            impl.reprotect_note = "re-protected PROT_READ after importing";
        }
    }
    return loaded;
}

} // namespace wm
