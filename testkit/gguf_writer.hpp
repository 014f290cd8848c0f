// SPDX-License-Identifier: MIT
// Writes GGUF files for the generator, the tests and the fuzz seeds (not part of the installed
// library). It writes what it is told, including what a reader must refuse: unknown type ids,
// explicit overlapping offsets, any version; the layout it returns says where every field went,
// so a test can corrupt exactly one of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "weightmap/result.hpp"

namespace wm::testkit {

/// GGUF metadata value types (gguf.h's gguf_type).
enum class GgufType : std::uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8,
    array = 9, u64 = 10, i64 = 11, f64 = 12,
};

/// One metadata value. Scalars keep their little-endian bits in `bits`.
struct GgufValue {
    GgufType type = GgufType::u32;
    std::uint64_t bits = 0;
    std::string text;                     ///< type string
    GgufType element_type = GgufType::u8; ///< type array
    std::vector<GgufValue> elements;      ///< type array (arrays may nest)

    static GgufValue u8(std::uint8_t v) { return scalar(GgufType::u8, v); }
    static GgufValue i8(std::int8_t v) {
        return scalar(GgufType::i8, static_cast<std::uint8_t>(v));
    }
    static GgufValue u16(std::uint16_t v) { return scalar(GgufType::u16, v); }
    static GgufValue i16(std::int16_t v) {
        return scalar(GgufType::i16, static_cast<std::uint16_t>(v));
    }
    static GgufValue u32(std::uint32_t v) { return scalar(GgufType::u32, v); }
    static GgufValue i32(std::int32_t v) {
        return scalar(GgufType::i32, static_cast<std::uint32_t>(v));
    }
    static GgufValue u64(std::uint64_t v) { return scalar(GgufType::u64, v); }
    static GgufValue i64(std::int64_t v) {
        return scalar(GgufType::i64, static_cast<std::uint64_t>(v));
    }
    static GgufValue f32(float v);
    static GgufValue f64(double v);
    static GgufValue boolean(bool v) { return scalar(GgufType::boolean, v ? 1 : 0); }
    static GgufValue string(std::string v);
    static GgufValue array(GgufType element_type, std::vector<GgufValue> elements);
    static GgufValue scalar(GgufType type, std::uint64_t bits);
};

struct GgufKv {
    std::string key;
    GgufValue value;
};

struct GgufTensorSpec {
    std::string name;
    std::uint32_t type = 0;           ///< ggml type id; an unknown id is written as is (size 0)
    std::vector<std::uint64_t> ne;    ///< written as given, even past 4 dimensions
    /// Offset relative to the data section; default: packed in spec order, each tensor padded to
    /// the alignment as ggml writes them.
    std::optional<std::uint64_t> offset;
};

struct GgufSpec {
    std::uint32_t version = 3;
    std::uint64_t alignment = 32;     ///< layout alignment
    /// Write a general.alignment key (uint32, first): default when alignment != 32.
    std::optional<bool> alignment_key;
    std::vector<GgufKv> metadata;
    std::vector<GgufTensorSpec> tensors; ///< in data order
    /// Order of the tensor infos in the header (a permutation of tensor indices); empty: data
    /// order. Readers must not assume infos are sorted by offset.
    std::vector<std::size_t> info_order;
};

/// Where the writer put every field (absolute byte positions) and every tensor.
struct GgufLayout {
    struct Info {
        std::uint64_t name = 0, n_dims = 0, ne = 0, type = 0, offset = 0;
    };
    std::vector<std::uint64_t> kv_key; ///< per metadata entry (the alignment key first if written)
    std::vector<std::uint64_t> kv_value;  ///< its value (after the type)
    std::vector<Info> info;               ///< per tensor, by spec index
    std::uint64_t infos_end = 0;          ///< end of the last tensor info
    std::uint64_t data_offset = 0;
    std::vector<std::uint64_t> offsets;   ///< absolute, by spec index
    std::vector<std::uint64_t> sizes;     ///< from the type table; 0 for an unknown type or shape
    std::uint64_t file_size = 0;          ///< data_offset + the last tensor's padded end
};

/// The layout of `spec`, and its header bytes [0, data_offset) with zero padding. Fails for an
/// alignment that is 0 or not a power of two, or an info_order that is not a permutation.
Result<GgufLayout> layout_gguf(const GgufSpec& spec, std::vector<std::byte>* header = nullptr);

/// The whole file in memory (small files: tests and seeds); data bytes are the pattern.
Result<std::vector<std::byte>> gguf_bytes(const GgufSpec& spec, GgufLayout* layout = nullptr);

enum class DataFill {
    pattern, ///< every data byte is model_pattern_byte(its absolute offset)
    sparse,  ///< header written, the rest a hole (ftruncate): instant, takes no disk
};

/// Writes `spec` to `path` (created or truncated).
Result<GgufLayout> write_gguf(const std::string& path, const GgufSpec& spec, DataFill fill);

/// A split GGUF as llama.cpp's gguf-split writes it.
struct GgufSplit {
    std::vector<std::string> paths;               ///< PREFIX-0000i-of-0000N.gguf
    std::vector<GgufLayout> layouts;
    std::vector<std::vector<std::size_t>> tensors; ///< spec tensor indices of each shard
};

/// Writes `spec` as `shards` files PREFIX-%05d-of-%05d.gguf: the tensors in data order, cut into
/// contiguous groups of about equal bytes; the first shard has the metadata, every shard
/// split.no (u16), split.count (u16) and split.tensors.count (i32), and general.alignment when
/// it is not 32. info_order is ignored.
Result<GgufSplit> write_gguf_split(const std::string& prefix, const GgufSpec& spec,
                                   std::uint32_t shards, DataFill fill);

/// PREFIX-%05d-of-%05d.gguf for shard `no` (1-based) of `count`.
std::string gguf_split_path(const std::string& prefix, std::uint32_t no, std::uint32_t count);

} // namespace wm::testkit
