// SPDX-License-Identifier: MIT
// Untrusted model files: a table of corrupt GGUF and safetensors files, each of which must give
// its own error (kind, and a message naming the file, the byte and the field) - never a crash,
// a hang or a huge allocation. Then sweeps: every truncation of a valid file, and single-byte
// corruptions of every header byte, must each give an error or a model that keeps every promise.
#include <catch2/catch.hpp>

#include <functional>

#include "formats/model_invariants.hpp"
#include "formats/sample_models.hpp"
#include "support/temp_file.hpp"
#include "weightmap/formats.hpp"

using namespace wm;
using namespace wm::testkit;

namespace {

using Bytes = std::vector<std::byte>;

void put_le(Bytes& b, std::uint64_t pos, std::uint64_t v, std::size_t n) {
    REQUIRE(pos + n <= b.size());
    for (std::size_t i = 0; i < n; ++i) b[pos + i] = static_cast<std::byte>(v >> (8 * i));
}

struct Case {
    const char* name;
    std::function<Bytes()> make;
    ErrorKind kind;
    const char* field;   // must appear in the message
    const char* message; // must appear in the message
};

// Valid small GGUF, its layout, then a mutation.
Bytes gguf(const GgufSpec& spec,
           const std::function<void(Bytes&, const GgufLayout&)>& mutate = {}) {
    GgufLayout layout;
    auto bytes = gguf_bytes(spec, &layout);
    REQUIRE(bytes);
    if (mutate) mutate(*bytes, layout);
    return std::move(bytes).value();
}

GgufSpec base() { return wm::test::small_gguf_spec(3, 32); }

GgufSpec with_tensor(GgufTensorSpec t) {
    GgufSpec s = base();
    s.tensors.push_back(std::move(t));
    return s;
}

GgufSpec with_kv(std::string key, GgufValue v) {
    GgufSpec s = base();
    s.metadata.push_back({std::move(key), std::move(v)});
    return s;
}

GgufValue nested(int depth) {
    GgufValue v = GgufValue::array(GgufType::u8, {GgufValue::u8(1)});
    for (int i = 0; i < depth; ++i) v = GgufValue::array(GgufType::array, {v});
    return v;
}

// Index of the metadata entry `key` in the layout (the writer adds no alignment key at 32).
std::size_t kv_index(const std::string& key) {
    const GgufSpec s = base();
    for (std::size_t i = 0; i < s.metadata.size(); ++i)
        if (s.metadata[i].key == key) return i;
    FAIL("no key " << key);
    return 0;
}

Bytes st(const std::string& header, std::uint64_t data = 64) {
    return safetensors_bytes_from_header(header, data);
}

constexpr std::uint64_t big = std::uint64_t{1} << 40;

const std::vector<Case>& gguf_cases() {
    static const std::vector<Case> cases = {
        {"empty file", [] { return Bytes{}; }, ErrorKind::format, "magic", "truncated"},
        {"wrong magic", [] { return gguf(base(), [](Bytes& b, auto&) { b[0] = std::byte{'X'}; }); },
         ErrorKind::format, "magic", "not a GGUF file"},
        {"version 1", [] { return gguf(base(), [](Bytes& b, auto&) { put_le(b, 4, 1, 4); }); },
         ErrorKind::format, "version", "v1"},
        {"version 4", [] { return gguf(base(), [](Bytes& b, auto&) { put_le(b, 4, 4, 4); }); },
         ErrorKind::format, "version", "unsupported version 4"},
        {"big-endian",
         [] { return gguf(base(), [](Bytes& b, auto&) { put_le(b, 4, 3u << 24, 4); }); },
         ErrorKind::format, "version", "big-endian"},
        {"truncated in the version",
         [] { return gguf(base(), [](Bytes& b, auto&) { b.resize(6); }); }, ErrorKind::format,
         "version", "truncated"},
        {"tensor count over the limit",
         [] { return gguf(base(), [](Bytes& b, auto&) { put_le(b, 8, big, 8); }); },
         ErrorKind::limit, "tensor_count", "over the limit"},
        {"tensor count the file cannot hold",
         [] { return gguf(base(), [](Bytes& b, auto&) { put_le(b, 8, 100000, 8); }); },
         ErrorKind::format, "tensor_count", "need at least"},
        {"metadata count over the limit",
         [] { return gguf(base(), [](Bytes& b, auto&) { put_le(b, 16, ~std::uint64_t{0}, 8); }); },
         ErrorKind::limit, "metadata_kv_count", "over the limit"},
        {"key length over the limit",
         [] {
             return gguf(base(),
                         [](Bytes& b, const GgufLayout& l) { put_le(b, l.kv_key[0], big, 8); });
         },
         ErrorKind::limit, "metadata[0].key", "over the limit"},
        {"key length past the end",
         [] {
             return gguf(base(),
                         [](Bytes& b, const GgufLayout& l) { put_le(b, l.kv_key[0], 60000, 8); });
         },
         ErrorKind::format, "metadata[0].key", "only"},
        {"unknown value type",
         [] {
             return gguf(base(), [](Bytes& b, const GgufLayout& l) {
                 put_le(b, l.kv_value[2] - 4, 13, 4);
             });
         },
         ErrorKind::format, "'test.u8'", "unknown value type 13"},
        {"string value longer than the file",
         [] {
             return gguf(base(), [](Bytes& b, const GgufLayout& l) {
                 put_le(b, l.kv_value[kv_index("general.name")], big, 8);
             });
         },
         ErrorKind::format, "'general.name'", "truncated"},
        {"array count the file cannot hold",
         [] {
             return gguf(base(), [](Bytes& b, const GgufLayout& l) {
                 put_le(b, l.kv_value[kv_index("test.strings")] + 4, big, 8);
             });
         },
         ErrorKind::format, "'test.strings'", "array of 1099511627776 string elements"},
        {"array of an unknown element type",
         [] {
             return gguf(base(), [](Bytes& b, const GgufLayout& l) {
                 put_le(b, l.kv_value[kv_index("test.floats")], 77, 4);
             });
         },
         ErrorKind::format, "'test.floats'", "unknown value type 77"},
        {"arrays nested too deep", [] { return gguf(with_kv("deep", nested(9))); },
         ErrorKind::limit, "'deep'", "nested more than 8"},
        {"duplicate key", [] { return gguf(with_kv("test.u8", GgufValue::u8(1))); },
         ErrorKind::format, "'test.u8'", "duplicate key"},
        {"alignment not a power of two",
         [] { return gguf(with_kv("general.alignment", GgufValue::u32(48))); }, ErrorKind::format,
         "'general.alignment'", "not a power of two"},
        {"alignment zero", [] { return gguf(with_kv("general.alignment", GgufValue::u32(0))); },
         ErrorKind::format, "'general.alignment'", "not a power of two"},
        {"alignment of the wrong type",
         [] { return gguf(with_kv("general.alignment", GgufValue::string("32"))); },
         ErrorKind::format, "'general.alignment'", "must be an integer, found string"},
        {"negative split.count", [] { return gguf(with_kv("split.count", GgufValue::i16(-1))); },
         ErrorKind::format, "'split.count'", "must not be negative"},
        {"split.no not below split.count",
         [] {
             GgufSpec s = base();
             s.metadata.push_back({"split.count", GgufValue::u16(2)});
             s.metadata.push_back({"split.no", GgufValue::u16(2)});
             return gguf(s);
         },
         ErrorKind::format, "split.no", "not below split.count 2"},
        {"architecture not a string",
         [] {
             GgufSpec s = base();
             s.metadata[0].value = GgufValue::u32(1);
             return gguf(s);
         },
         ErrorKind::format, "'general.architecture'", "must be a string"},
        {"tensor name past the end",
         [] {
             return gguf(base(),
                         [](Bytes& b, const GgufLayout& l) { put_le(b, l.info[4].name, 1000, 8); });
         },
         ErrorKind::format, "tensor_infos[4].name", "only"},
        {"tensor name over the limit",
         [] {
             return gguf(with_tensor({std::string(1025, 'n'), 0, {1}, {}}));
         },
         ErrorKind::limit, "tensor_infos[5].name", "over the limit of 1024"},
        {"duplicate tensor name",
         [] {
             return gguf(with_tensor({"output.weight", 0, {1}, {}}));
         },
         ErrorKind::format, "tensor_infos[5].name", "duplicate tensor name 'output.weight'"},
        {"five dimensions",
         [] {
             return gguf(with_tensor({"t5", 0, {1, 1, 1, 1, 1}, {}}));
         },
         ErrorKind::format, "'t5'.n_dims", "5 dimensions, ggml has at most 4"},
        {"unknown type id",
         [] {
             return gguf(with_tensor({"mystery", 99, {32}, {}}));
         },
         ErrorKind::format, "'mystery'.type", "unknown ggml type id 99"},
        {"removed type id",
         [] {
             return gguf(with_tensor({"old", 31, {32}, {}}));
         },
         ErrorKind::format, "'old'.type", "type id 31 (Q4_0_4_4) was removed"},
        {"row not a multiple of the block",
         [] {
             return gguf(with_tensor({"odd", 12, {100}, {}}));
         },
         ErrorKind::format, "'odd'.ne", "not a multiple of the Q4_K block size 256"},
        {"dimension product overflows",
         [] {
             return gguf(with_tensor({"wide", 0, {1u << 31, 1u << 31, 1u << 31, 2}, {}}));
         },
         ErrorKind::format, "'wide'.ne", "overflows 64 bits"},
        {"dimension above INT64_MAX",
         [] {
             return gguf(with_tensor({"neg", 0, {std::uint64_t{1} << 63}, {}}));
         },
         ErrorKind::format, "'neg'.ne", "above INT64_MAX"},
        {"offset not aligned",
         [] {
             return gguf(base(),
                         [](Bytes& b, const GgufLayout& l) { put_le(b, l.info[1].offset, 1, 8); });
         },
         ErrorKind::format, "'blk.0.attn_norm.weight'.offset",
         "not a multiple of the alignment 32"},
        {"tensors overlapping exactly",
         [] {
             GgufSpec s = base();
             s.tensors[1].offset = 0; // where tensor 0 is
             return gguf(s);
         },
         ErrorKind::format, "offset", "overlaps tensor"},
        {"tensors overlapping partly",
         [] {
             GgufLayout l;
             REQUIRE(gguf_bytes(base(), &l));
             GgufSpec s = base();
             s.tensors[3].offset = l.offsets[2] - l.data_offset + 32; // inside the Q4_K tensor
             return gguf(s);
         },
         ErrorKind::format, "offset", "overlaps tensor"},
        {"offset past the end of the file",
         [] {
             return gguf(base(), [](Bytes& b, const GgufLayout& l) {
                 put_le(b, l.info[4].offset, 1 << 20, 8);
             });
         },
         ErrorKind::format, "tensor_infos[4].offset", "ends past the end of the file"},
        {"offset that wraps around",
         [] {
             return gguf(base(), [](Bytes& b, const GgufLayout& l) {
                 put_le(b, l.info[0].offset, ~std::uint64_t{31}, 8);
             });
         },
         ErrorKind::format, "tensor_infos[0].offset", "overflows 64 bits"},
        {"data section past the end",
         [] {
             return gguf(wm::test::small_gguf_spec(3, 4096),
                         [](Bytes& b, const GgufLayout& l) { b.resize(l.infos_end + 1); });
         },
         ErrorKind::format, "data section", "past the end of the file"},
        {"last tensor cut short",
         [] {
             return gguf(base(),
                         [](Bytes& b, const GgufLayout& l) { b.resize(l.offsets[4] + 100); });
         },
         ErrorKind::format, "tensor_infos[4].offset", "ends past the end of the file"},
    };
    return cases;
}

const std::vector<Case>& safetensors_cases() {
    const char* ok = R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
    static const std::vector<Case> cases = {
        {"shorter than the length", [] { return Bytes(5); }, ErrorKind::format, "header_length",
         "truncated"},
        {"header length past the end",
         [] {
             Bytes b = st("{}");
             put_le(b, 0, 1000, 8);
             return b;
         },
         ErrorKind::format, "header_length", "only 66 remain"},
        {"header length over the limit",
         [] {
             Bytes b = st("{}");
             put_le(b, 0, ~std::uint64_t{0}, 8);
             return b;
         },
         ErrorKind::limit, "header_length", "over the limit"},
        {"not an object", [] { return st("[1,2]"); }, ErrorKind::format, "header",
         "must start with '{'"},
        {"malformed JSON", [] { return st(R"({"a":)"); }, ErrorKind::format, "header",
         "malformed JSON"},
        {"trailing garbage", [] { return st("{} x"); }, ErrorKind::format, "header",
         "malformed JSON"},
        {"NUL after the JSON (other parsers stop there, or refuse)",
         [] { return st(std::string("{}\0{\"w\":1}", 9)); }, ErrorKind::format, "header",
         "NUL byte"},
        {"invalid UTF-8", [] { return st("{\"\xff\":1}"); }, ErrorKind::format, "header",
         "malformed JSON"},
        {"tensor not an object", [] { return st(R"({"w":5})"); }, ErrorKind::format, "header",
         "tensor 'w': must be an object, found a number"},
        {"missing dtype", [] { return st(R"({"w":{"shape":[1],"data_offsets":[0,1]}})"); },
         ErrorKind::format, "header", "tensor 'w': no 'dtype'"},
        {"missing data_offsets", [] { return st(R"({"w":{"dtype":"U8","shape":[1]}})"); },
         ErrorKind::format, "header", "no 'data_offsets'"},
        {"dtype not a string",
         [] { return st(R"({"w":{"dtype":8,"shape":[1],"data_offsets":[0,1]}})"); },
         ErrorKind::format, "header", "'dtype' must be a string"},
        {"unknown dtype",
         [] { return st(R"({"w":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})"); },
         ErrorKind::format, "header 'w'", "unknown dtype 'F7'"},
        {"negative dimension",
         [] { return st(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})"); },
         ErrorKind::format, "header", "found a negative number"},
        {"fractional dimension",
         [] { return st(R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})"); },
         ErrorKind::format, "header", "not an unsigned 64-bit integer"},
        {"dimension above 2^64",
         [] {
             return st(
                 R"({"w":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]}})");
         },
         ErrorKind::format, "header", "not an unsigned 64-bit integer"},
        {"three data offsets",
         [] { return st(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})"); },
         ErrorKind::format, "header", "data_offsets has 3 entries, not 2"},
        {"offsets ending before they begin",
         [] { return st(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})"); },
         ErrorKind::format, "header 'w'", "end before they begin"},
        {"offsets that disagree with the shape",
         [] { return st(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})"); },
         ErrorKind::format, "header 'w'", "hold 4 bytes, but F32 of shape [2] takes 8"},
        {"shape product overflows",
         [] {
             return st(
                 R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})");
         },
         ErrorKind::format, "header 'w'", "overflows 64 bits"},
        {"packed type not in whole bytes",
         [] { return st(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})"); },
         ErrorKind::format, "header 'w'", "not a whole number of bytes"},
        {"tensor past the end of the file",
         [] { return st(R"({"w":{"dtype":"U8","shape":[100],"data_offsets":[0,100]}})", 64); },
         ErrorKind::format, "'w'.data_offsets", "ends past the end of the file"},
        {"data offset above 2^64",
         [] {
             return st(R"({"w":{"dtype":"U8","shape":[4],)"
                       R"("data_offsets":[18446744073709551612,18446744073709551616]}})");
         },
         ErrorKind::format, "header", "not an unsigned 64-bit integer"},
        {"offset past 2^64 once the header is added",
         [] {
             return st(R"({"w":{"dtype":"U8","shape":[0],)"
                       R"("data_offsets":[18446744073709551615,18446744073709551615]}})");
         },
         ErrorKind::format, "header 'w'", "overflows 64 bits"},
        {"overlapping tensors",
         [ok] {
             return st(std::string(R"({"a":)") + ok +
                       R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})");
         },
         ErrorKind::format, "'b'.data_offsets", "overlaps tensor 'a'"},
        {"duplicate tensor",
         [ok] { return st(std::string(R"({"a":)") + ok + R"(,"a":)" + ok + "}"); },
         ErrorKind::format, "header", "duplicate tensor name 'a'"},
        {"duplicate field",
         [] { return st(R"({"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})"); },
         ErrorKind::format, "header", "duplicate key 'dtype'"},
        {"metadata nested too deep",
         [] {
             return st(R"({"__metadata__":)" + std::string(100, '[') + std::string(100, ']') + "}");
         },
         ErrorKind::limit, "header", "nested more than 64 deep"},
        {"shape of too many dimensions",
         [] {
             std::string shape = "[1";
             for (int i = 0; i < 64; ++i) shape += ",1";
             return st(R"({"w":{"dtype":"U8","shape":)" + shape + R"(],"data_offsets":[0,1]}})");
         },
         ErrorKind::limit, "header", "more than 64 entries"},
        {"tensor name over the limit",
         [ok] { return st("{\"" + std::string(1025, 'n') + "\":" + ok + "}"); }, ErrorKind::limit,
         "header", "over the limit of 1024"},
    };
    return cases;
}

