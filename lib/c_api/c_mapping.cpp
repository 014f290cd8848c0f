// SPDX-License-Identifier: MIT
// The C mapping policy (decide, map, unmap) and the memstat snapshot.
#include <string>
#include <vector>

#include "c_api.hpp"
#include "weightmap/memstat.hpp"

namespace wm::c_api {
namespace {

wm_status paths_from_c(const char* function, const char* const* paths, uint32_t count,
                       std::vector<std::string>& out) {
    wm_status status = WM_OK;
    if (count != 0 && null_arg(paths, function, "paths", status)) return status;
    for (uint32_t i = 0; i < count; ++i) {
        if (paths[i] == nullptr)
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(function) + ": paths[" + std::to_string(i) + "] is NULL");
        out.emplace_back(paths[i]);
    }
    return WM_OK;
}

wm_status mapping_options_from_c(const wm_mapping_options* in, MappingOptions& options) {
    static constexpr const char* fn = "wm_mapped_model_open";
    if (in == nullptr) return WM_OK;
    wm_status status = WM_OK;
    if (bad_struct_size(in, fn, "options", status)) return status;
    wm_mapping_options defaults{};
    wm_mapping_options_init(&defaults);
    const wm_mapping_options c = read_struct(*in, defaults);
    const long long hint = raw_enum(c.hint);
    if (hint < WM_ACCESS_NORMAL || hint > WM_ACCESS_SEQUENTIAL)
        return fail(WM_ERROR_INVALID_ARGUMENT, std::string(fn) + ": options->hint " +
                                                   std::to_string(hint) +
                                                   " is not a wm_access_hint");
    options.populate = c.populate;
    options.will_need = c.will_need;
    options.lock = c.lock;
    options.hint = static_cast<AccessHint>(c.hint);
    options.base_alignment = c.base_alignment;
    return WM_OK;
}

int64_t known(const std::optional<std::uint64_t>& value) {
    return value ? static_cast<int64_t>(*value) : WM_MEMSTAT_UNKNOWN;
}

int64_t drm_field(const MemStat& stat, const char* region, bool resident) {
    auto it = stat.drm.find(region);
    if (it == stat.drm.end()) return WM_MEMSTAT_UNKNOWN;
    return known(resident ? it->second.resident : it->second.total);
}

} // namespace
} // namespace wm::c_api

using namespace wm::c_api;

extern "C" {

wm_status wm_decide_mapping(const char* const* paths, uint32_t path_count,
                            wm_importer* const* importers, uint32_t importer_count,
                            wm_mapping_decision** out) {
    return wm_decide_mapping_for_policy(paths, path_count, importers, importer_count,
                                        WM_IMPORT_POLICY_UNIFIED_ONLY, out);
}

wm_status wm_decide_mapping_for_policy(const char* const* paths, uint32_t path_count,
                                       wm_importer* const* importers, uint32_t importer_count,
                                       wm_import_policy policy, wm_mapping_decision** out) {
    static constexpr const char* fn = "wm_decide_mapping";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(out, fn, "out", status) ||
            (importer_count != 0 && null_arg(importers, fn, "importers", status)))
            return status;
        std::vector<std::string> files;
        if (status = paths_from_c(fn, paths, path_count, files); status != WM_OK) return status;
        const long long raw = raw_enum(policy);
        if (raw < WM_IMPORT_POLICY_UNIFIED_ONLY || raw > WM_IMPORT_POLICY_NEVER)
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(fn) + ": policy " + std::to_string(raw) +
                            " is not a wm_import_policy (0 unified_only, 1 always, 2 never)");
        std::vector<wm::Importer*> list;
        for (uint32_t i = 0; i < importer_count; ++i) {
            if (importers[i] == nullptr)
                return fail(WM_ERROR_INVALID_ARGUMENT,
                            std::string(fn) + ": importers[" + std::to_string(i) + "] is NULL");
            list.push_back(importers[i]->importer.get());
        }
        auto handle = std::make_unique<wm_mapping_decision>();
        handle->decision =
            wm::decide_mapping(files, list, static_cast<wm::ImportPolicy>(raw));
        *out = handle.release();
        return WM_OK;
    });
}

wm_status wm_map_file_writable_shared(int fd, uint64_t length, wm_mapped_file* out) {
    static constexpr const char* fn = "wm_map_file_writable_shared";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(out, fn, "out", status)) return status;
        *out = wm_mapped_file{nullptr, 0};
        auto mapped = wm::map_file_writable_shared(fd, length);
        if (!mapped) return fail(fn, mapped.error());
        *out = wm_mapped_file{mapped->base, mapped->length};
        return WM_OK;
    });
}

