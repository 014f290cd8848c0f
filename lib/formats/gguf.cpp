// SPDX-License-Identifier: MIT
// GGUF v2/v3 headers: metadata bounds-checked and skipped (a few keys kept), tensor infos, the
// data section, and each tensor's absolute extent. llama.cpp's own parser has had heap overflows
// from trusting counts and lengths (CVE-2024-25664 and relatives), so nothing here allocates or
// loops on a number before checking it against the bytes left in the file.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <regex>
#include <unordered_set>

#include <fmt/format.h>

#include "formats/readers.hpp"
#include "internal/nothrow.hpp"
#include "internal/align.hpp"

namespace wm {
namespace formats {
namespace {

constexpr std::uint64_t default_alignment = 32; // GGUF_DEFAULT_ALIGNMENT
constexpr std::uint32_t max_ggml_dims = 4;      // GGML_MAX_DIMS
// Smallest encodings, used to refuse counts the rest of the file cannot hold: a key-value pair
// is a length (8), a type (4) and at least one value byte; a tensor info is a name length (8),
// n_dims (4), a type (4) and an offset (8); an array element that is an array is a type (4)
// and a count (8); a string element is its length (8).
constexpr std::uint64_t min_kv_bytes = 13;
constexpr std::uint64_t min_tensor_info_bytes = 24;
constexpr std::uint64_t min_array_bytes = 12;
constexpr std::uint64_t min_string_bytes = 8;

enum ValueType : std::uint32_t {
    t_u8, t_i8, t_u16, t_i16, t_u32, t_i32, t_f32, t_bool, t_string, t_array, t_u64, t_i64,
    t_f64, t_count
};

const char* value_type_name(std::uint32_t t) {
    static constexpr const char* names[] = {"uint8", "int8",   "uint16", "int16", "uint32",
                                            "int32", "float32", "bool",  "string", "array",
                                            "uint64", "int64",  "float64"};
    return t < t_count ? names[t] : "?";
}

// Bytes of a fixed-size value, 0 for string and array.
std::uint64_t fixed_size(std::uint32_t t) {
    switch (t) {
    case t_u8: case t_i8: case t_bool: return 1;
    case t_u16: case t_i16: return 2;
    case t_u32: case t_i32: case t_f32: return 4;
    case t_u64: case t_i64: case t_f64: return 8;
    default: return 0;
    }
}

const char* removed_ggml_type(std::uint32_t id) {
    switch (id) {
    case 4: return "Q4_2";
    case 5: return "Q4_3";
    case 31: return "Q4_0_4_4";
    case 32: return "Q4_0_4_8";
    case 33: return "Q4_0_8_8";
    case 36: return "IQ4_NL_4_4";
    case 37: return "IQ4_NL_4_8";
    case 38: return "IQ4_NL_8_8";
    default: return nullptr;
    }
}

class GgufParser {
public:
    GgufParser(const Source& source, std::string path, std::uint64_t size, const ReadLimits& limits)
        : path_(std::move(path)), c_(source, path_, size), limits_(limits) {}

    Result<ParsedFile> parse();

private:
    std::string path_;
    Cursor c_;
    const ReadLimits& limits_;
    ParsedFile out_;
    std::uint64_t alignment_ = default_alignment;

