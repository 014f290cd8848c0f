// SPDX-License-Identifier: MIT
// safetensors: an 8-byte little-endian header length, a JSON header, then the data; offsets in
// the header are relative to the first byte after it. Sharded models add
// model.safetensors.index.json, whose weight_map names each tensor's shard.
//
// The JSON is parsed with nlohmann's SAX interface rather than into a DOM: a 100 MB header of
// `[0,0,0,...]` would be ~8x that as a DOM, while the SAX handler keeps only the tensors and
// refuses a wrong structure at its first event. The parser reports malformed JSON through
// parse_error(), so no exception is thrown; bad_alloc is caught at the API boundary.
#include <algorithm>
#include <filesystem>
#include <map>
#include <new>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/readers.hpp"
#include "internal/nothrow.hpp"

namespace wm {
namespace formats {
namespace {

using json = nlohmann::json;

// Nesting deeper than this inside a skipped value (__metadata__, unknown keys) is refused; the
// real structure is three levels deep.
constexpr std::uint32_t max_skip_depth = 64;

// Shared SAX plumbing: skipping values the caller does not want, and remembering the first error.
class SaxBase {
public:
    using string_t = json::string_t;
    using binary_t = json::binary_t;

    std::optional<std::string> error;       // the first semantic error
    std::optional<std::size_t> error_byte;  // where in the JSON, when the parser knows
    ErrorKind error_kind = ErrorKind::format;

    bool parse_error(std::size_t position, const std::string& /*last_token*/,
                     const nlohmann::detail::exception& ex) {
        if (!error) {
            // ex.what() is "[json.exception.parse_error.101] parse error at line 1, column 7:
            // syntax error while parsing value - ..."; keep the part after the id.
            std::string what = ex.what();
            if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
            error = "malformed JSON: " + what;
            error_byte = position > 0 ? position - 1 : 0;
        }
        return false;
    }

protected:
    std::uint32_t skip_depth_ = 0; // > 0: inside a skipped array or object
    bool skip_next_ = false;       // the next value is skipped

    bool fail(std::string message) {
        if (!error) error = std::move(message);
        return false;
    }
    bool fail_limit(std::string message) {
        if (!error) error_kind = ErrorKind::limit;
        return fail(std::move(message));
    }
    // Returns true when the event belongs to a skipped value (and consumes it).
    bool skipping_scalar() {
        if (skip_depth_ > 0) return true;
        if (skip_next_) {
            skip_next_ = false;
            return true;
        }
        return false;
    }
    // Same for start_object/start_array; `ok` is false when nesting is too deep.
    bool skipping_start(bool& ok) {
        ok = true;
        if (skip_depth_ > 0 || skip_next_) {
            skip_next_ = false;
            if (++skip_depth_ > max_skip_depth) ok = fail_limit(fmt::format(
                "values nested more than {} deep", max_skip_depth));
            return true;
        }
        return false;
    }
    bool skipping_end() {
        if (skip_depth_ == 0) return false;
        --skip_depth_;
        return true;
    }
};

struct RawTensor {
    std::string name;
    std::optional<std::string> dtype;
    std::optional<std::vector<std::uint64_t>> shape;
    std::optional<std::vector<std::uint64_t>> offsets;
};

// The tensor header: {"NAME": {"dtype": "F16", "shape": [..], "data_offsets": [b, e]}, ...,
// "__metadata__": {...}}.
class HeaderSax : public SaxBase {
public:
    explicit HeaderSax(const ReadLimits& limits) : limits_(limits) {}
    std::vector<RawTensor> tensors;