void check_case(const Case& c, bool is_gguf) {
    INFO(c.name);
    const Bytes bytes = c.make();
    auto r = is_gguf ? parse_gguf(bytes, bytes.size(), "bad.model")
                     : parse_safetensors(bytes, bytes.size(), "bad.model");
    REQUIRE_FALSE(r);
    INFO(r.error().message);
    CHECK(r.error().kind == c.kind);
    CHECK_THAT(r.error().message, Catch::StartsWith("bad.model: byte "));
    CHECK_THAT(r.error().message, Catch::Contains(c.field));
    CHECK_THAT(r.error().message, Catch::Contains(c.message));
    CHECK(r.error().message.find('\n') == std::string::npos);
}

void check_promises(const Result<ModelInfo>& r) {
    if (r) {
        CHECK(wm::test::model_invariant_violation(*r).empty());
    } else {
        CHECK_FALSE(r.error().message.empty());
    }
}

} // namespace

TEST_CASE("corrupt GGUF files: each gives its own error") {
    for (const Case& c : gguf_cases()) check_case(c, true);
}

TEST_CASE("corrupt safetensors files: each gives its own error") {
    for (const Case& c : safetensors_cases()) check_case(c, false);
}

TEST_CASE("a corrupt file on disk is named in the error with its path") {
    wm::test::TempDir dir;
    const std::string path = dir.path() + "/corrupt.gguf";
    const Bytes bytes = gguf(with_tensor({"mystery", 99, {32}, {}}));
    {
        std::FILE* f = std::fopen(path.c_str(), "wb");
        REQUIRE(f != nullptr);
        REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
        std::fclose(f);
    }
    const std::string paths[] = {path};
    auto r = read_model(paths);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::StartsWith(path + ": byte "));
    CHECK_THAT(r.error().message, Catch::Contains("'mystery'.type: unknown ggml type id 99"));
}

