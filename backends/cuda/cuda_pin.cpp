// SPDX-License-Identifier: MIT
// cuda_pin_fallbacks: page-lock the ranges an engine copies to a discrete device itself, so its
// cuMemcpyHtoD calls are DMA transfers (llama.cpp PR #26659), owned by the placement.
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "cuda_importer.hpp"
#include "internal/align.hpp"
#include "executor/placement_access.hpp"
#include "weightmap/backends/cuda.hpp"
#include "weightmap/log.hpp"
#include "weightmap/planner.hpp"

namespace wm {
namespace {

struct Range {
    std::uint64_t begin = 0; // page-aligned file offsets
    std::uint64_t end = 0;
};

// Sorts and merges overlapping or touching ranges.
void merge(std::vector<Range>& ranges) {
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
    std::vector<Range> merged;
    for (const Range& r : ranges) {
        if (!merged.empty() && r.begin <= merged.back().end)
            merged.back().end = std::max(merged.back().end, r.end);
        else
            merged.push_back(r);
    }
    ranges = std::move(merged);
}

// Removes [cut.begin, cut.end) from every range (a page an import already registered).
void subtract(std::vector<Range>& ranges, Range cut) {
    std::vector<Range> out;
    for (const Range& r : ranges) {
        if (cut.end <= r.begin || cut.begin >= r.end) {
            out.push_back(r);
            continue;
        }
        if (r.begin < cut.begin) out.push_back({r.begin, cut.begin});
        if (cut.end < r.end) out.push_back({cut.end, r.end});
    }
    ranges = std::move(out);
}

Status check_inputs(const Placement& placement, const ModelDesc& model,
                    Span<const MappedFile> files, std::uint32_t target) {
    const Plan& plan = placement.plan();
    if (plan.tensors.size() != model.tensors.size() || files.size() != model.files.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("cuda_pin_fallbacks: the placement has {} tensors, the "
                                      "model {} tensors, {} files and {} mappings were given",
                                      plan.tensors.size(), model.tensors.size(),
                                      model.files.size(), files.size()));
    if (target != no_index && target >= model.targets.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("cuda_pin_fallbacks: target {} out of range ({} targets)",
                                      target, model.targets.size()));
    for (std::size_t i = 0; i < placement.import_count(); ++i) {
        const PlacedImport live = placement.import_at(i);
        if (live.file >= files.size() ||
            live.buffer->host_address != files[live.file].base + live.extent_offset)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("cuda_pin_fallbacks: import {} of the placement is not "
                                          "in the given mapping of file {}",
                                          i, live.file));
    }
    return {};
}

// The page ranges of the fallback tensors on `target` (no_index: every non-CPU target), per
// file, merged, less the pages the placement's imports hold. Counts the tensors considered.
Result<std::vector<std::vector<Range>>> fallback_ranges(const Placement& placement,
                                                        const ModelDesc& model,
                                                        Span<const MappedFile> files,
                                                        std::uint32_t target,
                                                        std::uint64_t& tensors) {
    const std::uint64_t page = host_page_size();
    std::vector<std::vector<Range>> per_file(files.size());
    for (std::size_t i = 0; i < model.tensors.size(); ++i) {
        const TensorDesc& t = model.tensors[i];
        const bool wanted = target == no_index ? !model.targets[t.target].caps.is_cpu
                                               : t.target == target;
        if (!wanted || t.size == 0 || placement.plan().tensors[i].run != no_index) continue;
        if (t.offset + t.size > files[t.file].length)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("cuda_pin_fallbacks: tensor '{}' ends at {} but file {} "
                                          "is mapped for {} bytes",
                                          t.name, t.offset + t.size, t.file,
                                          files[t.file].length));
        per_file[t.file].push_back(
            {align_down(t.offset, page),
             std::min(align_up_saturating(t.offset + t.size, page), files[t.file].length)});
        ++tensors;
    }
    for (auto& ranges : per_file) merge(ranges);
    for (std::size_t i = 0; i < placement.import_count(); ++i) {
        const PlacedImport live = placement.import_at(i);
        subtract(per_file[live.file],
                 {live.extent_offset, live.extent_offset + live.buffer->size});
    }
    return per_file;
}

// Hands the pins to the placement: they are unregistered when it releases, before its imports.
void attach_pins(Placement& placement, cuda::CudaImporter& importer, std::vector<void*> pins) {
    internal::PlacementAccess::attach(placement, [&importer, pins = std::move(pins)]() noexcept {
        for (auto it = pins.rbegin(); it != pins.rend(); ++it) {
            Status status = importer.unpin(*it);
            if (status) continue;
            try {
                log_message({}, LogLevel::warning,
                            fmt::format("cuda: unpin of {} failed: {}", *it,
                                        status.error().message));
            } catch (...) { // a log message is not worth terminating the engine for
            }
        }
    });
}

} // namespace

Result<CudaPinReport> cuda_pin_fallbacks(Importer& cuda_importer, Placement& placement,
                                         const ModelDesc& model, Span<const MappedFile> files,
                                         std::uint32_t target) {
    auto* importer = dynamic_cast<cuda::CudaImporter*>(&cuda_importer);
    if (importer == nullptr)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("cuda_pin_fallbacks: importer '{}' was not made by "
                                      "make_cuda_importer", cuda_importer.name()));
    if (std::string why = importer->pin_unavailable_reason(); !why.empty())
        return make_error(ErrorKind::unsupported, "cuda_pin_fallbacks: " + why);
    if (Status ok = check_inputs(placement, model, files, target); !ok) return ok.error();
    CudaPinReport report;
    auto ranges = fallback_ranges(placement, model, files, target, report.tensors);
    if (!ranges) return std::move(ranges).error();
    std::vector<void*> pins;
    for (std::size_t f = 0; f < files.size(); ++f)
        for (const Range& r : ranges.value()[f]) {
            void* host = files[f].base + r.begin;
            if (Status pinned = importer->pin(host, r.end - r.begin); !pinned) {
                if (report.refused_ranges++ == 0) report.first_refusal = pinned.error().message;
                continue;
            }
            pins.push_back(host);
            ++report.ranges;
            report.bytes += r.end - r.begin;
        }
    if (!pins.empty()) attach_pins(placement, *importer, std::move(pins));
    return report;
}

} // namespace wm
