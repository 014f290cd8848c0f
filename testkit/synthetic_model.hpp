// SPDX-License-Identifier: MIT
// GGUF layouts shaped like real llama.cpp models (dense or MoE, any size), for wm-gen-model and
// the tests: llama.cpp's tensor names, Q4_K/Q6_K weights with F32 norms, shapes whose byte sizes
// come from the same type table the reader uses, and a tokenizer array the reader must skip.
#pragma once

#include <cstdint>
#include <string>

#include "testkit/gguf_writer.hpp"

namespace wm::testkit {

struct SyntheticModelOptions {
    enum class Shape { dense, moe };
    Shape shape = Shape::moe;
    std::uint32_t layers = 4;
    std::uint32_t experts = 8;          ///< moe only
    std::uint32_t experts_used = 2;     ///< moe only
    /// Approximate total tensor bytes: the largest width whose model fits, or the smallest
    /// width when even that is bigger.
    std::uint64_t target_bytes = std::uint64_t{64} << 20;
    std::uint32_t vocab = 32000;
    std::uint64_t alignment = 32;
    std::uint32_t version = 3;
    bool shuffle_infos = false;         ///< tensor infos in a seeded random order
    std::uint64_t seed = 1;
    bool tokenizer = true;              ///< tokenizer.ggml.tokens/token_type arrays of `vocab`
};

struct SyntheticModel {
    GgufSpec spec;
    std::string architecture;           ///< "llama" (dense) or "qwen3moe"
    std::uint64_t n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 128;
    std::uint64_t tensor_bytes = 0;     ///< sum of tensor sizes (padding excluded)
};

SyntheticModel make_synthetic_model(const SyntheticModelOptions& options);

} // namespace wm::testkit