TEST_CASE("a GGUF truncated anywhere is an error until every tensor is whole") {
    GgufLayout layout;
    auto full = gguf_bytes(wm::test::small_gguf_spec(3, 64), &layout);
    REQUIRE(full);
    std::uint64_t last_end = 0;
    for (std::size_t i = 0; i < layout.offsets.size(); ++i)
        last_end = std::max(last_end, layout.offsets[i] + layout.sizes[i]);
    REQUIRE(last_end < full->size()); // the writer pads the last tensor too
    for (std::size_t len = 0; len <= full->size(); ++len) {
        std::span<const std::byte> part(full->data(), len);
        auto r = parse_gguf(part, len, "t.gguf");
        if (len < last_end) {
            INFO("length " << len);
            REQUIRE_FALSE(r);
            CHECK(r.error().kind == ErrorKind::format);
        } else {
            REQUIRE(r);
            check_promises(r);
        }
    }
}

TEST_CASE("a safetensors file truncated anywhere is an error until every tensor is whole") {
    SafetensorsLayout layout;
    const Bytes full = safetensors_bytes(wm::test::every_dtype_safetensors_spec(), &layout);
    for (std::size_t len = 0; len <= full.size(); ++len) {
        auto r = parse_safetensors(std::span(full.data(), len), len, "t.safetensors");
        if (len < layout.file_size) {
            INFO("length " << len);
            REQUIRE_FALSE(r);
        } else {
            REQUIRE(r);
        }
    }
}

