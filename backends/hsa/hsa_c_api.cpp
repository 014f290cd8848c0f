// SPDX-License-Identifier: MIT
// The HSA importer from C: backends/hsa.h over backends/hsa.hpp (or its stubs).
#include <string>

#include "c_api/c_api.hpp"
#include "weightmap/backends/hsa.h"
#include "weightmap/backends/hsa.hpp"

using namespace wm::c_api;

namespace {

wm::HsaImporterParams params_from_c(const wm_hsa_importer_params& in) {
    wm::HsaImporterParams params;
    if (in.library_path != nullptr) params.library_path = in.library_path;
    if (in.agents != nullptr) params.agents.assign(in.agents, in.agents + in.agent_count);
    params.lock_budget_bytes = in.lock_budget_bytes;
    params.device_memory = device_memory_from_c(in.device_memory);
    return params;
}

} // namespace

extern "C" {

void wm_hsa_importer_params_init(wm_hsa_importer_params* params) {
    if (params == nullptr) return;
    *params = wm_hsa_importer_params{};
    params->struct_size = sizeof *params;
    params->device_memory = WM_DEVICE_MEMORY_UNKNOWN;
}

wm_status wm_importer_create_hsa(const wm_hsa_importer_params* params, wm_importer** out) {
    static constexpr const char* fn = "wm_importer_create_hsa";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(out, fn, "out", status)) return status;
        if (params != nullptr && bad_struct_size(params, fn, "params", status)) return status;
        wm_hsa_importer_params defaults;
        wm_hsa_importer_params_init(&defaults);
        // No further than the caller's struct_size: the fields past it keep their defaults.
        const wm_hsa_importer_params c = params != nullptr ? read_struct(*params, defaults)
                                                           : defaults;
        if (c.agents == nullptr && c.agent_count != 0)
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(fn) + ": params->agents is NULL but agent_count is " +
                            std::to_string(c.agent_count));
        auto made = wm::make_hsa_importer(params_from_c(c));
        if (!made) return fail(fn, made.error());
        return hand_out(std::move(made).value(), out);
    });
}

wm_status wm_hsa_gpu_agent_count(wm_importer* hsa, uint32_t* out) {
    static constexpr const char* fn = "wm_hsa_gpu_agent_count";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(hsa, fn, "hsa", status) || null_arg(out, fn, "out", status)) return status;
        auto count = wm::hsa_lock_agent_count(*hsa->importer);
        if (!count) return fail(fn, count.error());
        *out = count.value();
        return WM_OK;
    });
}

} // extern "C"
