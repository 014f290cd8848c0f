// SPDX-License-Identifier: MIT
// C model descriptions and plans.
#include <string>

#include "c_api.hpp"

namespace wm::c_api {
namespace {

void put_index(uint32_t* index, std::size_t value) {
    if (index != nullptr) *index = static_cast<uint32_t>(value);
}

// One more entry of a kind that is counted in uint32_t indices (UINT32_MAX is WM_NO_INDEX).
bool full(std::size_t count, const char* function, wm_status& status) {
    if (count < WM_NO_INDEX - 1) return false;
    status = fail(WM_ERROR_LIMIT, std::string(function) + ": the model is full");
    return true;
}

wm_status plan_options_from_c(const wm_plan_options* in, PlanOptions& options) {
    static constexpr const char* fn = "wm_plan_create";
    if (in == nullptr) return WM_OK;
    wm_status status = WM_OK;
    if (bad_struct_size(in, fn, "options", status)) return status;
    wm_plan_options defaults{};
    wm_plan_options_init(&defaults);
    const wm_plan_options c = read_struct(*in, defaults);
    const long long mode = raw_enum(c.mode);
    if (mode < WM_PLAN_SPAN || mode > WM_PLAN_RUNS)
        return fail(WM_ERROR_INVALID_ARGUMENT,
                    std::string(fn) + ": options->mode " + std::to_string(mode) +
                        " is not a wm_plan_mode");
    if (c.import_enabled < -1 || c.import_enabled > 1)
        return fail(WM_ERROR_INVALID_ARGUMENT,
                    std::string(fn) + ": options->import_enabled is " +
                        std::to_string(c.import_enabled) + " (-1: from the environment, 0, 1)");
    const long long policy = raw_enum(c.import_policy);
    if (policy < WM_IMPORT_POLICY_UNIFIED_ONLY || policy > WM_IMPORT_POLICY_NEVER)
        return fail(WM_ERROR_INVALID_ARGUMENT,
                    std::string(fn) + ": options->import_policy " + std::to_string(policy) +
                        " is not a wm_import_policy (0 unified_only, 1 always, 2 never)");
    options.import_policy = static_cast<ImportPolicy>(policy);
    options.mode = static_cast<PlanMode>(c.mode);
    options.page_size = c.page_size;
    options.merge_gap = c.merge_gap;
    options.max_imports_per_region = c.max_imports_per_region;
    // -1 stays unset: make_plan, the edge wm_plan_create calls, reads WEIGHTMAP_IMPORT once.
    if (c.import_enabled >= 0) options.import_enabled = c.import_enabled == 1;
    return WM_OK;
}

const char* or_empty(const char* text) { return text == nullptr ? "" : text; }

} // namespace
} // namespace wm::c_api

using namespace wm::c_api;

extern "C" {

wm_status wm_model_create(wm_model** out) {
    static constexpr const char* fn = "wm_model_create";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(out, fn, "out", status)) return status;
        *out = new wm_model();
        return WM_OK;
    });
}

void wm_model_destroy(wm_model* model) { delete model; }

wm_status wm_model_add_file(wm_model* model, const char* path, uint64_t size, uint32_t* index) {
    static constexpr const char* fn = "wm_model_add_file";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(model, fn, "model", status) || full(model->desc.files.size(), fn, status))
            return status;
        model->desc.files.push_back({or_empty(path), size});
        put_index(index, model->desc.files.size() - 1);
        return WM_OK;
    });
}

wm_status wm_model_add_target(wm_model* model, const char* name, const wm_importer* importer,
                              uint32_t* index) {
    static constexpr const char* fn = "wm_model_add_target";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(model, fn, "model", status) || null_arg(importer, fn, "importer", status) ||
            full(model->desc.targets.size(), fn, status))
            return status;
        model->desc.targets.push_back(wm::target_for(or_empty(name), *importer->importer));
        put_index(index, model->desc.targets.size() - 1);
        return WM_OK;
    });
}

