// SPDX-License-Identifier: MIT
#include "weightmap/executor.hpp"

#include <cassert>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "internal/align.hpp"
#include "executor/placement_access.hpp"
#include "planner/plan_edit.hpp"

namespace wm {

// Hidden: Placement is exported, and its nested Impl would be too (its out-of-line members
// were in the first symbol check); nothing outside the library may link against it.
struct __attribute__((visibility("hidden"))) Placement::Impl {
    struct LiveImport {
        Importer* importer = nullptr; // null once released
        ImportedBuffer buffer;
        std::uint32_t region = 0;
        std::uint32_t run = 0;
    };
    Plan plan;
    std::vector<const std::byte*> tensor_address; // per tensor, in the mapping: locate() needs
                                                  // no ModelDesc, which the caller may free
    // Per region, per run: index into imports, or no_index when that run was not imported.
    std::vector<std::vector<std::uint32_t>> run_import;
    std::vector<LiveImport> imports;
    // What backends attached (PlacementAccess; today only backends/cuda/cuda_pin.cpp's pins):
    // released before the imports, last attached first.
    std::vector<std::function<void()>> attachments;
    LogCallback log;

    void release_all() noexcept {
        for (auto it = attachments.rbegin(); it != attachments.rend(); ++it) (*it)();
        attachments.clear();
        // Reverse order of import, as the backends' own teardown expects.
        for (auto it = imports.rbegin(); it != imports.rend(); ++it) {
            if (it->importer == nullptr) continue;
            Status status = it->importer->release(it->buffer);
            if (!status)
                log_message(log, LogLevel::warning,
                            fmt::format("{}: release of [{}, +{}) failed: {}",
                                        it->importer->name(), it->buffer.host_address,
                                        it->buffer.size, status.error().message));
            it->importer = nullptr;
        }
        imports.clear();
        for (auto& runs : run_import)
            for (auto& index : runs) index = no_index;
    }

    void release_region(std::uint32_t region) noexcept {
        for (std::uint32_t& index : run_import[region]) {
            if (index == no_index) continue;
            LiveImport& live = imports[index];
            if (live.importer != nullptr) {
                Status status = live.importer->release(live.buffer);
                if (!status)
                    log_message(log, LogLevel::warning,
                                fmt::format("{}: release failed: {}", live.importer->name(),
                                            status.error().message));
                live.importer = nullptr;
            }
            index = no_index;
        }
    }

    void fall_back(std::uint32_t r, const std::string& reason) {
        release_region(r);
        internal::fall_back_region(plan, r, reason);
        run_import[r].clear();
    }

    // Run k of region r, which was not imported, falls back alone. The region's later runs and
    // their live imports move down one index, so run_import and LiveImport::run keep naming
    // the runs of plan.
    void fall_back_run(std::uint32_t r, std::uint32_t k, const std::string& reason) {
        assert(run_import[r][k] == no_index);
        internal::fall_back_run(plan, r, k, reason);
        run_import[r].erase(run_import[r].begin() + k);
        for (LiveImport& live : imports)
            if (live.region == r && live.run > k) --live.run;
    }

    // Drops the entries of imports released by a fallback, so imports lists exactly the live
    // ones in order of import and run_import indexes into it.
    void compact() {
        std::vector<LiveImport> live;
        live.reserve(imports.size());
        for (const LiveImport& i : imports)
            if (i.importer != nullptr) {
                run_import[i.region][i.run] = static_cast<std::uint32_t>(live.size());
                live.push_back(i);
            }
        imports = std::move(live);
    }

