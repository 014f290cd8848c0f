// SPDX-License-Identifier: MIT
// read_model: which format a model's files are in, and joining parsed files into one model.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "formats/readers.hpp"
#include "internal/nothrow.hpp"

namespace wm {
namespace formats {

Result<ParsedFile> parse_path(const std::string& path, const ReadLimits& limits,
                              Result<ParsedFile> (*parse)(const Source&, std::string,
                                                          std::uint64_t, const ReadLimits&)) {
    auto source = FileSource::open(path);
    if (!source) return std::move(source).error();
    return parse(*source, path, source->size(), limits);
}

namespace {

Result<ModelInfo> parse_one(Span<const std::byte> head, std::uint64_t file_size,
                            std::string_view path, const ReadLimits& limits,
                            Result<ParsedFile> (*parse)(const Source&, std::string,
                                                        std::uint64_t, const ReadLimits&)) {
    if (file_size < head.size())
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: file size {} is smaller than the {} bytes given", path,
                                      file_size, head.size()));
    MemorySource source(head, path);
    auto parsed = parse(source, std::string(path), file_size, limits);
    if (!parsed) return std::move(parsed).error();
    std::vector<ParsedFile> files;
    files.push_back(std::move(parsed).value());
    return assemble(std::move(files));
}

} // namespace

// bad_alloc is an error: no exception crosses the API (formats.hpp).
Result<ModelInfo> parse_memory(Span<const std::byte> head, std::uint64_t file_size,
                               std::string_view path, const ReadLimits& limits,
                               Result<ParsedFile> (*parse)(const Source&, std::string,
                                                           std::uint64_t, const ReadLimits&)) {
    return internal::result_nothrow([&]() -> Result<ModelInfo> {
        return parse_one(head, file_size, path, limits, parse);
    });
}

Result<ModelInfo> assemble(std::vector<ParsedFile> files) {
    ModelInfo model;
    if (!files.empty()) model.architecture = std::move(files[0].architecture);
    std::unordered_map<std::string_view, std::uint32_t> owner;
    std::size_t total = 0;
    for (const ParsedFile& f : files) total += f.tensors.size();
    model.tensors.reserve(total);
    for (std::size_t i = 0; i < files.size(); ++i) {
        for (TensorInfo& t : files[i].tensors) {
            t.file = static_cast<std::uint32_t>(i);
            model.tensors.push_back(std::move(t));
        }
        model.files.push_back(std::move(files[i].file));
    }
    // Views into model.tensors, which no longer reallocates.
    for (const TensorInfo& t : model.tensors) {
        auto [it, inserted] = owner.emplace(t.name, t.file);
        if (!inserted)
            return make_error(ErrorKind::format,
                              fmt::format("tensor {} is in both {} and {}", quote_name(t.name),
                                          model.files[it->second].path, model.files[t.file].path));
    }
    return model;
}

} // namespace formats

namespace {

enum class Detected { gguf, safetensors, safetensors_index };

Result<Detected> detect(const std::string& path) {
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
        return Detected::safetensors_index;
    auto source = formats::FileSource::open(path);
    if (!source) return std::move(source).error();
    std::byte head[9] = {};
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(9, source->size()));
    if (Status s = source->read(0, head, n); !s) return std::move(s).error();
    if (n >= 4 && std::memcmp(head, "GGUF", 4) == 0) return Detected::gguf;
    if (n == 9 && head[8] == std::byte{'{'}) return Detected::safetensors;
    std::string shown;
    for (std::size_t i = 0; i < n; ++i)
        shown += fmt::format(" {:02x}", std::to_integer<int>(head[i]));
    return formats::format_error(path, 0, "magic",
                                 fmt::format("neither GGUF (no 'GGUF' magic) nor safetensors (no "
                                             "'{{' after an 8-byte header length); the file "
                                             "({} bytes) starts with{}",
                                             source->size(), n == 0 ? " nothing" : shown));
}

// Every model file has one format, detected from its start.
Result<ModelInfo> detect_and_read(Span<const std::string> paths, const ReadLimits& limits) {
    if (paths.empty()) return make_error(ErrorKind::invalid_argument, "no model file given");
    std::vector<Detected> kinds;
    for (const std::string& p : paths) {
        auto kind = detect(p);
        if (!kind) return std::move(kind).error();
        kinds.push_back(*kind);
    }
    if (kinds[0] == Detected::safetensors_index && paths.size() > 1)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: give a safetensors index alone; it names its shards",
                                      paths[0]));
    for (std::size_t i = 1; i < kinds.size(); ++i) {
        if (kinds[i] != kinds[0])
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("{} and {} are not in the same format; one model is "
                                          "one format", paths[0], paths[i]));
    }
    if (kinds[0] == Detected::gguf) return read_gguf(paths, limits);
    return read_safetensors(paths, limits);
}

} // namespace

Result<ModelInfo> read_model(Span<const std::string> paths, const ReadLimits& limits) {
    return internal::result_nothrow([&] { return detect_and_read(paths, limits); });
}

} // namespace wm