    bool null() { return scalar("null"); }
    bool boolean(bool) { return scalar("a boolean"); }
    bool number_integer(json::number_integer_t) { return scalar("a negative number"); }
    bool number_float(json::number_float_t, const string_t&) {
        return scalar("a number that is not an unsigned 64-bit integer");
    }
    bool binary(binary_t&) { return scalar("binary data"); }
    bool number_unsigned(json::number_unsigned_t v) {
        if (skipping_scalar()) return true;
        if (level_ == 3) {
            std::vector<std::uint64_t>& list = *current_list();
            if (list.size() >= limits_.max_dims)
                return fail_limit(fmt::format("tensor {}: {} has more than {} entries",
                                        quote_name(tensors.back().name), field_name(),
                                        limits_.max_dims));
            list.push_back(v);
            return true;
        }
        return scalar("a number");
    }
    bool string(string_t& v) {
        if (skipping_scalar()) return true;
        if (level_ == 2 && pending_ == Pending::dtype) {
            tensors.back().dtype = std::move(v);
            pending_ = Pending::none;
            return true;
        }
        return scalar("a string");
    }
    bool start_object(std::size_t) {
        bool ok = true;
        if (skipping_start(ok)) return ok;
        if (level_ == 0) {
            level_ = 1;
            return true;
        }
        if (level_ == 1 && pending_ == Pending::tensor) {
            level_ = 2;
            pending_ = Pending::none;
            return true;
        }
        return scalar("an object");
    }
    bool start_array(std::size_t) {
        bool ok = true;
        if (skipping_start(ok)) return ok;
        if (level_ == 2 && (pending_ == Pending::shape || pending_ == Pending::offsets)) {
            (pending_ == Pending::shape ? tensors.back().shape : tensors.back().offsets).emplace();
            level_ = 3;
            return true;
        }
        return scalar("an array");
    }
    bool end_array() {
        if (skipping_end()) return true;
        // level 3: the only arrays not skipped are shape and data_offsets.
        level_ = 2;
        if (pending_ == Pending::offsets && tensors.back().offsets->size() != 2)
            return fail(fmt::format("tensor {}: data_offsets has {} entries, not 2",
                                    quote_name(tensors.back().name),
                                    tensors.back().offsets->size()));
        pending_ = Pending::none;
        return true;
    }
    bool key(string_t& k) {
        if (skipping_scalar()) return true;
        if (level_ == 1) {
            if (k == "__metadata__") {
                skip_next_ = true;
                return true;
            }
            if (k.size() > limits_.max_name_length)
                return fail_limit(fmt::format("tensor name of {} bytes, over the limit of {}",
                                        k.size(), limits_.max_name_length));
            if (tensors.size() >= limits_.max_tensors)
                return fail_limit(fmt::format("more than {} tensors", limits_.max_tensors));
            if (!names_.insert(k).second)
                return fail(fmt::format("duplicate tensor name {}", quote_name(k)));
            tensors.push_back(RawTensor{std::move(k), {}, {}, {}});
            pending_ = Pending::tensor;
            return true;
        }
        // level 2: a tensor's field.
        RawTensor& t = tensors.back();
        bool seen = false;
        if (k == "dtype") {
            pending_ = Pending::dtype;
            seen = t.dtype.has_value();
        } else if (k == "shape") {
            pending_ = Pending::shape;
            seen = t.shape.has_value();
        } else if (k == "data_offsets") {
            pending_ = Pending::offsets;
            seen = t.offsets.has_value();
        } else {
            skip_next_ = true; // unknown keys are ignored, as the safetensors library does
            return true;
        }
        if (seen) return fail(fmt::format("tensor {}: duplicate key '{}'", quote_name(t.name), k));
        return true;
    }
    bool end_object() {
        if (skipping_end()) return true;
        if (level_ == 2) {
            const RawTensor& t = tensors.back();
            const char* missing = !t.dtype ? "dtype" : !t.shape ? "shape"
                                  : !t.offsets ? "data_offsets" : nullptr;
            if (missing != nullptr)
                return fail(fmt::format("tensor {}: no '{}'", quote_name(t.name), missing));
        }
        --level_;
        return true;
    }

private:
    enum class Pending { none, tensor, dtype, shape, offsets };
    const ReadLimits& limits_;
    int level_ = 0; // 0 outside, 1 root object, 2 a tensor's object, 3 its shape/offsets array
    Pending pending_ = Pending::none;
    std::unordered_set<std::string> names_;

