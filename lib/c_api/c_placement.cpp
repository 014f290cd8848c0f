// SPDX-License-Identifier: MIT
// C execution of a plan, and the placement it makes: locate tensors, iterate imports.
#include <string>
#include <vector>

#include "c_api.hpp"

namespace wm::c_api {
namespace {

wm_status execute_options_from_c(const wm_execute_options* in, ExecuteOptions& options) {
    if (in == nullptr) return WM_OK;
    wm_status status = WM_OK;
    if (bad_struct_size(in, "wm_execute", "options", status)) return status;
    wm_execute_options defaults{};
    wm_execute_options_init(&defaults);
    const wm_execute_options c = read_struct(*in, defaults);
    options.log = log_from_c(c.log, c.log_user);
    if (c.progress != nullptr)
        options.progress = [progress = c.progress, user = c.progress_user](std::uint64_t done,
                                                                           std::uint64_t total) {
            return progress(user, done, total);
        };
    return WM_OK;
}

wm_status check_counts(const wm_model& model, uint32_t file_count, uint32_t importer_count,
                       const wm_mapped_file* files, wm_importer* const* importers) {
    static constexpr const char* fn = "wm_execute";
    wm_status status = WM_OK;
    if (file_count != 0 && null_arg(files, fn, "files", status)) return status;
    if (importer_count != 0 && null_arg(importers, fn, "importers", status)) return status;
    if (file_count != model.desc.files.size() || importer_count != model.desc.targets.size())
        return fail(WM_ERROR_INVALID_ARGUMENT,
                    std::string(fn) + ": " + std::to_string(file_count) + " files and " +
                        std::to_string(importer_count) + " importers given for a model of " +
                        std::to_string(model.desc.files.size()) + " files and " +
                        std::to_string(model.desc.targets.size()) + " targets");
    return WM_OK;
}

} // namespace
} // namespace wm::c_api

using namespace wm::c_api;

extern "C" {

void wm_execute_options_init(wm_execute_options* options) {
    if (options != nullptr) *options = wm_execute_options{sizeof(wm_execute_options), nullptr,
                                                          nullptr, nullptr, nullptr};
}

wm_status wm_execute(const wm_model* model, const wm_plan* plan, const wm_mapped_file* files,
                     uint32_t file_count, wm_importer* const* importers, uint32_t importer_count,
                     const wm_execute_options* options, wm_placement** out) {
    static constexpr const char* fn = "wm_execute";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(model, fn, "model", status) || null_arg(plan, fn, "plan", status) ||
            null_arg(out, fn, "out", status))
            return status;
        if (status = check_counts(*model, file_count, importer_count, files, importers);
            status != WM_OK)
            return status;
        wm::ExecuteOptions execute_options;
        if (status = execute_options_from_c(options, execute_options); status != WM_OK)
            return status;
        const std::vector<wm::MappedFile> mapped = files_from_c(files, file_count);
        std::vector<wm::Importer*> by_target;
        for (uint32_t t = 0; t < importer_count; ++t)
            by_target.push_back(importers[t] == nullptr ? nullptr : importers[t]->importer.get());
        auto placed = wm::execute_plan(model->desc, *plan->plan, mapped, by_target,
                                       execute_options);
        if (!placed) return fail(fn, placed.error());
        auto handle = std::make_unique<wm_placement>();
        handle->placement = std::move(placed).value();
        handle->plan_view.plan = &handle->placement.plan();
        *out = handle.release();
        return WM_OK;
    });
}

void wm_placement_destroy(wm_placement* placement) { delete placement; }

void wm_placement_release_all(wm_placement* placement) {
    if (placement != nullptr) placement->placement.release_all();
}

const wm_plan* wm_placement_plan(const wm_placement* placement) {
    return placement == nullptr ? nullptr : &placement->plan_view;
}

wm_status wm_placement_locate(const wm_placement* placement, uint32_t tensor,
                              wm_tensor_location* out) {
    static constexpr const char* fn = "wm_placement_locate";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(placement, fn, "placement", status) ||
            bad_index(tensor, placement->placement.plan().tensors.size(), fn, "tensor", status))
            return status;
        const wm::TensorLocation where = placement->placement.locate(tensor);
        void* device = nullptr;
        if (where.imported && where.buffer->device_address != nullptr)
            device = static_cast<std::byte*>(where.buffer->device_address) + where.offset_in_buffer;
        // A non-empty reason views a whole std::string the placement owns (or a literal), so
        // its data() is NUL-terminated.
        return write_out(out,
                         wm_tensor_location{sizeof(wm_tensor_location), where.imported,
                                            where.import_index, where.offset_in_buffer,
                                            where.host_address, device,
                                            where.reason.empty() ? "" : where.reason.data()},
                         fn, "out");
    });
}

uint32_t wm_placement_import_count(const wm_placement* placement) {
    return placement == nullptr ? 0 : static_cast<uint32_t>(placement->placement.import_count());
}

wm_status wm_placement_get_import(const wm_placement* placement, uint32_t index,
                                  wm_placement_import* out) {
    static constexpr const char* fn = "wm_placement_get_import";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(placement, fn, "placement", status) ||
            bad_index(index, placement->placement.import_count(), fn, "import", status))
            return status;
        const wm::PlacedImport placed = placement->placement.import_at(index);
        return write_out(out,
                         wm_placement_import{sizeof(wm_placement_import),
                                             buffer_to_c(*placed.buffer), placed.target,
                                             placed.file, placed.region, placed.run,
                                             placed.extent_offset,
                                             static_cast<uint32_t>(placed.tensors.size()),
                                             placed.tensors.data()},
                         fn, "out");
    });
}

} // extern "C"