    struct Progress {
        std::uint64_t done = 0;  // extent bytes imported so far
        std::uint64_t total = 0; // extent bytes planned
    };
    std::string import_run(Importer& importer, std::uint32_t r, std::uint32_t k,
                           std::byte* address, const std::string& file_name);
    bool import_region(const ModelDesc& model, std::uint32_t r, const MappedFile& mapped,
                       Importer* importer, const ExecuteOptions& options, Progress& progress);
};

Placement::Placement() : impl_(std::make_unique<Impl>()) {}
Placement::Placement(Placement&&) noexcept = default;
Placement& Placement::operator=(Placement&& other) noexcept {
    if (this != &other) {
        release_all();
        impl_ = std::move(other.impl_);
    }
    return *this;
}
Placement::~Placement() { release_all(); }

const Plan& Placement::plan() const noexcept { return impl_->plan; }

std::size_t Placement::import_count() const noexcept { return impl_->imports.size(); }

PlacedImport Placement::import_at(std::size_t index) const noexcept {
    if (index >= impl_->imports.size()) {
        PlacedImport none;
        none.target = none.file = none.region = none.run = no_index;
        return none;
    }
    const Impl::LiveImport& live = impl_->imports[index];
    const PlanRegion& region = impl_->plan.regions[live.region];
    const PlanRun& run = region.runs[live.run];
    return {&live.buffer, region.target, region.file, live.region, live.run, run.extent_offset,
            Span<const std::uint32_t>(run.tensors)};
}

void Placement::release_all() noexcept {
    if (impl_) impl_->release_all();
}

void internal::PlacementAccess::attach(Placement& placement, std::function<void()> release) {
    placement.impl_->attachments.push_back(std::move(release));
}

TensorLocation Placement::locate(std::uint32_t index) const {
    const Impl& impl = *impl_;
    if (index >= impl.plan.tensors.size()) {
        TensorLocation nowhere;
        nowhere.reason = "tensor index out of range";
        return nowhere;
    }
    const TensorPlacement& place = impl.plan.tensors[index];
    TensorLocation location;
    location.host_address = impl.tensor_address[index];
    if (place.run == no_index || place.region >= impl.run_import.size() ||
        place.run >= impl.run_import[place.region].size() ||
        impl.run_import[place.region][place.run] == no_index) {
        location.reason = place.reason.empty() ? std::string_view("not imported")
                                               : std::string_view(place.reason);
        return location;
    }
    location.import_index = impl.run_import[place.region][place.run];
    const auto& live = impl.imports[location.import_index];
    location.imported = true;
    location.buffer = &live.buffer;
    location.offset_in_buffer = place.offset_in_run;
    return location;
}

namespace {

Error plan_mismatch(std::string what) {
    return make_error(ErrorKind::invalid_argument,
                      "execute_plan: the plan does not fit the model: " + what);
}

// Every region names a target and file of the model, and every tensor its runs serve is one of
// the region's and placed in that run (marked in `listed`).
Status check_regions(const ModelDesc& model, const Plan& plan, std::vector<bool>& listed) {
    for (std::size_t r = 0; r < plan.regions.size(); ++r) {
        const PlanRegion& region = plan.regions[r];
        if (region.target >= model.targets.size() || region.file >= model.files.size())
            return plan_mismatch(fmt::format("region {} names target {} and file {} of {} and {}",
                                             r, region.target, region.file, model.targets.size(),
                                             model.files.size()));
        for (std::size_t k = 0; k < region.runs.size(); ++k)
            for (std::uint32_t t : region.runs[k].tensors) {
                if (t >= model.tensors.size() || model.tensors[t].target != region.target ||
                    model.tensors[t].file != region.file)
                    return plan_mismatch(fmt::format("run {} of region {} serves tensor {}, "
                                                     "which is not one of the region's", k, r, t));
                if (t < plan.tensors.size() &&
                    (plan.tensors[t].region != r || plan.tensors[t].run != k))
                    return plan_mismatch(fmt::format("run {} of region {} serves tensor {} ('{}'), "
                                                     "which the plan places in run {} of region "
                                                     "{}", k, r, t, model.tensors[t].name,
                                                     plan.tensors[t].run, plan.tensors[t].region));
                listed[t] = true;
            }
    }
    return {};
}

// Tensor t's region and run are indices of the plan (or no_index).
Status check_placement_indices(const Plan& plan, const ModelDesc& model, std::size_t t) {
    const TensorPlacement& place = plan.tensors[t];
    if (place.region != no_index && place.region >= plan.regions.size())
        return plan_mismatch(fmt::format("tensor {} ('{}') is in region {} of {}", t,
                                         model.tensors[t].name, place.region,
                                         plan.regions.size()));
    if (place.run != no_index &&
        (place.region == no_index || place.run >= plan.regions[place.region].runs.size()))
        return plan_mismatch(fmt::format("tensor {} ('{}') is in run {} of region {}", t,
                                         model.tensors[t].name, place.run, place.region));
    return {};
}

// Tensor t's placement: a run that lists it, at the offset in its extent that is its offset in
// the file, wholly inside the extent. A placement an engine edited would otherwise make
// locate() return a buffer offset that is not the tensor (or lies past the import).
Status check_placement_bytes(const ModelDesc& model, const Plan& plan, std::size_t t,
                             const std::vector<bool>& listed) {
    const TensorPlacement& place = plan.tensors[t];
    if (place.run == no_index) return {};
    const TensorDesc& tensor = model.tensors[t];
    const auto bad = [&](std::string what) {
        return plan_mismatch(fmt::format("tensor {} ('{}') {}", t, tensor.name, what));
    };
    if (!listed[t])
        return bad(fmt::format("is placed in run {} of region {}, which does not serve it",
                               place.run, place.region));
    const PlanRun& run = plan.regions[place.region].runs[place.run];
    if (tensor.offset < run.extent_offset || tensor.offset - run.extent_offset != place.offset_in_run)
        return bad(fmt::format("is at file offset {:#x}, but its offset_in_run {:#x} in the "
                               "extent at {:#x} says {:#x}", tensor.offset, place.offset_in_run,
                               run.extent_offset, run.extent_offset + place.offset_in_run));
    if (place.offset_in_run > run.extent_size ||
        tensor.size > run.extent_size - place.offset_in_run)
        return bad(fmt::format("[{:#x}, +{:#x}) does not lie inside its run's extent [{:#x}, "
                               "+{:#x})", tensor.offset, tensor.size, run.extent_offset,
                               run.extent_size));
    return {};
}

// A plan is plain data an engine may have built or edited: every index and offset it holds is
// checked against the model before the executor uses one. (check_call has checked that plan and
// model have as many tensors.)
Status check_plan_against_model(const ModelDesc& model, const Plan& plan) {
    for (std::size_t t = 0; t < plan.tensors.size(); ++t)
        if (Status s = check_placement_indices(plan, model, t); !s) return s;
    std::vector<bool> listed(model.tensors.size(), false);
    if (Status s = check_regions(model, plan, listed); !s) return s;
    for (std::size_t t = 0; t < plan.tensors.size(); ++t)
        if (Status s = check_placement_bytes(model, plan, t, listed); !s) return s;
    return {};
}

// Tensor t lies inside the caller's mapping of its file. Every address the placement hands out
// (locate's host_address, a fallback's included) is base + offset: a mapping shorter than the
// file gave addresses past its end with WM_OK (issue 44 item 2).
Status check_tensor_mapped(const ModelDesc& model, Span<const MappedFile> files, std::size_t t) {
    const TensorDesc& tensor = model.tensors[t];
    if (tensor.file >= files.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("execute_plan: tensor {} ('{}') names file {} of {}", t,
                                      tensor.name, tensor.file, files.size()));
    const MappedFile& mapped = files[tensor.file];
    if (tensor.offset > mapped.length || tensor.size > mapped.length - tensor.offset)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("execute_plan: tensor {} ('{}') [{:#x}, +{:#x}) passes the "
                                      "mapped length {:#x} of file {} ('{}', {} bytes): map the "
                                      "whole file", t, tensor.name, tensor.offset, tensor.size,
                                      mapped.length, tensor.file, model.files[tensor.file].path,
                                      model.files[tensor.file].size));
    return {};
}

// Checks the call's shape before anything is imported.
Status check_call(const ModelDesc& model, const Plan& plan, Span<const MappedFile> files,
                  Span<Importer* const> importers) {
    if (files.size() != model.files.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("execute_plan: {} mapped files given for a model of {} files",
                                      files.size(), model.files.size()));
    if (importers.size() != model.targets.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("execute_plan: {} importers given for {} targets",
                                      importers.size(), model.targets.size()));
    if (plan.tensors.size() != model.tensors.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("execute_plan: plan has {} tensors, model has {} (plan made "
                                      "from another model?)",
                                      plan.tensors.size(), model.tensors.size()));
    for (std::size_t f = 0; f < files.size(); ++f) {
        if (files[f].base == nullptr && model.files[f].size != 0)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("execute_plan: file {} ('{}') has no mapping", f,
                                          model.files[f].path));
    }
    if (Status fits = check_plan_against_model(model, plan); !fits) return std::move(fits).error();
    for (std::size_t t = 0; t < model.tensors.size(); ++t)
        if (Status s = check_tensor_mapped(model, files, t); !s) return s;
    return {};
}