wm_status wm_model_add_target_caps(wm_model* model, const char* name, const char* importer_key,
                                   const wm_importer_caps* caps, uint32_t* index) {
    static constexpr const char* fn = "wm_model_add_target_caps";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(model, fn, "model", status) || null_arg(caps, fn, "caps", status) ||
            bad_struct_size(caps, fn, "caps", status) ||
            full(model->desc.targets.size(), fn, status))
            return status;
        wm::TargetDesc target;
        target.name = or_empty(name);
        target.importer_key = or_empty(importer_key);
        if (target.importer_key.empty()) target.importer_key = target.name;
        const wm_importer_caps c = read_struct(*caps, caps_to_c(wm::ImporterCaps{}));
        const long long memory = raw_enum(c.device_memory);
        if (memory < WM_DEVICE_MEMORY_UNKNOWN || memory > WM_DEVICE_MEMORY_COHERENT)
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(fn) + ": caps->device_memory " + std::to_string(memory) +
                            " is not a wm_device_memory (0 unknown, 1 unified, 2 discrete, "
                            "3 coherent)");
        target.caps = caps_from_c(c);
        target.file_pages_note = or_empty(c.file_pages_note);
        target.device_memory_note = or_empty(c.device_memory_note);
        model->desc.targets.push_back(std::move(target));
        put_index(index, model->desc.targets.size() - 1);
        return WM_OK;
    });
}

wm_status wm_model_set_target_import_policy(wm_model* model, uint32_t target,
                                            wm_import_policy policy) {
    static constexpr const char* fn = "wm_model_set_target_import_policy";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(model, fn, "model", status)) return status;
        if (target >= model->desc.targets.size())
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(fn) + ": target " + std::to_string(target) + " of " +
                            std::to_string(model->desc.targets.size()));
        const long long raw = raw_enum(policy);
        if (raw < WM_IMPORT_POLICY_FROM_OPTIONS || raw > WM_IMPORT_POLICY_NEVER)
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(fn) + ": policy " + std::to_string(raw) +
                            " is not a wm_import_policy (-1 from_options, 0 unified_only, "
                            "1 always, 2 never)");
        auto& slot = model->desc.targets[target].import_policy;
        if (raw == WM_IMPORT_POLICY_FROM_OPTIONS) slot.reset();
        else slot = static_cast<wm::ImportPolicy>(raw);
        return WM_OK;
    });
}

wm_status wm_model_add_tensor(wm_model* model, const char* name, uint32_t file, uint64_t offset,
                              uint64_t size, uint32_t target, uint32_t* index) {
    static constexpr const char* fn = "wm_model_add_tensor";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(model, fn, "model", status) || full(model->desc.tensors.size(), fn, status))
            return status;
        const std::string tensor_name = or_empty(name);
        const std::string where = std::string(fn) + ": tensor '" + tensor_name + "'";
        if (file >= model->desc.files.size())
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        index_message(where, "file", file, model->desc.files.size()));
        if (target >= model->desc.targets.size())
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        index_message(where, "target", target, model->desc.targets.size()));
        model->desc.tensors.push_back({tensor_name, file, offset, size, target});
        put_index(index, model->desc.tensors.size() - 1);
        return WM_OK;
    });
}

uint32_t wm_model_file_count(const wm_model* model) {
    return model == nullptr ? 0 : static_cast<uint32_t>(model->desc.files.size());
}
uint32_t wm_model_target_count(const wm_model* model) {
    return model == nullptr ? 0 : static_cast<uint32_t>(model->desc.targets.size());
}
uint32_t wm_model_tensor_count(const wm_model* model) {
    return model == nullptr ? 0 : static_cast<uint32_t>(model->desc.tensors.size());
}