    Status read_header(std::uint64_t& n_tensors, std::uint64_t& n_kv);
    Status read_string(std::string& out, std::uint64_t max_len, std::string_view field,
                       std::string_view what);
    Status read_value_type(std::uint32_t& type, std::string_view field);
    Status skip_value(std::uint32_t type, std::uint32_t depth, std::string_view field);
    Status read_unsigned(std::uint32_t type, std::uint64_t& out, std::string_view field,
                         std::string_view key);
    Status read_kv(std::uint64_t index, std::unordered_set<std::string>& keys);
    Status read_tensor_info(std::uint64_t index, std::unordered_set<std::string>& names,
                            std::vector<std::uint64_t>& rel_offsets,
                            std::vector<std::uint64_t>& offset_pos);
};

Status GgufParser::read_header(std::uint64_t& n_tensors, std::uint64_t& n_kv) {
    std::byte magic[4];
    if (Status s = c_.read(magic, 4, "magic"); !s) return s;
    if (std::memcmp(magic, "GGUF", 4) != 0)
        return c_.error_at(
            0, "magic",
            fmt::format("not a GGUF file: expected 47 47 55 46 ('GGUF'), found "
                        "{:02x} {:02x} {:02x} {:02x}",
                        std::to_integer<int>(magic[0]), std::to_integer<int>(magic[1]),
                        std::to_integer<int>(magic[2]), std::to_integer<int>(magic[3])));
    std::uint32_t version = 0;
    if (Status s = c_.get(version, "version"); !s) return s;
    if (version == 1)
        return c_.error_at(4, "version",
                           "GGUF v1 (32-bit counts) is not supported; supported: 2, 3");
    if ((version & 0xffffu) == 0 && (version >> 24) >= 1 && (version >> 24) <= 3)
        return c_.error_at(4, "version",
                           fmt::format("big-endian GGUF (version bytes {:08x}) is not supported",
                                       version));
    if (version != 2 && version != 3)
        return c_.error_at(4, "version",
                           fmt::format("unsupported version {}; supported: 2, 3", version));
    out_.file.version = version;

    if (Status s = c_.get(n_tensors, "tensor_count"); !s) return s;
    if (Status s = c_.get(n_kv, "metadata_kv_count"); !s) return s;
    if (n_tensors > limits_.max_tensors)
        return c_.error_at(8, "tensor_count",
                           fmt::format("{} tensors, over the limit of {}", n_tensors,
                                       limits_.max_tensors),
                           ErrorKind::limit);
    if (n_kv > limits_.max_metadata_entries)
        return c_.error_at(16, "metadata_kv_count",
                           fmt::format("{} key-value pairs, over the limit of {}", n_kv,
                                       limits_.max_metadata_entries),
                           ErrorKind::limit);
    std::uint64_t need_infos = 0, need_kv = 0, need = 0;
    if (mul_overflows(n_tensors, min_tensor_info_bytes, need_infos) ||
        mul_overflows(n_kv, min_kv_bytes, need_kv) || add_overflows(need_infos, need_kv, need) ||
        need > c_.remaining())
        return c_.error_at(8, "tensor_count",
                           fmt::format("{} tensor infos and {} key-value pairs need at least "
                                       "{} x {} + {} x {} bytes, only {} remain in the file of {} "
                                       "bytes", n_tensors, n_kv, n_tensors, min_tensor_info_bytes,
                                       n_kv, min_kv_bytes, c_.remaining(), c_.file_size()));
    return {};
}

Status GgufParser::read_string(std::string& out, std::uint64_t max_len, std::string_view field,
                               std::string_view what) {
    const std::uint64_t at = c_.pos();
    std::uint64_t len = 0;
    if (Status s = c_.get(len, field); !s) return s;
    if (len > max_len)
        return c_.error_at(at, field,
                           fmt::format("{} of {} bytes, over the limit of {}", what, len, max_len),
                           ErrorKind::limit);
    if (len > c_.remaining())
        return c_.error_at(at, field,
                           fmt::format("{} of {} bytes, only {} remain in the file", what, len,
                                       c_.remaining()));
    out.resize(static_cast<std::size_t>(len));
    return c_.read(reinterpret_cast<std::byte*>(out.data()), out.size(), field);
}

Status GgufParser::read_value_type(std::uint32_t& type, std::string_view field) {
    const std::uint64_t at = c_.pos();
    if (Status s = c_.get(type, field); !s) return s;
    if (type >= t_count)
        return c_.error_at(at, field, fmt::format("unknown value type {}", type));
    return {};
}

Status GgufParser::skip_value(std::uint32_t type, std::uint32_t depth, std::string_view field) {
    if (std::uint64_t n = fixed_size(type); n != 0) return c_.skip(n, field);
    const std::uint64_t at = c_.pos();
    if (type == t_string) {
        std::uint64_t len = 0;
        if (Status s = c_.get(len, field); !s) return s;
        return c_.skip(len, field);
    }
    // An array: element type, count, elements.
    std::uint32_t elem = 0;
    std::uint64_t count = 0;
    if (Status s = read_value_type(elem, field); !s) return s;
    if (Status s = c_.get(count, field); !s) return s;
    const std::uint64_t elem_min = elem == t_array    ? min_array_bytes
                                   : elem == t_string ? min_string_bytes
                                                      : fixed_size(elem);
    std::uint64_t need = 0;
    if (mul_overflows(count, elem_min, need) || need > c_.remaining())
        return c_.error_at(at, field,
                           fmt::format("array of {} {} elements needs at least {} bytes per "
                                       "element, only {} remain in the file",
                                       count, value_type_name(elem), elem_min, c_.remaining()));
    if (elem != t_array && elem != t_string) return c_.skip(need, field);
    if (elem == t_array && depth + 1 > limits_.max_array_nesting)
        return c_.error_at(at, field,
                           fmt::format("arrays nested more than {} deep",
                                       limits_.max_array_nesting),
                           ErrorKind::limit);
    for (std::uint64_t i = 0; i < count; ++i)
        if (Status s = skip_value(elem, depth + 1, field); !s) return s;
    return {};
}

Status GgufParser::read_unsigned(std::uint32_t type, std::uint64_t& out, std::string_view field,
                                 std::string_view key) {
    const std::uint64_t at = c_.pos();
    const std::uint64_t width = fixed_size(type);
    const bool is_signed = type == t_i8 || type == t_i16 || type == t_i32 || type == t_i64;
    const bool is_unsigned = type == t_u8 || type == t_u16 || type == t_u32 || type == t_u64;
    if (!is_signed && !is_unsigned)
        return c_.error_at(at, field,
                           fmt::format("{} must be an integer, found {}", key,
                                       value_type_name(type)));
    std::byte b[8] = {};
    if (Status s = c_.read(b, width, field); !s) return s;
    std::uint64_t v = 0;
    for (std::uint64_t i = 0; i < width; ++i) v |= std::to_integer<std::uint64_t>(b[i]) << (8 * i);
    if (is_signed && ((v >> (8 * width - 1)) & 1) != 0)
        return c_.error_at(at, field, fmt::format("{} must not be negative", key));
    out = v;
    return {};
}

Status GgufParser::read_kv(std::uint64_t index, std::unordered_set<std::string>& keys) {
    const std::uint64_t key_pos = c_.pos();
    std::string key;
    const std::string key_field = fmt::format("metadata[{}].key", index);
    if (Status s = read_string(key, limits_.max_key_length, key_field, "key"); !s) return s;
    const std::string field = fmt::format("metadata[{}] {}", index, quote_name(key));
    if (!keys.insert(key).second)
        return c_.error_at(key_pos, field, "duplicate key");
    std::uint32_t type = 0;
    if (Status s = read_value_type(type, field); !s) return s;
    const std::uint64_t value_pos = c_.pos();

    if (key == "general.alignment") {
        std::uint64_t a = 0;
        if (Status s = read_unsigned(type, a, field, key); !s) return s;
        if (!is_power_of_two(a))
            return c_.error_at(value_pos, field,
                               fmt::format("alignment {} is not a power of two", a));
        alignment_ = a;
    } else if (key == "general.architecture") {
        if (type != t_string)
            return c_.error_at(value_pos, field,
                               fmt::format("must be a string, found {}", value_type_name(type)));
        if (Status s = read_string(out_.architecture, limits_.max_key_length, field, "string");
            !s)
            return s;
    } else if (key == "split.count" || key == "split.no") {
        std::uint64_t v = 0;
        if (Status s = read_unsigned(type, v, field, key); !s) return s;
        const bool is_count = key == "split.count";
        if (v > limits_.max_files || (is_count && v == 0))
            return c_.error_at(value_pos, field,
                               fmt::format("{} is out of range (1..{} shards)", v,
                                           limits_.max_files),
                               is_count && v != 0 ? ErrorKind::limit : ErrorKind::format);
        (is_count ? out_.file.split_count : out_.file.split_no) = static_cast<std::uint32_t>(v);
    } else if (key == "split.tensors.count") {
        std::uint64_t v = 0;
        if (Status s = read_unsigned(type, v, field, key); !s) return s;
        out_.split_tensors = v;
    } else {
        return skip_value(type, 0, field);
    }
    return {};
}

Status GgufParser::read_tensor_info(std::uint64_t index, std::unordered_set<std::string>& names,
                                    std::vector<std::uint64_t>& rel_offsets,
                                    std::vector<std::uint64_t>& offset_pos) {
    const std::uint64_t name_pos = c_.pos();
    TensorInfo t;
    const std::string base = fmt::format("tensor_infos[{}]", index);
    if (Status s = read_string(t.name, limits_.max_name_length, base + ".name", "name"); !s)
        return s;
    if (!names.insert(t.name).second)
        return c_.error_at(name_pos, base + ".name",
                           fmt::format("duplicate tensor name {}", quote_name(t.name)));
    const std::string who = fmt::format("{} {}", base, quote_name(t.name));

    const std::uint64_t dims_pos = c_.pos();
    std::uint32_t n_dims = 0;
    if (Status s = c_.get(n_dims, who + ".n_dims"); !s) return s;
    if (n_dims > max_ggml_dims)
        return c_.error_at(dims_pos, who + ".n_dims",
                           fmt::format("{} dimensions, ggml has at most {}", n_dims,
                                       max_ggml_dims));
    t.shape.resize(n_dims);
    for (auto& d : t.shape)
        if (Status s = c_.get(d, who + ".ne"); !s) return s;

    const std::uint64_t type_pos = c_.pos();
    std::uint32_t type = 0;
    if (Status s = c_.get(type, who + ".type"); !s) return s;
    const GgmlType* gt = find_ggml_type(type);
    if (gt == nullptr) {
        const char* removed = removed_ggml_type(type);
        return c_.error_at(type_pos, who + ".type",
                           removed != nullptr
                               ? fmt::format("ggml type id {} ({}) was removed from ggml; "
                                             "re-quantize the model", type, removed)
                               : fmt::format("unknown ggml type id {}", type));
    }
    t.type = std::string(gt->name);

    const std::uint64_t off_pos = c_.pos();
    std::uint64_t rel = 0;
    if (Status s = c_.get(rel, who + ".offset"); !s) return s;
    if (rel % alignment_ != 0)
        return c_.error_at(off_pos, who + ".offset",
                           fmt::format("offset {} is not a multiple of the alignment {}", rel,
                                       alignment_));
    auto bytes = ggml_tensor_bytes(type, t.shape);
    if (!bytes) return c_.error_at(dims_pos, who + ".ne", bytes.error().message);
    t.size = *bytes;

    rel_offsets.push_back(rel);
    offset_pos.push_back(off_pos);
    out_.tensors.push_back(std::move(t));
    return {};
}

Result<ParsedFile> GgufParser::parse() {
    out_.file.path = path_;
    out_.file.size = c_.file_size();
    out_.file.format = ModelFormat::gguf;

    std::uint64_t n_tensors = 0, n_kv = 0;
    if (Status s = read_header(n_tensors, n_kv); !s) return std::move(s).error();

    std::unordered_set<std::string> keys;
    for (std::uint64_t i = 0; i < n_kv; ++i)
        if (Status s = read_kv(i, keys); !s) return std::move(s).error();
    out_.file.alignment = alignment_;
    if (out_.file.split_count != 0 && out_.file.split_no >= out_.file.split_count)
        return c_.error_at(c_.pos(), "split.no",
                           fmt::format("split.no {} is not below split.count {}",
                                       out_.file.split_no, out_.file.split_count));

    // Memory grows only with tensor infos actually read (each takes >= 24 file bytes), never
    // with the count the file claims.
    std::unordered_set<std::string> names;
    std::vector<std::uint64_t> rel_offsets, offset_pos;
    for (std::uint64_t i = 0; i < n_tensors; ++i)
        if (Status s = read_tensor_info(i, names, rel_offsets, offset_pos); !s)
            return std::move(s).error();

    const std::uint64_t infos_end = c_.pos();
    std::uint64_t data_offset = 0;
    if (add_overflows(infos_end, alignment_ - 1, data_offset))
        return c_.error_at(infos_end, "data section",
                           fmt::format("alignment {} overflows the data offset", alignment_));
    data_offset = data_offset / alignment_ * alignment_;
    if (n_tensors > 0 && data_offset > c_.file_size())
        return c_.error_at(infos_end, "data section",
                           fmt::format("starts at {} (alignment {}), past the end of the file "
                                       "({} bytes)", data_offset, alignment_, c_.file_size()));
    out_.file.data_offset = data_offset;
    out_.file.tensor_count = n_tensors;

    std::vector<TensorExtent> extents;
    extents.reserve(out_.tensors.size());
    for (std::size_t i = 0; i < out_.tensors.size(); ++i) {
        TensorInfo& t = out_.tensors[i];
        std::string field = fmt::format("tensor_infos[{}].offset", i);
        if (add_overflows(data_offset, rel_offsets[i], t.offset))
            return c_.error_at(offset_pos[i], field,
                               fmt::format("tensor {}: data offset {} + offset {} overflows 64 "
                                           "bits",
                                           quote_name(t.name), data_offset, rel_offsets[i]));
        extents.push_back({t.offset, t.size, offset_pos[i], t.name, std::move(field)});
    }
    if (Status s = check_extents(path_, c_.file_size(), std::move(extents)); !s)
        return std::move(s).error();
    return std::move(out_);
}

struct SplitName {
    std::string prefix;
    std::uint64_t no = 0;    // 1-based, as in the name
    std::uint64_t count = 0;
};

// llama.cpp's split naming: PREFIX-%05d-of-%05d.gguf, shard numbers from 1.
std::optional<SplitName> parse_split_name(const std::string& path) {
    static const std::regex pattern(R"(^(.*)-([0-9]{5,})-of-([0-9]{5,})\.gguf$)");
    std::smatch m;
    if (!std::regex_match(path, m, pattern)) return std::nullopt;
    SplitName name;
    name.prefix = m[1].str();
    const std::string no = m[2].str(), count = m[3].str();
    if (std::from_chars(no.data(), no.data() + no.size(), name.no).ec != std::errc{} ||
        std::from_chars(count.data(), count.data() + count.size(), name.count).ec != std::errc{} ||
        name.no == 0 || name.no > name.count)
        return std::nullopt;
    return name;
}

std::string split_path(const std::string& prefix, std::uint64_t no, std::uint64_t count) {
    return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, no, count);
}

// The paths of every shard when `first` is the first shard of a split; just `first` otherwise.
Result<std::vector<std::string>> expand_first_shard(const ParsedFile& first,
                                                    const ReadLimits& limits) {
    const std::string& path = first.file.path;
    const std::optional<SplitName> name = parse_split_name(path);
    const std::uint64_t key_count = first.file.split_count;
    const std::uint64_t count = key_count != 0 ? key_count : name ? name->count : 1;
    if (name && key_count != 0 && name->count != key_count)
        return make_error(ErrorKind::format,
                          fmt::format("{}: split.count is {} but the file name says {} shards",
                                      path, key_count, name->count));
    if (count <= 1) return std::vector<std::string>{path};
    const std::uint64_t no = key_count != 0 ? first.file.split_no : name->no - 1;
    if (no != 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: this is shard {} of {}; give the first shard "
                                      "(-00001-of-{:05d}.gguf) or every shard", path, no + 1,
                                      count, count));
    if (!name)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: split.count is {} but the name does not follow "
                                      "PREFIX-00001-of-{:05d}.gguf; give every shard's path",
                                      path, count, count));
    if (count > limits.max_files)
        return make_error(ErrorKind::limit, fmt::format("{}: {} shards, over the limit of {}",
                                                        path, count, limits.max_files));
    std::vector<std::string> paths;
    for (std::uint64_t i = 1; i <= count; ++i) paths.push_back(split_path(name->prefix, i, count));
    return paths;
}

