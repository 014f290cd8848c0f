// SPDX-License-Identifier: MIT
// The CUDA importer and its DMA pins from C: backends/cuda.h over backends/cuda.hpp.
#include <cstdio>

#include "c_api/c_api.hpp"
#include "weightmap/backends/cuda.h"
#include "weightmap/backends/cuda.hpp"

using namespace wm::c_api;

namespace {

wm::CudaImporterParams params_from_c(const wm_cuda_importer_params& in) {
    wm::CudaImporterParams params;
    if (in.library_path != nullptr) params.library_path = in.library_path;
    params.context = in.context;
    params.device_ordinal = in.device_ordinal;
    params.allow_discrete = in.allow_discrete;
    params.device_memory = device_memory_from_c(in.device_memory);
    return params;
}

// Written no further than the caller's struct_size: an older, shorter struct ends earlier.
void report_to_c(const wm::CudaPinReport& report, wm_cuda_pin_report& out) {
    wm_cuda_pin_report full{};
    full.ranges = report.ranges;
    full.bytes = report.bytes;
    full.tensors = report.tensors;
    full.refused_ranges = report.refused_ranges;
    std::snprintf(full.first_refusal, sizeof full.first_refusal, "%s",
                  report.first_refusal.c_str());
    write_struct(&out, full);
}

} // namespace

extern "C" {

void wm_cuda_importer_params_init(wm_cuda_importer_params* params) {
    if (params == nullptr) return;
    *params = wm_cuda_importer_params{};
    params->struct_size = sizeof *params;
    params->device_memory = WM_DEVICE_MEMORY_UNKNOWN;
}

wm_status wm_importer_create_cuda(const wm_cuda_importer_params* params, wm_importer** out) {
    static constexpr const char* fn = "wm_importer_create_cuda";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(out, fn, "out", status)) return status;
        if (params != nullptr && bad_struct_size(params, fn, "params", status)) return status;
        wm_cuda_importer_params defaults;
        wm_cuda_importer_params_init(&defaults);
        // No further than the caller's struct_size: the fields past it keep their defaults.
        auto made = wm::make_cuda_importer(
            params_from_c(params != nullptr ? read_struct(*params, defaults) : defaults));
        if (!made) return fail(fn, made.error());
        return hand_out(std::move(made).value(), out);
    });
}

wm_status wm_cuda_pin_fallbacks(wm_importer* cuda, wm_placement* placement, const wm_model* model,
                                const wm_mapped_file* files, uint32_t file_count, uint32_t target,
                                wm_cuda_pin_report* out) {
    static constexpr const char* fn = "wm_cuda_pin_fallbacks";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(cuda, fn, "cuda", status) || null_arg(placement, fn, "placement", status) ||
            null_arg(model, fn, "model", status) ||
            (file_count != 0 && null_arg(files, fn, "files", status)))
            return status;
        if (out != nullptr && bad_struct_size(out, fn, "out", status)) return status;
        const std::vector<wm::MappedFile> mapped = files_from_c(files, file_count);
        auto report = wm::cuda_pin_fallbacks(*cuda->importer, placement->placement, model->desc,
                                             mapped, target);
        if (!report) return fail(fn, report.error());
        if (out != nullptr) report_to_c(report.value(), *out);
        return WM_OK;
    });
}

} // extern "C"
