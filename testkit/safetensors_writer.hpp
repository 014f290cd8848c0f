// SPDX-License-Identifier: MIT
// Writes safetensors files and index.json for the tests and the fuzz seeds (not part of the
// installed library). Like the GGUF writer it writes what it is told, valid or not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "testkit/gguf_writer.hpp" // DataFill
#include "weightmap/result.hpp"

namespace wm::testkit {

struct SafetensorsTensorSpec {
    std::string name;
    std::string dtype;                 ///< written as given; an unknown dtype has size 0
    std::vector<std::uint64_t> shape;
    /// [begin, end) relative to the data section; default: packed in spec order.
    std::optional<std::pair<std::uint64_t, std::uint64_t>> data_offsets;
};

struct SafetensorsSpec {
    std::vector<SafetensorsTensorSpec> tensors;
    std::vector<std::pair<std::string, std::string>> metadata; ///< __metadata__, if not empty
    bool pad_to_8 = true; ///< pad the header with spaces to a multiple of 8, as the library does
};

struct SafetensorsLayout {
    std::string header;                 ///< the JSON header as written (padding included)
    std::uint64_t data_offset = 0;      ///< 8 + header.size()
    std::vector<std::uint64_t> offsets; ///< absolute, by spec index
    std::vector<std::uint64_t> sizes;   ///< from the dtype table; 0 when unknown
    std::uint64_t file_size = 0;        ///< data_offset + the largest end offset
};

SafetensorsLayout layout_safetensors(const SafetensorsSpec& spec);

/// 8-byte length + `header` + `data_bytes` bytes of pattern: any header, for corrupt cases.
std::vector<std::byte> safetensors_bytes_from_header(const std::string& header,
                                                     std::uint64_t data_bytes);

/// The whole file in memory, data bytes the pattern.
std::vector<std::byte> safetensors_bytes(const SafetensorsSpec& spec,
                                         SafetensorsLayout* layout = nullptr);

Result<SafetensorsLayout> write_safetensors(const std::string& path, const SafetensorsSpec& spec,
                                            DataFill fill);

/// model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {...}}.
Status write_safetensors_index(const std::string& path,
                               const std::vector<std::pair<std::string, std::string>>& weight_map,
                               std::uint64_t total_size);

} // namespace wm::testkit