    std::optional<std::vector<std::uint64_t>>& current_opt() {
        return pending_ == Pending::shape ? tensors.back().shape : tensors.back().offsets;
    }
    std::vector<std::uint64_t>* current_list() { return &*current_opt(); }
    const char* field_name() const { return pending_ == Pending::shape ? "shape" : "data_offsets"; }

    // A scalar, or a compound where none belongs.
    bool scalar(const char* what) {
        if (skipping_scalar()) return true;
        switch (level_) {
        case 0: return fail(fmt::format("the header must be a JSON object, found {}", what));
        case 1:
            return fail(fmt::format("tensor {}: must be an object, found {}",
                                    quote_name(tensors.back().name), what));
        case 2:
            return fail(fmt::format("tensor {}: '{}' must be {}, found {}",
                                    quote_name(tensors.back().name),
                                    pending_ == Pending::dtype ? "dtype" : field_name(),
                                    pending_ == Pending::dtype ? "a string"
                                                               : "an array of unsigned integers",
                                    what));
        default:
            return fail(fmt::format("tensor {}: {} entries must be unsigned 64-bit integers, "
                                    "found {}",
                                    quote_name(tensors.back().name), field_name(), what));
        }
    }
};

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {"NAME": "SHARD", ...}}.
class IndexSax : public SaxBase {
public:
    explicit IndexSax(const ReadLimits& limits) : limits_(limits) {}
    std::vector<std::pair<std::string, std::string>> weight_map;
    bool has_weight_map = false;

    bool null() { return scalar("null"); }
    bool boolean(bool) { return scalar("a boolean"); }
    bool number_integer(json::number_integer_t) { return scalar("a number"); }
    bool number_unsigned(json::number_unsigned_t) { return scalar("a number"); }
    bool number_float(json::number_float_t, const string_t&) { return scalar("a number"); }
    bool binary(binary_t&) { return scalar("binary data"); }
    bool string(string_t& v) {
        if (skipping_scalar()) return true;
        if (level_ == 2) {
            weight_map.back().second = std::move(v);
            return true;
        }
        return scalar("a string");
    }
    bool start_object(std::size_t) {
        bool ok = true;
        if (skipping_start(ok)) return ok;
        if (level_ == 0 || (level_ == 1 && in_map_)) {
            ++level_;
            return true;
        }
        return scalar("an object");
    }
    bool start_array(std::size_t) {
        bool ok = true;
        if (skipping_start(ok)) return ok;
        return scalar("an array");
    }
    bool end_array() { return skipping_end(); }
    bool key(string_t& k) {
        if (skipping_scalar()) return true;
        if (level_ == 1) {
            in_map_ = k == "weight_map";
            if (in_map_) {
                if (has_weight_map) return fail("duplicate key 'weight_map'");
                has_weight_map = true;
            } else {
                skip_next_ = true;
            }
            return true;
        }
        if (weight_map.size() >= limits_.max_tensors)
            return fail_limit(fmt::format("weight_map: more than {} tensors", limits_.max_tensors));
        if (!names_.insert(k).second)
            return fail(fmt::format("weight_map: duplicate tensor {}", quote_name(k)));
        weight_map.emplace_back(std::move(k), std::string());
        return true;
    }
    bool end_object() {
        if (skipping_end()) return true;
        if (level_ == 2) in_map_ = false;
        --level_;
        return true;
    }

private:
    const ReadLimits& limits_;
    int level_ = 0;
    bool in_map_ = false;
    std::unordered_set<std::string> names_;

