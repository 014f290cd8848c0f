// SPDX-License-Identifier: MIT
// The C file guard (file_guard.h) over wm::FileGuard.
#include <string>
#include <vector>

#include "c_api.hpp"
#include "internal/file_guard_access.hpp"
#include "weightmap/file_guard.h"
#include "weightmap/file_guard.hpp"

struct wm_file_guard {
    wm::FileGuard guard;
    std::vector<std::string> reasons; // per file, fixed at create: get_file hands out pointers
};

using namespace wm::c_api;

namespace {

wm_file_guard_event event_to_c(const wm::FileGuardEvent& e) {
    return {sizeof(wm_file_guard_event), e.file, static_cast<wm_file_guard_event_kind>(e.kind),
            e.monotonic_ns, e.deadline_ns};
}

wm::FileGuardParams params_from_c(const wm_guarded_file* files, uint32_t count,
                                  const wm_file_guard_params& c) {
    wm::FileGuardParams params;
    for (uint32_t i = 0; i < count; ++i)
        params.files.push_back({files[i].fd, files[i].path != nullptr ? files[i].path : ""});
    for (uint32_t r = 0; c.regions != nullptr && r < c.region_count; ++r)
        params.regions.push_back({c.regions[r].file, c.regions[r].offset, c.regions[r].size});
    params.poll_period_ms = c.poll_period_ms;
    params.log = log_from_c(c.log, c.log_user);
    if (c.on_event != nullptr)
        params.on_event = [fn = c.on_event, user = c.on_event_user](const wm::FileGuardEvent& e) {
            const wm_file_guard_event event = event_to_c(e);
            fn(user, &event);
        };
    return params;
}

} // namespace

extern "C" {

const char* wm_file_guard_event_kind_name(wm_file_guard_event_kind kind) {
    const long long raw = raw_enum(kind);
    if (raw < WM_FILE_GUARD_LEASE_BREAKING || raw > WM_FILE_GUARD_METADATA_CHANGED) return "?";
    return wm::to_string(static_cast<wm::FileGuardEventKind>(raw));
}

void wm_file_guard_params_init(wm_file_guard_params* params) {
    if (params != nullptr)
        *params = wm_file_guard_params{sizeof(wm_file_guard_params), nullptr, nullptr, 20,
                                       nullptr, nullptr, nullptr, 0};
}

wm_status wm_file_guard_create(const wm_guarded_file* files, uint32_t file_count,
                               const wm_file_guard_params* params, wm_file_guard** out) {
    static constexpr const char* fn = "wm_file_guard_create";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if ((file_count != 0 && null_arg(files, fn, "files", status)) ||
            null_arg(out, fn, "out", status) ||
            (params != nullptr && bad_struct_size(params, fn, "params", status)))
            return status;
        wm_file_guard_params defaults{};
        wm_file_guard_params_init(&defaults);
        const wm_file_guard_params c =
            params != nullptr ? read_struct(*params, defaults) : defaults;
        if (c.region_count != 0 && null_arg(c.regions, fn, "params->regions", status)) return status;
        // Published only once *out is stored: the callback's first event can then release
        // through the handle it reads from there (issue 44).
        auto created = wm::internal::FileGuardAccess::create_unpublished(
            params_from_c(files, file_count, c));
        if (!created) return fail(fn, created.error());
        auto handle =
            std::make_unique<wm_file_guard>(wm_file_guard{std::move(created).value(), {}});
        for (uint32_t i = 0; i < file_count; ++i)
            handle->reasons.push_back(handle->guard.status(i)->reason);
        *out = handle.release();
        wm::internal::FileGuardAccess::publish((*out)->guard);
        return WM_OK;
    });
}

void wm_file_guard_destroy(wm_file_guard* guard) { delete guard; }

wm_status wm_file_guard_release(wm_file_guard* guard, uint32_t file) {
    static constexpr const char* fn = "wm_file_guard_release";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(guard, fn, "guard", status) ||
            bad_index(file, guard->guard.file_count(), fn, "file", status))
            return status;
        auto released = guard->guard.release(file);
        return released ? WM_OK : fail(fn, released.error());
    });
}

wm_status wm_file_guard_read(const wm_file_guard* guard, uint32_t file, uint64_t offset,
                             void* destination, size_t size) {
    static constexpr const char* fn = "wm_file_guard_read";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(guard, fn, "guard", status) ||
            (size > 0 && null_arg(destination, fn, "destination", status)) ||
            bad_index(file, guard->guard.file_count(), fn, "file", status))
            return status;
        auto read = guard->guard.read(file, offset, destination, size);
        return read ? WM_OK : fail(fn, read.error());
    });
}

uint32_t wm_file_guard_file_count(const wm_file_guard* guard) {
    return guard == nullptr ? 0 : guard->guard.file_count();
}

wm_status wm_file_guard_get_file(const wm_file_guard* guard, uint32_t file,
                                 wm_file_guard_file_status* out) {
    static constexpr const char* fn = "wm_file_guard_get_file";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(guard, fn, "guard", status) ||
            bad_index(file, guard->guard.file_count(), fn, "file", status))
            return status;
        auto got = guard->guard.status(file);
        if (!got) return fail(fn, got.error());
        return write_out(out,
                         wm_file_guard_file_status{sizeof(wm_file_guard_file_status),
                                                   static_cast<wm_file_lease_state>(got->lease),
                                                   got->lease_errno,
                                                   guard->reasons[file].c_str()},
                         fn, "out");
    });
}

wm_status wm_file_guard_next_event(wm_file_guard* guard, wm_file_guard_event* out,
                                   bool* has_event) {
    static constexpr const char* fn = "wm_file_guard_next_event";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(guard, fn, "guard", status) || null_arg(out, fn, "out", status) ||
            null_arg(has_event, fn, "has_event", status) ||
            bad_struct_size(out, fn, "out", status))
            return status;
        wm::FileGuardEvent event;
        *has_event = guard->guard.next_event(event);
        if (*has_event) write_struct(out, event_to_c(event));
        return WM_OK;
    });
}

int wm_file_guard_event_fd(const wm_file_guard* guard) {
    return guard == nullptr ? -1 : guard->guard.event_fd();
}

} // extern "C"