// Why no run of a region may be imported through `importer` (empty: they may). The policy is
// applied again to the caps the importer reports now: the plan may have been made from what-if
// caps (wm-plan --device, wm_model_add_target_caps), and a discrete device must not import
// under unified_only whatever the plan assumed.
std::string region_refusal(const TargetDesc& target, Importer* importer, const Plan& plan) {
    if (importer == nullptr) return fmt::format("no importer for target '{}'", target.name);
    if (Availability a = importer->available(); !a.available)
        return fmt::format("{} importer not available: {}", importer->name(), a.reason);
    const ImportPolicy policy = target.import_policy.value_or(plan.import_policy);
    std::string why =
        import_policy_refusal(importer->caps(), policy, importer->notes().device_memory);
    return why.empty() ? why : fmt::format("{} importer: {}", importer->name(), why);
}

// Why `run` cannot be handed to an importer of `caps` (empty: it can): the preconditions
// Importer::import() states, checked here so no driver sees a bad range.
std::string run_refusal(const PlanRun& run, const MappedFile& mapped, const ImporterCaps& caps,
                        std::string_view importer, const std::string& file_name) {
    const std::uint64_t align = std::max<std::uint64_t>(caps.alignment, 1);
    const std::byte* address = mapped.base + run.extent_offset;
    if (run.extent_offset > mapped.length || run.extent_size > mapped.length - run.extent_offset)
        return fmt::format("extent [{:#x}, +{:#x}) runs past the mapped length {:#x} of '{}'",
                           run.extent_offset, run.extent_size, mapped.length, file_name);
    if (reinterpret_cast<std::uintptr_t>(address) % align != 0 || run.extent_size % align != 0)
        return fmt::format("extent {} +{:#x} of '{}' is not aligned to the {} importer's {} "
                           "bytes", static_cast<const void*>(address), run.extent_size,
                           file_name, importer, align);
    if (caps.max_import_size != 0 && run.extent_size > caps.max_import_size)
        return fmt::format("extent of {} bytes is over the {} importer's maximum import size {}",
                           run.extent_size, importer, caps.max_import_size);
    return {};
}

} // namespace