    bool scalar(const char* what) {
        if (skipping_scalar()) return true;
        if (level_ == 0)
            return fail(fmt::format("the index must be a JSON object, found {}", what));
        if (level_ == 1) return fail(fmt::format("weight_map must be an object, found {}", what));
        return fail(fmt::format("weight_map: tensor {} must map to a file name string, found {}",
                                quote_name(weight_map.back().first), what));
    }
};

// Byte of `needle` (a quoted JSON key) in `text`, to point an error at its tensor.
std::optional<std::size_t> find_key(std::string_view text, std::string_view name) {
    std::string needle = fmt::format("\"{}\"", name);
    std::size_t at = text.find(needle);
    return at == std::string_view::npos ? std::nullopt : std::optional<std::size_t>(at);
}

template <class Sax>
bool run_sax(std::string_view text, Sax& sax) {
    try {
        return json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json,
                               /*strict=*/true, /*ignore_comments=*/false);
    } catch (const std::bad_alloc&) {
        throw; // read_safetensors reports it as out_of_memory, not as a malformed header
    } catch (const std::exception& e) {
        if (!sax.error) sax.error = fmt::format("JSON parser failed: {}", e.what());
        return false;
    }
}

} // namespace

namespace {

// The JSON header's text: its length checked against the limit and the file, no NUL inside.
Result<std::string> read_header_text(Cursor& c, std::uint64_t size, const ReadLimits& limits) {
    std::uint64_t n = 0;
    if (Status s = c.get(n, "header_length"); !s) return std::move(s).error();
    if (n > limits.max_json_bytes)
        return c.error_at(0, "header_length",
                          fmt::format("JSON header of {} bytes, over the limit of {}", n,
                                      limits.max_json_bytes),
                          ErrorKind::limit);
    if (n > c.remaining())
        return c.error_at(0, "header_length",
                          fmt::format("JSON header of {} bytes, only {} remain in the file of {} "
                                      "bytes", n, c.remaining(), size));
    std::string text(static_cast<std::size_t>(n), '\0');
    if (Status s = c.read(reinterpret_cast<std::byte*>(text.data()), text.size(), "header"); !s)
        return std::move(s).error();
    if (text.empty() || text[0] != '{')
        return c.error_at(8, "header", "the JSON header must start with '{'");
    // nlohmann's lexer ends the input at a NUL byte; the safetensors library refuses one. Refuse
    // it too, so no tensor can hide behind a NUL from one of the two parsers.
    if (std::size_t nul = text.find('\0'); nul != std::string::npos)
        return c.error_at(8 + nul, "header", "the JSON header holds a NUL byte");
    return text;
}

// The header's tensors as the SAX parser read them; an error points at the byte it blames.
Result<std::vector<RawTensor>> parse_header_json(Cursor& c, const std::string& text,
                                                 const ReadLimits& limits) {
    HeaderSax sax(limits);
    const bool parsed = run_sax(text, sax);
    if (!parsed || sax.error) {
        std::size_t at = sax.error_byte.value_or(0);
        if (!sax.error_byte && !sax.tensors.empty())
            at = find_key(text, sax.tensors.back().name).value_or(0);
        return c.error_at(8 + at, "header", sax.error.value_or("malformed JSON"), sax.error_kind);
    }
    return std::move(sax.tensors);
}

// File offset of each tensor's key, for messages. Keys appear in document order, so one forward
// scan finds them all (a search per tensor from the start would be quadratic).
std::vector<std::uint64_t> key_positions(std::string_view text,
                                         const std::vector<RawTensor>& tensors) {
    std::vector<std::uint64_t> key_pos;
    key_pos.reserve(tensors.size());
    std::size_t scan = 0;
    for (const RawTensor& raw : tensors) {
        std::optional<std::size_t> at = find_key(text.substr(scan), raw.name);
        key_pos.push_back(8 + (at ? scan + *at : 0));
        if (at) scan += *at + raw.name.size() + 2;
    }
    return key_pos;
}

// One header entry as a tensor: a known dtype, data_offsets that hold exactly its shape's bytes.
// `blame` is the byte of its key.
Result<TensorInfo> to_tensor_info(Cursor& c, RawTensor& raw, std::uint64_t data_offset,
                                  std::uint64_t blame) {
    const std::string field = fmt::format("header {}", quote_name(raw.name));
    if (find_safetensors_dtype(*raw.dtype) == nullptr)
        return c.error_at(blame, field, fmt::format("unknown dtype {}", quote_name(*raw.dtype)));
    auto bytes = safetensors_tensor_bytes(*raw.dtype, *raw.shape);
    if (!bytes) return c.error_at(blame, field, bytes.error().message);
    const std::uint64_t begin = (*raw.offsets)[0], end = (*raw.offsets)[1];
    if (end < begin)
        return c.error_at(blame, field,
                          fmt::format("data_offsets [{}, {}) end before they begin", begin, end));
    if (end - begin != *bytes)
        return c.error_at(blame, field,
                          fmt::format("data_offsets [{}, {}) hold {} bytes, but {} of shape "
                                      "[{}] takes {}", begin, end, end - begin, *raw.dtype,
                                      fmt::join(*raw.shape, ", "), *bytes));
    TensorInfo t;
    if (add_overflows(data_offset, begin, t.offset))
        return c.error_at(blame, field,
                          fmt::format("data offset {} + {} overflows 64 bits", data_offset, begin));
    t.size = *bytes;
    t.name = std::move(raw.name);
    t.type = std::move(*raw.dtype);
    t.shape = std::move(*raw.shape);
    return t;
}

} // namespace

