// SPDX-License-Identifier: MIT
#include "testkit/safetensors_writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "testkit/pattern.hpp"
#include "weightmap/formats.hpp"

namespace wm::testkit {
namespace {

std::uint64_t dtype_size(const SafetensorsTensorSpec& t) {
    auto bytes = safetensors_tensor_bytes(t.dtype, t.shape);
    return bytes ? *bytes : 0;
}

std::string dump(const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

} // namespace

SafetensorsLayout layout_safetensors(const SafetensorsSpec& spec) {
    SafetensorsLayout layout;
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!spec.metadata.empty()) {
        nlohmann::ordered_json meta = nlohmann::ordered_json::object();
        for (const auto& [k, v] : spec.metadata) meta[k] = v;
        header["__metadata__"] = std::move(meta);
    }
    std::uint64_t packed = 0, data_end = 0;
    std::vector<std::uint64_t> rel;
    for (const SafetensorsTensorSpec& t : spec.tensors) {
        const std::uint64_t size = dtype_size(t);
        const auto offsets = t.data_offsets.value_or(std::pair{packed, packed + size});
        header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape},
                          {"data_offsets", {offsets.first, offsets.second}}};
        layout.sizes.push_back(size);
        rel.push_back(offsets.first);
        packed = std::max(packed, offsets.second);
        data_end = std::max(data_end, offsets.second);
    }
    layout.header = dump(header);
    if (spec.pad_to_8) layout.header.append((8 - layout.header.size() % 8) % 8, ' ');
    layout.data_offset = 8 + layout.header.size();
    for (std::uint64_t r : rel) layout.offsets.push_back(layout.data_offset + r);
    layout.file_size = layout.data_offset + data_end;
    return layout;
}

std::vector<std::byte> safetensors_bytes_from_header(const std::string& header,
                                                     std::uint64_t data_bytes) {
    std::vector<std::byte> out;
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(n >> (8 * i)));
    for (char c : header) out.push_back(static_cast<std::byte>(c));
    const std::size_t start = out.size();
    out.resize(start + data_bytes);
    fill_model_pattern(start, std::span(out).subspan(start));
    return out;
}

std::vector<std::byte> safetensors_bytes(const SafetensorsSpec& spec,
                                         SafetensorsLayout* layout_out) {
    SafetensorsLayout layout = layout_safetensors(spec);
    std::vector<std::byte> out =
        safetensors_bytes_from_header(layout.header, layout.file_size - layout.data_offset);
    if (layout_out != nullptr) *layout_out = std::move(layout);
    return out;
}

Result<SafetensorsLayout> write_safetensors(const std::string& path, const SafetensorsSpec& spec,
                                            DataFill fill) {
    SafetensorsLayout layout = layout_safetensors(spec);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    const std::uint64_t n = layout.header.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>(n >> (8 * i));
    f.write(len, 8);
    f.write(layout.header.data(), static_cast<std::streamsize>(n));
    if (fill == DataFill::pattern) {
        std::vector<std::byte> chunk(std::size_t{4} << 20);
        for (std::uint64_t at = layout.data_offset; f && at < layout.file_size;) {
            const std::size_t size = static_cast<std::size_t>(
                std::min<std::uint64_t>(chunk.size(), layout.file_size - at));
            fill_model_pattern(at, std::span(chunk).first(size));
            f.write(reinterpret_cast<const char*>(chunk.data()),
                    static_cast<std::streamsize>(size));
            at += size;
        }
    } else if (layout.file_size > layout.data_offset) {
        // A hole up to the end: seek to the last byte and write it.
        f.seekp(static_cast<std::streamoff>(layout.file_size - 1));
        f.put('\0');
    }
    f.close();
    if (!f)
        return make_error(ErrorKind::io, fmt::format("{}: write failed: {}", path,
                                                     std::strerror(errno)));
    return layout;
}

Status write_safetensors_index(const std::string& path,
                               const std::vector<std::pair<std::string, std::string>>& weight_map,
                               std::uint64_t total_size) {
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (const auto& [tensor, file] : weight_map) map[tensor] = file;
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total_size}}},
                                    {"weight_map", std::move(map)}};
    std::ofstream f(path, std::ios::trunc);
    f << index.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
    f.close();
    if (!f)
        return make_error(ErrorKind::io, fmt::format("{}: write failed: {}", path,
                                                     std::strerror(errno)));
    return {};
}

} // namespace wm::testkit