// Imports run k of region r at `address`; returns the refusal, empty when it is live.
std::string Placement::Impl::import_run(Importer& importer, std::uint32_t r, std::uint32_t k,
                                        std::byte* address, const std::string& file_name) {
    const PlanRun& run = plan.regions[r].runs[k];
    Result<ImportedBuffer> imported = importer.import(address, run.extent_size);
    if (!imported)
        return fmt::format("{} import of '{}' [{:#x}, +{:#x}) failed: {}", importer.name(),
                           file_name, run.extent_offset, run.extent_size,
                           imported.error().message);
    // Importer::import has checked the result is the range asked for: base + offset == mapping
    // + file offset holds for every tensor.
    const ImportedBuffer& buffer = imported.value();
    run_import[r][k] = static_cast<std::uint32_t>(imports.size());
    imports.push_back({&importer, buffer, r, k});
    return {};
}

// Imports every run of region r. A refused run falls back alone, with the refusal as its
// tensors' reason; the region is a fallback only when none of its runs was imported. A refusal
// of the whole target (no importer, not available, the import policy) is the region's.
// False when the progress callback aborted (the caller then releases everything).
bool Placement::Impl::import_region(const ModelDesc& model, std::uint32_t r,
                                    const MappedFile& mapped, Importer* importer,
                                    const ExecuteOptions& options, Progress& progress) {
    const PlanRegion& region = plan.regions[r];
    const TargetDesc& target = model.targets[region.target];
    const std::string& file_name = model.files[region.file].path;
    run_import[r].assign(region.runs.size(), no_index);
    if (std::string why = region_refusal(target, importer, plan); !why.empty()) {
        fall_back(r, why);
        if (importer != nullptr) log_message(options.log, LogLevel::warning, why);
        return true;
    }
    const ImporterCaps caps = importer->caps();
    std::vector<std::pair<std::uint32_t, std::string>> refused; // run, refusal; in run order
    for (std::uint32_t k = 0; k < region.runs.size(); ++k) {
        const PlanRun& run = plan.regions[r].runs[k];
        std::string refusal = run_refusal(run, mapped, caps, importer->name(), file_name);
        if (refusal.empty())
            refusal = import_run(*importer, r, k, mapped.base + run.extent_offset, file_name);
        if (!refusal.empty()) {
            log_message(options.log, LogLevel::warning,
                        fmt::format("target '{}', file '{}': falling back to a device copy: {}",
                                    target.name, file_name, refusal));
            refused.emplace_back(k, std::move(refusal));
            continue;
        }
        progress.done += run.extent_size;
        if (options.progress && !options.progress(progress.done, progress.total)) return false;
    }
    if (refused.empty()) return true;
    const std::size_t planned = region.runs.size();
    const std::string first_refusal = refused.front().second;
    // Last first, so the indices still to drop are unchanged by each drop.
    for (auto it = refused.rbegin(); it != refused.rend(); ++it)
        fall_back_run(r, it->first, it->second);
    if (plan.regions[r].decision == Decision::import)
        plan.regions[r].reason += fmt::format(
            "; {} of its {} imports refused when executed (their tensors fall back, each with "
            "the importer's reason; the first: {})",
            refused.size(), planned, first_refusal);
    return true;
}