Result<ParsedFile> parse_safetensors_file(const Source& source, std::string path,
                                          std::uint64_t size, const ReadLimits& limits) {
    Cursor c(source, path, size);
    auto text = read_header_text(c, size, limits);
    if (!text) return std::move(text).error();
    auto raw_tensors = parse_header_json(c, *text, limits);
    if (!raw_tensors) return std::move(raw_tensors).error();
    const std::vector<std::uint64_t> key_pos = key_positions(*text, *raw_tensors);

    ParsedFile out;
    out.file.path = path;
    out.file.size = size;
    out.file.format = ModelFormat::safetensors;
    out.file.version = 0;
    out.file.alignment = 1;
    out.file.data_offset = 8 + text->size();
    out.file.tensor_count = raw_tensors->size();
    out.tensors.reserve(raw_tensors->size());
    for (std::size_t i = 0; i < raw_tensors->size(); ++i) {
        auto t = to_tensor_info(c, (*raw_tensors)[i], out.file.data_offset, key_pos[i]);
        if (!t) return std::move(t).error();
        out.tensors.push_back(std::move(t).value());
    }
    std::vector<TensorExtent> extents; // their names view out.tensors, complete by now
    extents.reserve(out.tensors.size());
    for (std::size_t i = 0; i < out.tensors.size(); ++i) {
        const TensorInfo& t = out.tensors[i];
        extents.push_back({t.offset, t.size, key_pos[i], t.name,
                           fmt::format("header {}.data_offsets", quote_name(t.name))});
    }
    if (Status s = check_extents(path, size, std::move(extents)); !s) return std::move(s).error();
    return out;
}