void wm_plan_options_init(wm_plan_options* options) {
    if (options == nullptr) return;
    const wm::PlanOptions defaults;
    *options = wm_plan_options{sizeof(wm_plan_options),
                               static_cast<wm_plan_mode>(defaults.mode),
                               defaults.page_size,
                               defaults.merge_gap,
                               defaults.max_imports_per_region,
                               -1,
                               static_cast<wm_import_policy>(defaults.import_policy)};
}

wm_status wm_plan_create(const wm_model* model, const wm_plan_options* options, wm_plan** out) {
    static constexpr const char* fn = "wm_plan_create";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(model, fn, "model", status) || null_arg(out, fn, "out", status)) return status;
        wm::PlanOptions plan_options;
        if (status = plan_options_from_c(options, plan_options); status != WM_OK) return status;
        auto plan = wm::make_plan(model->desc, plan_options);
        if (!plan) return fail(fn, plan.error());
        auto handle = std::make_unique<wm_plan>();
        handle->storage = std::move(plan).value();
        *out = handle.release();
        return WM_OK;
    });
}

void wm_plan_destroy(wm_plan* plan) { delete plan; }

wm_status wm_plan_get_totals(const wm_plan* plan, wm_plan_totals* out) {
    static constexpr const char* fn = "wm_plan_get_totals";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(plan, fn, "plan", status)) return status;
        const wm::PlanTotals& t = plan->plan->totals;
        return write_out(out,
                         wm_plan_totals{sizeof(wm_plan_totals), t.device_bytes, t.imported_bytes,
                                        t.pinned_bytes, t.fallback_bytes, t.imports},
                         fn, "out");
    });
}

uint32_t wm_plan_region_count(const wm_plan* plan) {
    return plan == nullptr ? 0 : static_cast<uint32_t>(plan->plan->regions.size());
}

wm_status wm_plan_get_region(const wm_plan* plan, uint32_t region, wm_plan_region* out) {
    static constexpr const char* fn = "wm_plan_get_region";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(plan, fn, "plan", status) ||
            bad_index(region, plan->plan->regions.size(), fn, "region", status))
            return status;
        const wm::PlanRegion& r = plan->plan->regions[region];
        return write_out(out,
                         wm_plan_region{sizeof(wm_plan_region), r.target, r.file, r.first, r.last,
                                        r.ctx_bytes, r.gate,
                                        r.decision == wm::Decision::import ? WM_DECISION_IMPORT
                                                                           : WM_DECISION_FALLBACK,
                                        r.reason.c_str(), static_cast<uint32_t>(r.tensors.size()),
                                        r.tensors.data(), static_cast<uint32_t>(r.runs.size())},
                         fn, "out");
    });
}

wm_status wm_plan_get_run(const wm_plan* plan, uint32_t region, uint32_t run, wm_plan_run* out) {
    static constexpr const char* fn = "wm_plan_get_run";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(plan, fn, "plan", status) ||
            bad_index(region, plan->plan->regions.size(), fn, "region", status) ||
            bad_index(run, plan->plan->regions[region].runs.size(), fn, "run", status))
            return status;
        const wm::PlanRun& r = plan->plan->regions[region].runs[run];
        return write_out(out,
                         wm_plan_run{sizeof(wm_plan_run), r.first, r.last, r.extent_offset,
                                     r.extent_size, r.ctx_bytes,
                                     static_cast<uint32_t>(r.tensors.size()), r.tensors.data()},
                         fn, "out");
    });
}

wm_status wm_plan_get_tensor(const wm_plan* plan, uint32_t tensor, wm_tensor_placement* out) {
    static constexpr const char* fn = "wm_plan_get_tensor";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(plan, fn, "plan", status) ||
            bad_index(tensor, plan->plan->tensors.size(), fn, "tensor", status))
            return status;
        const wm::TensorPlacement& t = plan->plan->tensors[tensor];
        return write_out(out,
                         wm_tensor_placement{sizeof(wm_tensor_placement), t.region, t.run,
                                             t.offset_in_run, t.reason.c_str()},
                         fn, "out");
    });
}

} // extern "C"
