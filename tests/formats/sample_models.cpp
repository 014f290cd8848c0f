// SPDX-License-Identifier: MIT
#include "formats/sample_models.hpp"

#include <stdexcept>

#include "weightmap/formats.hpp"

namespace wm::test {

using testkit::GgufSpec;
using testkit::GgufType;
using testkit::GgufValue;

namespace {

std::vector<testkit::GgufKv> every_value_type() {
    std::vector<GgufValue> strings = {GgufValue::string("a"), GgufValue::string(""),
                                      GgufValue::string("tokens \xe2\x96\x81 here")};
    std::vector<GgufValue> inner = {GgufValue::u8(1), GgufValue::u8(2)};
    std::vector<GgufValue> nested = {GgufValue::array(GgufType::u8, inner),
                                     GgufValue::array(GgufType::u8, {})};
    return {
        {"general.architecture", GgufValue::string("llama")},
        {"general.name", GgufValue::string("small")},
        {"test.u8", GgufValue::u8(200)},
        {"test.i8", GgufValue::i8(-5)},
        {"test.u16", GgufValue::u16(60000)},
        {"test.i16", GgufValue::i16(-300)},
        {"test.u32", GgufValue::u32(4000000000u)},
        {"test.i32", GgufValue::i32(-7)},
        {"test.f32", GgufValue::f32(1.5f)},
        {"test.bool", GgufValue::boolean(true)},
        {"test.u64", GgufValue::u64(1ull << 40)},
        {"test.i64", GgufValue::i64(-(1ll << 40))},
        {"test.f64", GgufValue::f64(2.25)},
        {"test.strings", GgufValue::array(GgufType::string, strings)},
        {"test.floats", GgufValue::array(GgufType::f32, {GgufValue::f32(0.5f), GgufValue::f32(1)})},
        {"test.nested", GgufValue::array(GgufType::array, nested)},
    };
}

} // namespace

GgufSpec small_gguf_spec(std::uint32_t version, std::uint64_t alignment) {
    GgufSpec spec;
    spec.version = version;
    spec.alignment = alignment;
    spec.metadata = every_value_type();
    spec.tensors = {
        {"token_embd.weight", 8, {32, 2}, {}},        // Q8_0
        {"blk.0.attn_norm.weight", 0, {8}, {}},       // F32
        {"blk.0.attn_q.weight", 12, {256, 1}, {}},    // Q4_K
        {"blk.0.ffn_up_exps.weight", 1, {4, 2, 2}, {}}, // F16
        {"output.weight", 14, {256}, {}},             // Q6_K
    };
    return spec;
}

GgufSpec every_type_gguf_spec(std::uint32_t version, std::uint64_t alignment) {
    GgufSpec spec;
    spec.version = version;
    spec.alignment = alignment;
    spec.metadata = {{"general.architecture", GgufValue::string("every-type")}};
    for (const GgmlType& t : ggml_types()) {
        std::vector<std::uint64_t> ne = {t.block_size};
        if (t.block_size == 1) ne.push_back(3);
        spec.tensors.push_back({"t." + std::string(t.name), t.id, ne, {}});
    }
    return spec;
}

testkit::SafetensorsSpec every_dtype_safetensors_spec() {
    testkit::SafetensorsSpec spec;
    spec.metadata = {{"format", "pt"}, {"note", "every dtype"}};
    for (const SafetensorsDtype& d : safetensors_dtypes()) {
        // 8 elements: a whole number of bytes for the 4- and 6-bit types too.
        spec.tensors.push_back({"t." + std::string(d.name), std::string(d.name), {2, 4}, {}});
    }
    spec.tensors.push_back({"scalar", "F32", {}, {}});
    return spec;
}

std::vector<std::pair<std::string, std::vector<std::byte>>> gguf_fuzz_seeds() {
    auto bytes = [](const GgufSpec& spec) {
        auto b = testkit::gguf_bytes(spec);
        if (!b) throw std::runtime_error(b.error().message);
        return std::move(b).value();
    };
    GgufSpec unsorted = small_gguf_spec();
    unsorted.info_order = {4, 2, 0, 3, 1};
    GgufSpec split = small_gguf_spec(3, 32);
    split.metadata.push_back({"split.no", GgufValue::u16(0)});
    split.metadata.push_back({"split.count", GgufValue::u16(1)});
    split.metadata.push_back({"split.tensors.count", GgufValue::i32(5)});
    GgufSpec empty;
    empty.metadata = {{"general.architecture", GgufValue::string("none")}};
    return {
        {"small_v3_a32", bytes(small_gguf_spec(3, 32))},
        {"small_v2_a64", bytes(small_gguf_spec(2, 64))},
        {"unsorted_infos", bytes(unsorted)},
        {"split_keys", bytes(split)},
        {"no_tensors", bytes(empty)},
        {"every_type", bytes(every_type_gguf_spec(3, 32))},
    };
}

std::vector<std::pair<std::string, std::vector<std::byte>>> safetensors_fuzz_seeds() {
    testkit::SafetensorsSpec small;
    small.tensors = {{"model.embed_tokens.weight", "BF16", {4, 2}, {}},
                     {"model.layers.0.mlp.experts.0.up_proj.weight", "F8_E4M3", {2, 2}, {}},
                     {"model.norm.weight", "F32", {2}, {}}};
    testkit::SafetensorsSpec empty;
    return {
        {"every_dtype", testkit::safetensors_bytes(every_dtype_safetensors_spec())},
        {"small", testkit::safetensors_bytes(small)},
        {"empty", testkit::safetensors_bytes(empty)},
        {"unknown_key",
         testkit::safetensors_bytes_from_header(
             R"({"w":{"dtype":"U8","shape":[3],"data_offsets":[0,3],"extra":{"k":[1,2]}},)"
             R"("__metadata__":{"a":"b"}})", 3)},
    };
}

} // namespace wm::test