// Puts shards in split.no order and checks they are exactly the N shards of one split.
Status order_shards(std::vector<ParsedFile>& files) {
    const bool any_split = std::any_of(files.begin(), files.end(), [](const ParsedFile& f) {
        return f.file.split_count != 0;
    });
    if (!any_split) return {};
    const std::uint64_t n = files.size();
    for (const ParsedFile& f : files) {
        if (f.file.split_count == 0 && n > 1)
            return make_error(ErrorKind::format,
                              fmt::format("{}: has no split.count, but other files given with it "
                                          "are shards of a split", f.file.path));
        if (f.file.split_count != n)
            return make_error(ErrorKind::format,
                              fmt::format("{}: split.count is {} but {} shard(s) were found",
                                          f.file.path, f.file.split_count, n));
    }
    std::sort(files.begin(), files.end(), [](const ParsedFile& a, const ParsedFile& b) {
        return a.file.split_no < b.file.split_no;
    });
    for (std::uint64_t i = 0; i < n; ++i)
        if (files[i].file.split_no != i)
            return make_error(ErrorKind::format,
                              fmt::format("{}: split.no {} where shard {} was expected (two "
                                          "shards with the same number?)",
                                          files[i].file.path, files[i].file.split_no, i));
    if (files[0].split_tensors) {
        std::uint64_t total = 0;
        for (const ParsedFile& f : files) total += f.tensors.size();
        if (*files[0].split_tensors != total)
            return make_error(ErrorKind::format,
                              fmt::format("{}: split.tensors.count is {} but the {} shards hold "
                                          "{} tensors", files[0].file.path,
                                          *files[0].split_tensors, n, total));
    }
    return {};
}

} // namespace