void wm_mapping_decision_destroy(wm_mapping_decision* decision) { delete decision; }

wm_mapping_access wm_mapping_decision_access(const wm_mapping_decision* decision) {
    return decision != nullptr && decision->decision.access == wm::MappingAccess::writable
               ? WM_MAPPING_WRITABLE
               : WM_MAPPING_READ_ONLY;
}

const char* wm_mapping_decision_reason(const wm_mapping_decision* decision) {
    return decision == nullptr ? "" : decision->decision.reason.c_str();
}

const char* wm_mapping_decision_unwritable_path(const wm_mapping_decision* decision) {
    return decision == nullptr ? "" : decision->decision.unwritable_path.c_str();
}

void wm_mapping_options_init(wm_mapping_options* options) {
    if (options != nullptr)
        *options = wm_mapping_options{sizeof(wm_mapping_options), false, false, false,
                                      WM_ACCESS_NORMAL, 0};
}

wm_status wm_mapped_model_open(const char* const* paths, uint32_t path_count,
                               wm_mapping_access access, const wm_mapping_options* options,
                               wm_mapped_model** out) {
    static constexpr const char* fn = "wm_mapped_model_open";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(out, fn, "out", status)) return status;
        const long long raw_access = raw_enum(access);
        if (raw_access != WM_MAPPING_READ_ONLY && raw_access != WM_MAPPING_WRITABLE)
            return fail(WM_ERROR_INVALID_ARGUMENT, std::string(fn) + ": access " +
                                                       std::to_string(raw_access) +
                                                       " is not a wm_mapping_access");
        std::vector<std::string> files;
        if (status = paths_from_c(fn, paths, path_count, files); status != WM_OK) return status;
        wm::MappingOptions mapping_options;
        if (status = mapping_options_from_c(options, mapping_options); status != WM_OK)
            return status;
        auto opened = wm::MappedModel::open(files,
                                            access == WM_MAPPING_WRITABLE
                                                ? wm::MappingAccess::writable
                                                : wm::MappingAccess::read_only,
                                            mapping_options);
        if (!opened) return fail(fn, opened.error());
        auto handle = std::make_unique<wm_mapped_model>();
        handle->mapped = std::move(opened).value();
        for (const wm::MappedFile& file : handle->mapped.files())
            handle->files.push_back({file.base, file.length});
        *out = handle.release();
        return WM_OK;
    });
}

void wm_mapped_model_destroy(wm_mapped_model* mapped) { delete mapped; }

uint32_t wm_mapped_model_file_count(const wm_mapped_model* mapped) {
    return mapped == nullptr ? 0 : static_cast<uint32_t>(mapped->files.size());
}

const wm_mapped_file* wm_mapped_model_files(const wm_mapped_model* mapped) {
    return mapped == nullptr ? nullptr : mapped->files.data();
}

uint64_t wm_mapped_model_file_size(const wm_mapped_model* mapped, uint32_t index) {
    if (mapped == nullptr || index >= mapped->files.size()) return 0;
    return mapped->mapped.file_sizes()[index];
}

wm_mapping_access wm_mapped_model_access(const wm_mapped_model* mapped) {
    return mapped != nullptr && mapped->mapped.access() == wm::MappingAccess::writable
               ? WM_MAPPING_WRITABLE
               : WM_MAPPING_READ_ONLY;
}

bool wm_mapped_model_is_read_only(const wm_mapped_model* mapped) {
    return mapped == nullptr || mapped->mapped.is_read_only();
}

wm_status wm_mapped_model_make_read_only(wm_mapped_model* mapped) {
    static constexpr const char* fn = "wm_mapped_model_make_read_only";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(mapped, fn, "mapped", status)) return status;
        wm::Status done = mapped->mapped.make_read_only();
        return done ? WM_OK : fail(fn, done.error());
    });
}

wm_status wm_memstat_read(wm_memstat* out) {
    static constexpr const char* fn = "wm_memstat_read";
    return guarded(fn, [&] {
        const wm::MemStat stat = wm::read_memstat();
        return write_out(out,
                         wm_memstat{sizeof(wm_memstat), known(stat.rss_file),
                                    known(stat.rss_anon), known(stat.rss_shmem),
                                    known(stat.vm_lck), known(stat.vm_pin),
                                    drm_field(stat, "gtt", false), drm_field(stat, "gtt", true),
                                    drm_field(stat, "vram", false), drm_field(stat, "vram", true)},
                         fn, "out");
    });
}

} // extern "C"