TEST_CASE("any single corrupted header byte gives an error or a model that keeps its promises") {
    GgufLayout layout;
    auto gguf_file = gguf_bytes(wm::test::small_gguf_spec(3, 32), &layout);
    REQUIRE(gguf_file);
    std::size_t gguf_ok = 0, gguf_err = 0;
    for (std::size_t pos = 0; pos < layout.data_offset; ++pos) {
        for (unsigned mask : {0x01u, 0x10u, 0x80u, 0xffu}) {
            Bytes b = *gguf_file;
            b[pos] ^= static_cast<std::byte>(mask);
            auto r = parse_gguf(b, b.size(), "flip.gguf");
            (r ? gguf_ok : gguf_err)++;
            check_promises(r);
        }
    }
    // Both outcomes happen: flips in skipped metadata values are harmless, in lengths fatal.
    CHECK(gguf_ok > 0);
    CHECK(gguf_err > 0);

    SafetensorsLayout st_layout;
    const Bytes st_file = safetensors_bytes(wm::test::every_dtype_safetensors_spec(), &st_layout);
    std::size_t st_ok = 0, st_err = 0;
    for (std::size_t pos = 0; pos < st_layout.data_offset; ++pos) {
        for (unsigned mask : {0x01u, 0x20u, 0x80u}) {
            Bytes b = st_file;
            b[pos] ^= static_cast<std::byte>(mask);
            auto r = parse_safetensors(b, b.size(), "flip.safetensors");
            (r ? st_ok : st_err)++;
            check_promises(r);
        }
    }
    CHECK(st_ok > 0);
    CHECK(st_err > 0);
}
