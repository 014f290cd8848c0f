// SPDX-License-Identifier: MIT
// The ggml and safetensors type tables: how many bytes a tensor of a type and shape takes.
#include <algorithm>
#include <array>
#include <limits>

#include <fmt/format.h>

#include "formats/byte_reader.hpp"
#include "weightmap/formats.hpp"

namespace wm {
namespace {

constexpr std::uint32_t QK_K = 256;

// ggml.h's enum ggml_type and the block structs of ggml-common.h (static_assert'ed sizes there).
// Ids 4, 5 (Q4_2, Q4_3), 31-33 (Q4_0_4_4 ...) and 36-38 (IQ4_NL_4_4 ...) were removed from ggml.
constexpr std::array<GgmlType, 34> ggml_table{{
    {"F32", 0, 1, 4},
    {"F16", 1, 1, 2},
    {"Q4_0", 2, 32, 2 + 16},
    {"Q4_1", 3, 32, 2 + 2 + 16},
    {"Q5_0", 6, 32, 2 + 4 + 16},
    {"Q5_1", 7, 32, 2 + 2 + 4 + 16},
    {"Q8_0", 8, 32, 2 + 32},
    {"Q8_1", 9, 32, 2 + 2 + 32},
    {"Q2_K", 10, QK_K, 2 + 2 + QK_K / 16 + QK_K / 4},             // 84
    {"Q3_K", 11, QK_K, QK_K / 8 + QK_K / 4 + 12 + 2},             // 110
    {"Q4_K", 12, QK_K, 2 + 2 + 12 + QK_K / 2},                    // 144
    {"Q5_K", 13, QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2},         // 176
    {"Q6_K", 14, QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2},      // 210
    {"Q8_K", 15, QK_K, 4 + QK_K + QK_K / 16 * 2},                 // 292
    {"IQ2_XXS", 16, QK_K, 2 + QK_K / 8 * 2},                      // 66
    {"IQ2_XS", 17, QK_K, 2 + QK_K / 8 * 2 + QK_K / 32},           // 74
    {"IQ3_XXS", 18, QK_K, 2 + 3 * QK_K / 8},                      // 98
    {"IQ1_S", 19, QK_K, 2 + QK_K / 8 + QK_K / 32 * 2},            // 50
    {"IQ4_NL", 20, 32, 2 + 16},
    {"IQ3_S", 21, QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64}, // 110
    {"IQ2_S", 22, QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 32},   // 82
    {"IQ4_XS", 23, QK_K, 2 + 2 + QK_K / 64 + QK_K / 2},           // 136
    {"I8", 24, 1, 1},
    {"I16", 25, 1, 2},
    {"I32", 26, 1, 4},
    {"I64", 27, 1, 8},
    {"F64", 28, 1, 8},
    {"IQ1_M", 29, QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32},        // 56
    {"BF16", 30, 1, 2},
    {"TQ1_0", 34, QK_K, (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + 2}, // 54
    {"TQ2_0", 35, QK_K, QK_K / 4 + 2},                            // 66
    {"MXFP4", 39, 32, 1 + 16},
    {"NVFP4", 40, 64, 4 + 32},                                    // 4 E4M3 scales + 64 x 4 bit
    {"Q1_0", 41, 128, 2 + 128 / 8},
}};

constexpr std::array<SafetensorsDtype, 22> safetensors_table{{
    {"BOOL", 8},     {"F4", 4},       {"F6_E2M3", 6},     {"F6_E3M2", 6},
    {"U8", 8},       {"I8", 8},       {"F8_E5M2", 8},     {"F8_E4M3", 8},
    {"F8_E8M0", 8},  {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
    {"U16", 16},     {"F16", 16},     {"BF16", 16},       {"I32", 32},
    {"U32", 32},     {"F32", 32},     {"C64", 64},        {"F64", 64},
    {"I64", 64},     {"U64", 64},
}};

} // namespace

const char* to_string(ModelFormat format) noexcept {
    return format == ModelFormat::gguf ? "gguf" : "safetensors";
}

Span<const GgmlType> ggml_types() noexcept { return ggml_table; }

const GgmlType* find_ggml_type(std::uint32_t id) noexcept {
    for (const GgmlType& t : ggml_table)
        if (t.id == id) return &t;
    return nullptr;
}

const GgmlType* find_ggml_type(std::string_view name) noexcept {
    for (const GgmlType& t : ggml_table)
        if (t.name == name) return &t;
    return nullptr;
}

Result<std::uint64_t> ggml_tensor_bytes(std::uint32_t type, Span<const std::uint64_t> ne) {
    const GgmlType* t = find_ggml_type(type);
    if (t == nullptr)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("unknown ggml type id {}", type));
    if (ne.size() > 4)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} dimensions, ggml has at most 4", ne.size()));
    constexpr auto int64_max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    for (std::size_t i = 0; i < ne.size(); ++i)
        if (ne[i] > int64_max)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("ne[{}] = {} is above INT64_MAX", i, ne[i]));
    // A 0-dimensional GGUF tensor is a scalar, as ggml treats missing dimensions as 1.
    const std::uint64_t row = ne.empty() ? 1 : ne[0];
    if (row % t->block_size != 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("ne[0] = {} is not a multiple of the {} block size {}", row,
                                      t->name, t->block_size));
    std::uint64_t bytes = 0;
    if (formats::mul_overflows(row / t->block_size, t->type_size, bytes))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("row of {} {} elements overflows 64 bits", row, t->name));
    for (std::size_t i = 1; i < ne.size(); ++i)
        if (formats::mul_overflows(bytes, ne[i], bytes))
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("byte size of shape [{}] overflows 64 bits",
                                          fmt::join(ne, ", ")));
    return bytes;
}

Span<const SafetensorsDtype> safetensors_dtypes() noexcept { return safetensors_table; }

const SafetensorsDtype* find_safetensors_dtype(std::string_view name) noexcept {
    for (const SafetensorsDtype& d : safetensors_table)
        if (d.name == name) return &d;
    return nullptr;
}

Result<std::uint64_t> safetensors_tensor_bytes(std::string_view dtype,
                                               Span<const std::uint64_t> shape) {
    const SafetensorsDtype* d = find_safetensors_dtype(dtype);
    if (d == nullptr)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("unknown dtype {}", formats::quote_name(dtype)));
    std::uint64_t elements = 1;
    for (std::uint64_t dim : shape)
        if (formats::mul_overflows(elements, dim, elements))
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("element count of shape [{}] overflows 64 bits",
                                          fmt::join(shape, ", ")));
    std::uint64_t bits = 0;
    if (formats::mul_overflows(elements, d->bits, bits))
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} elements of {} overflow 64 bits", elements, d->name));
    if (bits % 8 != 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{} elements of the {}-bit {} are not a whole number of "
                                      "bytes", elements, d->bits, d->name));
    return bits / 8;
}

} // namespace wm
