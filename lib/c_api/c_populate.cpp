// SPDX-License-Identifier: MIT
// wm_populate_imports: populate.hpp's populate_imports for C callers.
#include "c_api.hpp"
#include "weightmap/populate.hpp"

using namespace wm::c_api;

namespace {

// The static string for a ReadReport::method (the C struct cannot own a std::string).
const char* static_method(const std::string& method) {
    for (const char* known : {"MADV_POPULATE_READ", "pread + page touch", "pread"})
        if (method == known) return known;
    return "other";
}

} // namespace

extern "C" wm_status wm_populate_imports(const wm_model* model, const wm_plan* plan,
                                         const wm_mapped_file* files, uint32_t file_count,
                                         wm_populate_report* report) {
    static constexpr const char* fn = "wm_populate_imports";
    return guarded(fn, [&] {
        wm_status status = WM_OK;
        if (null_arg(model, fn, "model", status) || null_arg(plan, fn, "plan", status) ||
            (file_count != 0 && null_arg(files, fn, "files", status)))
            return status;
        if (report != nullptr && bad_struct_size(report, fn, "report", status)) return status;
        if (file_count != model->desc.files.size())
            return fail(WM_ERROR_INVALID_ARGUMENT,
                        std::string(fn) + ": " + std::to_string(file_count) +
                            " files given for a model of " +
                            std::to_string(model->desc.files.size()));
        const std::vector<wm::MappedFile> mapped = files_from_c(files, file_count);
        auto done = wm::populate_imports(model->desc, *plan->plan, mapped);
        if (!done) return fail(fn, done.error());
        if (report != nullptr)
            write_struct(report, wm_populate_report{sizeof(wm_populate_report), done.value().bytes,
                                                    done.value().seconds,
                                                    static_method(done.value().method)});
        return WM_OK;
    });
}
