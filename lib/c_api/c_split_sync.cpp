// SPDX-License-Identifier: MIT
// The C split-ordering helper: one call per split from the scheduler loop.
#include <string>

#include "c_api.hpp"

using namespace wm::c_api;

extern "C" {

void wm_split_sync_params_init(wm_split_sync_params* params) {
    if (params != nullptr) *params = wm_split_sync_params{sizeof(wm_split_sync_params), 0, false};
}

void wm_split_desc_init(wm_split_desc* split) {
    if (split != nullptr)
        *split = wm_split_desc{sizeof(wm_split_desc), 0, false, 0, 0, true, 0, false};
}

wm_status wm_split_sync_create(const wm_split_sync_params* params, wm_split_sync** out) {
    static constexpr const char* fn = "wm_split_sync_create";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(params, fn, "params", status) || null_arg(out, fn, "out", status) ||
            bad_struct_size(params, fn, "params", status))
            return status;
        wm_split_sync_params defaults{};
        wm_split_sync_params_init(&defaults);
        const wm_split_sync_params c = read_struct(*params, defaults);
        auto created = wm::SplitSync::create({c.n_backends, c.sync_deferred_before_reuse});
        if (!created) return fail(fn, created.error());
        *out = new wm_split_sync{std::move(created).value()};
        return WM_OK;
    });
}

void wm_split_sync_destroy(wm_split_sync* sync) { delete sync; }

wm_status wm_split_sync_next(wm_split_sync* sync, const wm_split_desc* split,
                             wm_split_sync_decision* out) {
    static constexpr const char* fn = "wm_split_sync_next";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(sync, fn, "sync", status) || null_arg(split, fn, "split", status) ||
            null_arg(out, fn, "out", status) || bad_struct_size(split, fn, "split", status) ||
            bad_struct_size(out, fn, "out", status))
            return status;
        wm_split_desc defaults{};
        wm_split_desc_init(&defaults);
        const wm_split_desc c = read_struct(*split, defaults);
        const wm::SplitDesc desc{c.backend,        c.backend_async,      c.n_inputs,
                                 c.input_backends, c.input_copies_async, c.buffer_types,
                                 c.writes_read_later};
        auto decision = sync->sync.next(desc);
        if (!decision) return fail(fn, decision.error());
        write_struct(out, wm_split_sync_decision{sizeof(wm_split_sync_decision),
                                                 decision->sync_now, decision->deferred});
        return WM_OK;
    });
}

uint64_t wm_split_sync_finish(wm_split_sync* sync) {
    return sync == nullptr ? 0 : sync->sync.finish();
}

void wm_split_sync_reset(wm_split_sync* sync) {
    if (sync != nullptr) sync->sync.reset();
}

void wm_split_sync_end_graph(wm_split_sync* sync) {
    if (sync != nullptr) sync->sync.end_graph();
}

void wm_split_sync_synchronized(wm_split_sync* sync, uint64_t backends) {
    if (sync != nullptr) sync->sync.synchronized(backends);
}

uint64_t wm_split_sync_in_flight(const wm_split_sync* sync) {
    return sync == nullptr ? 0 : sync->sync.in_flight();
}

} // extern "C"
