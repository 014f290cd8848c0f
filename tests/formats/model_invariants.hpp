// SPDX-License-Identifier: MIT
// What every ModelInfo a reader returns must satisfy, whatever bytes it was given: the tests'
// sweeps and the fuzz targets both check it. Header-only and free of Catch2, so the fuzz targets
// can include it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "weightmap/formats.hpp"

namespace wm::test {

/// Empty when `model` keeps every promise of formats.hpp; otherwise what it breaks.
inline std::string model_invariant_violation(const ModelInfo& model) {
    std::set<std::string> names;
    for (const TensorInfo& t : model.tensors) {
        if (t.file >= model.files.size()) return "tensor " + t.name + ": file index out of range";
        const ModelFile& f = model.files[t.file];
        std::uint64_t end = 0;
        if (__builtin_add_overflow(t.offset, t.size, &end)) return t.name + ": end overflows";
        if (end > f.size) return t.name + ": ends past its file";
        if (t.offset < f.data_offset) return t.name + ": starts inside the header";
        if (!names.insert(t.name).second) return t.name + ": duplicate name";
        if (f.format == ModelFormat::gguf) {
            const GgmlType* type = find_ggml_type(std::string_view(t.type));
            if (type == nullptr) return t.name + ": unknown type name " + t.type;
            auto bytes = ggml_tensor_bytes(type->id, t.shape);
            if (!bytes || *bytes != t.size) return t.name + ": size disagrees with type x shape";
            if (f.alignment == 0 || (f.alignment & (f.alignment - 1)) != 0)
                return "alignment not a power of two";
            if ((t.offset - f.data_offset) % f.alignment != 0) return t.name + ": misaligned";
            if (f.data_offset % f.alignment != 0) return "data offset misaligned";
        } else {
            auto bytes = safetensors_tensor_bytes(t.type, t.shape);
            if (!bytes || *bytes != t.size) return t.name + ": size disagrees with dtype x shape";
        }
    }
    for (std::uint32_t file = 0; file < model.files.size(); ++file) {
        std::vector<std::pair<std::uint64_t, std::uint64_t>> extents;
        for (const TensorInfo& t : model.tensors)
            if (t.file == file && t.size > 0) extents.emplace_back(t.offset, t.offset + t.size);
        std::sort(extents.begin(), extents.end());
        for (std::size_t i = 1; i < extents.size(); ++i)
            if (extents[i - 1].second > extents[i].first) return "two tensors overlap";
        std::uint64_t count = 0;
        for (const TensorInfo& t : model.tensors) count += t.file == file ? 1 : 0;
        if (count != model.files[file].tensor_count) return "tensor_count disagrees";
    }
    return {};
}

} // namespace wm::test
