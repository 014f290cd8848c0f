// SPDX-License-Identifier: MIT
// What the per-format readers share: one parsed file, and assembling files into a model.
#pragma once

#include <cstdint>
#include <optional>
#include "weightmap/span.hpp"
#include <string>
#include <vector>

#include "formats/byte_reader.hpp"
#include "weightmap/formats.hpp"

namespace wm::formats {

/// One file as its reader parsed it; tensors' `file` fields are 0 until assembled.
struct ParsedFile {
    ModelFile file;
    std::vector<TensorInfo> tensors;
    std::string architecture;                   ///< GGUF general.architecture
    std::optional<std::uint64_t> split_tensors; ///< GGUF split.tensors.count
};

Result<ParsedFile> parse_gguf_file(const Source& source, std::string path, std::uint64_t size,
                                   const ReadLimits& limits);
Result<ParsedFile> parse_safetensors_file(const Source& source, std::string path,
                                          std::uint64_t size, const ReadLimits& limits);

/// Opens `path` and parses it with `parse`.
Result<ParsedFile> parse_path(const std::string& path, const ReadLimits& limits,
                              Result<ParsedFile> (*parse)(const Source&, std::string,
                                                          std::uint64_t, const ReadLimits&));

/// Parses one file held in memory (the fuzzers' entry) with `parse` and assembles it.
Result<ModelInfo> parse_memory(Span<const std::byte> head, std::uint64_t file_size,
                               std::string_view path, const ReadLimits& limits,
                               Result<ParsedFile> (*parse)(const Source&, std::string,
                                                           std::uint64_t, const ReadLimits&));

/// Joins files into one model (tensor file indices set), refusing a tensor name that two files
/// share. The architecture is the first file's.
Result<ModelInfo> assemble(std::vector<ParsedFile> files);

} // namespace wm::formats
