// SPDX-License-Identifier: MIT
// Small valid models the format tests start from, and the fuzz seeds are made of.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "testkit/gguf_writer.hpp"
#include "testkit/safetensors_writer.hpp"

namespace wm::test {

/// A few tensors (F32, F16, Q8_0, Q4_K) and metadata of every value type, nested arrays included.
testkit::GgufSpec small_gguf_spec(std::uint32_t version = 3, std::uint64_t alignment = 32);

/// One tensor of every ggml type, each of one block (two rows for the 1-element types).
testkit::GgufSpec every_type_gguf_spec(std::uint32_t version = 3, std::uint64_t alignment = 32);

/// One tensor of every safetensors dtype, with __metadata__.
testkit::SafetensorsSpec every_dtype_safetensors_spec();

/// The fuzz seeds: (file name, bytes), each a valid file of a few KiB at most. The names have
/// no extension: .gitignore ignores *.gguf and *.safetensors, and libFuzzer needs none.
std::vector<std::pair<std::string, std::vector<std::byte>>> gguf_fuzz_seeds();
std::vector<std::pair<std::string, std::vector<std::byte>>> safetensors_fuzz_seeds();

} // namespace wm::test