namespace {

// A shard name from an index must stay next to the index: no directories, no "..".
bool plain_file_name(std::string_view name) {
    return !name.empty() && name != "." && name != ".." &&
           name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

Result<ModelInfo> read_index(const std::string& index_path, const ReadLimits& limits) {
    auto source = FileSource::open(index_path);
    if (!source) return std::move(source).error();
    if (source->size() > limits.max_json_bytes)
        return format_error(index_path, 0, "index",
                            fmt::format("{} bytes, over the limit of {}", source->size(),
                                        limits.max_json_bytes),
                            ErrorKind::limit);
    std::string text(static_cast<std::size_t>(source->size()), '\0');
    if (Status s = source->read(0, reinterpret_cast<std::byte*>(text.data()), text.size()); !s)
        return std::move(s).error();
    if (std::size_t nul = text.find('\0'); nul != std::string::npos)
        return format_error(index_path, nul, "index", "holds a NUL byte");
    IndexSax sax(limits);
    if (!run_sax(text, sax) || sax.error) {
        std::size_t at = sax.error_byte.value_or(0);
        if (!sax.error_byte && !sax.weight_map.empty())
            at = find_key(text, sax.weight_map.back().first).value_or(0);
        return format_error(index_path, at, "index", sax.error.value_or("malformed JSON"),
                            sax.error_kind);
    }
    if (!sax.has_weight_map)
        return format_error(index_path, 0, "index", "no 'weight_map'");

    std::set<std::string> shard_names;
    for (const auto& [tensor, file] : sax.weight_map) {
        if (!plain_file_name(file))
            return format_error(index_path, find_key(text, tensor).value_or(0), "weight_map",
                                fmt::format("tensor {} names shard {}: only a plain file name "
                                            "next to the index is allowed", quote_name(tensor),
                                            quote_name(file)));
        shard_names.insert(file);
    }
    if (shard_names.size() > limits.max_files)
        return format_error(index_path, 0, "weight_map",
                            fmt::format("{} shards, over the limit of {}", shard_names.size(),
                                        limits.max_files),
                            ErrorKind::limit);
    const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
    std::vector<ParsedFile> files;
    std::map<std::string, std::size_t> shard_index;
    for (const std::string& name : shard_names) {
        auto f = parse_path((dir / name).string(), limits, parse_safetensors_file);
        if (!f) return std::move(f).error();
        shard_index[name] = files.size();
        files.push_back(std::move(f).value());
    }
    // Both directions: a tensor the index promises must be in its shard, and a shard tensor the
    // index does not list would be silently dropped by loaders that follow the index.
    std::unordered_map<std::string_view, std::size_t> where;
    for (std::size_t i = 0; i < files.size(); ++i)
        for (const TensorInfo& t : files[i].tensors) where.emplace(t.name, i);
    for (const auto& [tensor, file] : sax.weight_map) {
        auto it = where.find(tensor);
        const std::size_t want = shard_index[file];
        if (it == where.end() || it->second != want)
            return format_error(index_path, find_key(text, tensor).value_or(0), "weight_map",
                                fmt::format("tensor {} is not in its shard {}", quote_name(tensor),
                                            files[want].file.path));
    }
    if (where.size() != sax.weight_map.size()) {
        std::unordered_set<std::string_view> listed;
        for (const auto& entry : sax.weight_map) listed.insert(entry.first);
        for (const ParsedFile& f : files)
            for (const TensorInfo& t : f.tensors)
                if (!listed.contains(t.name))
                    return format_error(index_path, 0, "weight_map",
                                        fmt::format("tensor {} of {} is not in the index",
                                                    quote_name(t.name), f.file.path));
    }
    return assemble(std::move(files));
}


Result<ModelInfo> read_safetensors_files(Span<const std::string> paths, const ReadLimits& limits) {
    if (paths.empty()) return make_error(ErrorKind::invalid_argument, "no safetensors file given");
    if (paths.size() > limits.max_files)
        return make_error(ErrorKind::limit, fmt::format("{} files, over the limit of {}",
                                                        paths.size(), limits.max_files));
    const std::string& first = paths[0];
    if (first.size() >= 5 && first.compare(first.size() - 5, 5, ".json") == 0) {
        if (paths.size() > 1)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("{}: give a safetensors index alone; it names its "
                                          "shards", first));
        try {
            return read_index(first, limits);
        } catch (const std::exception& e) { // std::filesystem, allocation
            return make_error(ErrorKind::io, fmt::format("{}: {}", first, e.what()));
        }
    }
    std::vector<ParsedFile> files;
    for (const std::string& p : paths) {
        auto f = parse_path(p, limits, parse_safetensors_file);
        if (!f) return std::move(f).error();
        files.push_back(std::move(f).value());
    }
    return assemble(std::move(files));
}

} // namespace
} // namespace formats

// bad_alloc, in the index's path and the single files' alike, is an error.
Result<ModelInfo> read_safetensors(Span<const std::string> paths, const ReadLimits& limits) {
    return internal::result_nothrow(
        [&] { return formats::read_safetensors_files(paths, limits); });
}

Result<ModelInfo> parse_safetensors(Span<const std::byte> head, std::uint64_t file_size,
                                    std::string_view path, const ReadLimits& limits) {
    return formats::parse_memory(head, file_size, path, limits, &formats::parse_safetensors_file);
}

} // namespace wm
