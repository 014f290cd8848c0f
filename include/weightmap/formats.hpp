// SPDX-License-Identifier: MIT
// formats.hpp - where every tensor of a GGUF or safetensors model lies, read from the headers.
//
// The readers read headers only (pread, never a mapping, never a byte of tensor data), so the
// layout of a 19 GB model is known in milliseconds. Model files come from the internet and are
// untrusted: every count, length, dimension and offset is checked against the file size and for
// overflow before it is used or allocated for, and a tensor that ends past the end of its file
// or overlaps another is an error. Errors are ErrorKind::format (a malformed file), io (open,
// fstat, pread), limit (a ReadLimits cap) or invalid_argument (the caller's paths), with a
// one-line message "PATH: byte N: FIELD: what is wrong (numbers)". No exception crosses the API.
//
// Thread-safety: every function here is reentrant and keeps no state; call them from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weightmap/export.h"
#include "weightmap/result.hpp"
#include "weightmap/span.hpp"

namespace wm {

// --- the model ---------------------------------------------------------------------------------

enum class ModelFormat { gguf, safetensors };
/// "gguf" or "safetensors". Never null.
WM_API const char* to_string(ModelFormat format) noexcept;

/// One file of a model (a split GGUF or a sharded safetensors model has several).
struct ModelFile {
    std::string path;               ///< as given, or as found next to the first shard / index
    std::uint64_t size = 0;         ///< bytes, from fstat (or the size the caller stated)
    ModelFormat format = ModelFormat::gguf;
    std::uint32_t version = 0;      ///< GGUF: 2 or 3. safetensors: 0 (the format has none)
    /// GGUF: `general.alignment` or the default 32; every tensor offset is a multiple of it
    /// relative to data_offset. safetensors: 1 (the format aligns nothing).
    std::uint64_t alignment = 1;
    /// Absolute offset of the data section: GGUF: the end of the tensor infos rounded up to
    /// `alignment`; safetensors: 8 + the JSON header length. Tensor offsets are absolute, so an
    /// engine needs this only to cross-check.
    std::uint64_t data_offset = 0;
    std::uint64_t tensor_count = 0; ///< tensors of this file
    /// GGUF `split.no` / `split.count` when the file carries them (gguf-split shards), else 0.
    std::uint32_t split_no = 0;
    std::uint32_t split_count = 0;
};

/// One tensor as the file describes it.
struct TensorInfo {
    std::string name;               ///< as stored: bytes, not validated as UTF-8
    std::uint32_t file = 0;         ///< index into ModelInfo::files
    std::uint64_t offset = 0;       ///< absolute byte offset of the data in that file
    std::uint64_t size = 0;         ///< bytes, from the type and the shape
    /// GGUF: the ggml type name ("Q4_K", "F32", see ggml_types()); safetensors: the dtype
    /// ("BF16", see safetensors_dtypes()).
    std::string type;
    /// GGUF: ggml's ne[] order (ne[0], the contiguous row, first; at most 4). safetensors:
    /// row-major as in the header (the contiguous dimension last; may be empty: a scalar).
    std::vector<std::uint64_t> shape;
};

/// A whole model: its files and, in file order then header order, its tensors.
/// Guarantees of a ModelInfo returned by a reader: every tensor lies inside its file
/// (offset + size <= size, no overflow), at or after its file's data_offset; no two tensors of a
/// file overlap (zero-size tensors overlap nothing); tensor names are unique across all files;
/// GGUF offsets are multiples of the file's alignment relative to data_offset.
struct ModelInfo {
    std::vector<ModelFile> files;
    std::vector<TensorInfo> tensors;
    std::string architecture;       ///< GGUF `general.architecture` of the first file; else empty
};

/// Caps that keep a hostile file from making a reader allocate or loop without bound. Each is far
/// above what a real model needs; exceeding one is ErrorKind::limit naming the cap.
struct ReadLimits {
    std::uint64_t max_tensors = std::uint64_t{1} << 20;          ///< per file
    std::uint64_t max_metadata_entries = std::uint64_t{1} << 20; ///< GGUF key-value pairs per file
    std::uint32_t max_array_nesting = 8;       ///< GGUF arrays of arrays of ...
    std::uint64_t max_name_length = 1024;      ///< tensor names, in bytes
    std::uint64_t max_key_length = 65535;      ///< GGUF metadata keys, in bytes
    std::uint64_t max_json_bytes = std::uint64_t{100} << 20; ///< safetensors header, index.json
    std::uint32_t max_dims = 64;               ///< safetensors rank (GGUF: ggml's 4, always)
    std::uint32_t max_files = 4096;            ///< shards of one model
};

// --- reading -----------------------------------------------------------------------------------

/// Reads the model stored in `paths` and detects its format: a path ending in ".json" is a
/// safetensors index (model.safetensors.index.json; give it alone); otherwise a file starting with
/// "GGUF" is GGUF and one whose 9th byte is '{' is safetensors. One path that is the first shard
/// of a split GGUF (`split.count` > 1, named PREFIX-00001-of-0000N.gguf) expands to all N
/// shards; several paths are the shards of one model, given explicitly (all of one format).
/// Fails (invalid_argument) for no paths or mixed formats, otherwise as read_gguf /
/// read_safetensors do.
WM_API Result<ModelInfo> read_model(Span<const std::string> paths, const ReadLimits& limits = {});

/// GGUF v2 or v3, little-endian. One path: that file, or all N shards when it is the first shard
/// of a split (found by `split.count` and the file naming); several paths: the shards of one
/// model, in any order when they carry `split.no` (they are sorted by it and must be exactly
/// 0..N-1 of one `split.count`). Metadata is bounds-checked and skipped except
/// `general.alignment`, `general.architecture`, `split.count`, `split.no` and
/// `split.tensors.count`. Errors: a shard that is missing or not the first one, an unknown ggml
/// type (naming the tensor and the type id), a row not a multiple of its type's block, a shape
/// whose byte size overflows, a misaligned offset, and every case named in the file comment.
WM_API Result<ModelInfo> read_gguf(Span<const std::string> paths, const ReadLimits& limits = {});

/// safetensors: one or more .safetensors files (the shards of one model), or one
/// model.safetensors.index.json whose `weight_map` names the shards next to it (plain file names
/// only: a path with '/' is refused). `__metadata__` and unknown per-tensor keys are ignored.
/// Every tensor of the index must be in the shard it names, and every shard tensor in the index.
WM_API Result<ModelInfo> read_safetensors(Span<const std::string> paths,
                                   const ReadLimits& limits = {});

/// Parses one GGUF file from memory: `head` holds the file's first bytes (the header, or the
/// whole file), `file_size` is the size of the whole file, which tensors are checked against;
/// `path` is only used in messages and ModelFile::path. Needing a byte of the header past
/// `head` is a format error. This is what the fuzzers call. `file_size` < head.size() is
/// invalid_argument.
WM_API Result<ModelInfo> parse_gguf(Span<const std::byte> head, std::uint64_t file_size,
                             std::string_view path = "<memory>", const ReadLimits& limits = {});

/// Parses one safetensors file from memory; same contract as parse_gguf.
WM_API Result<ModelInfo> parse_safetensors(Span<const std::byte> head, std::uint64_t file_size,
                                    std::string_view path = "<memory>",
                                    const ReadLimits& limits = {});

// --- type tables -------------------------------------------------------------------------------

/// One ggml tensor type: `block_size` elements are stored in `type_size` bytes.
struct GgmlType {
    std::string_view name;    ///< "Q4_K", as ggml's type_name
    std::uint32_t id = 0;     ///< the id stored in GGUF tensor infos
    std::uint32_t block_size = 1;
    std::uint32_t type_size = 0;
};

/// Every ggml type GGUF files use today, by id (F32 ... MXFP4, NVFP4, Q1_0). Static storage.
WM_API Span<const GgmlType> ggml_types() noexcept;
/// The type with this id, or null (unknown or removed from ggml, such as 4, 5, 31-33, 36-38).
WM_API const GgmlType* find_ggml_type(std::uint32_t id) noexcept;
/// The type with this name (exact, e.g. "Q6_K"), or null.
WM_API const GgmlType* find_ggml_type(std::string_view name) noexcept;

/// Bytes of a tensor of ggml type `type` and shape `ne` (ggml order, at most 4 dimensions):
/// ne[0] / block_size * type_size * ne[1] * ne[2] * ne[3]. Errors (invalid_argument): an unknown
/// type, more than 4 dimensions, a dimension above INT64_MAX (ggml's int64_t), ne[0] not a
/// multiple of the block size, or a product that overflows 64 bits.
WM_API Result<std::uint64_t> ggml_tensor_bytes(std::uint32_t type, Span<const std::uint64_t> ne);

/// One safetensors dtype: `bits` per element (4 and 6 for the packed FP4/FP6 types).
struct SafetensorsDtype {
    std::string_view name;    ///< as in the header: "BF16", "F8_E4M3", ...
    std::uint32_t bits = 0;
};

/// Every dtype of the safetensors format (0.6: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2,
/// F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64,
/// I64, U64). Static storage.
WM_API Span<const SafetensorsDtype> safetensors_dtypes() noexcept;
/// The dtype with this name, or null.
WM_API const SafetensorsDtype* find_safetensors_dtype(std::string_view name) noexcept;

/// Bytes of a tensor of `dtype` and `shape` (an empty shape is a scalar): elements * bits / 8.
/// Errors (invalid_argument): an unknown dtype, a product that overflows, or a packed tensor
/// whose bits are not a whole number of bytes (as the safetensors library refuses it).
WM_API Result<std::uint64_t> safetensors_tensor_bytes(std::string_view dtype,
                                               Span<const std::uint64_t> shape);

} // namespace wm