Result<ParsedFile> parse_gguf_file(const Source& source, std::string path, std::uint64_t size,
                                   const ReadLimits& limits) {
    return GgufParser(source, std::move(path), size, limits).parse();
}

namespace {

Result<ModelInfo> read_gguf_files(Span<const std::string> paths, const ReadLimits& limits) {
    if (paths.empty()) return make_error(ErrorKind::invalid_argument, "no GGUF file given");
    if (paths.size() > limits.max_files)
        return make_error(ErrorKind::limit, fmt::format("{} files, over the limit of {}",
                                                        paths.size(), limits.max_files));
    std::vector<ParsedFile> files;
    auto first = parse_path(paths[0], limits, parse_gguf_file);
    if (!first) return std::move(first).error();
    if (paths.size() == 1) {
        auto all = expand_first_shard(*first, limits);
        if (!all) return std::move(all).error();
        files.push_back(std::move(first).value());
        for (std::size_t i = 1; i < all->size(); ++i) {
            auto f = parse_path((*all)[i], limits, parse_gguf_file);
            if (!f) return std::move(f).error();
            files.push_back(std::move(f).value());
        }
    } else {
        files.push_back(std::move(first).value());
        for (std::size_t i = 1; i < paths.size(); ++i) {
            auto f = parse_path(paths[i], limits, parse_gguf_file);
            if (!f) return std::move(f).error();
            files.push_back(std::move(f).value());
        }
    }
    if (Status s = order_shards(files); !s) return std::move(s).error();
    return assemble(std::move(files));
}

} // namespace
} // namespace formats

// bad_alloc (a header's counts are bounded by ReadLimits, not by the memory left) is an error.
Result<ModelInfo> read_gguf(Span<const std::string> paths, const ReadLimits& limits) {
    return internal::result_nothrow([&] { return formats::read_gguf_files(paths, limits); });
}

Result<ModelInfo> parse_gguf(Span<const std::byte> head, std::uint64_t file_size,
                             std::string_view path, const ReadLimits& limits) {
    return formats::parse_memory(head, file_size, path, limits, &formats::parse_gguf_file);
}

} // namespace wm