Result<Placement> execute_plan(const ModelDesc& model, Plan plan,
                               Span<const MappedFile> files,
                               Span<Importer* const> importers,
                               const ExecuteOptions& options) {
    if (Status s = check_call(model, plan, files, importers); !s) return std::move(s).error();
    Placement placement;
    Placement::Impl& impl = *placement.impl_;
    impl.plan = std::move(plan);
    impl.tensor_address.reserve(model.tensors.size());
    for (const TensorDesc& tensor : model.tensors)
        impl.tensor_address.push_back(files[tensor.file].base + tensor.offset);
    impl.log = options.log;
    impl.run_import.resize(impl.plan.regions.size());

    Placement::Impl::Progress progress;
    std::size_t runs = 0;
    for (const PlanRegion& region : impl.plan.regions)
        if (region.decision == Decision::import) {
            runs += region.runs.size();
            for (const PlanRun& run : region.runs) progress.total += run.extent_size;
        }
    // Reserved before the first import: import_run's push_back then cannot throw after an
    // importer has pinned a range (the import would be recorded nowhere, and never released).
    impl.imports.reserve(runs);
    for (std::uint32_t r = 0; r < impl.plan.regions.size(); ++r) {
        const PlanRegion& region = impl.plan.regions[r];
        if (region.decision != Decision::import) continue;
        if (!impl.import_region(model, r, files[region.file], importers[region.target], options,
                                progress)) {
            impl.release_all();
            return make_error(ErrorKind::aborted,
                              fmt::format("execute_plan: aborted by the caller after {} of {} "
                                          "bytes; every import released", progress.done,
                                          progress.total));
        }
    }
    impl.compact();
    impl.plan.totals = compute_totals(model, impl.plan);
    return placement;
}

} // namespace wm
