// SPDX-License-Identifier: MIT
// layouts.hpp - tensor layouts shaped like real GGUF models, for the planning benchmark and the
// planner's tests. Nothing is written: each layout is a ModelDesc whose offsets follow what
// llama.cpp's writer produces (tensor data aligned to 32 bytes after a metadata header) and whose
// sizes follow Q4_K_M (Q4_K, Q6_K for attn_v/ffn_down on the "more bits" layers and for
// output.weight, F32 norms and routers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "weightmap/model.hpp"

namespace wm::testkit {

/// Target indices of every layout: 0 is the device (an HSA-like importer: page alignment,
/// writable mapping, no size limit), 1 the CPU.
inline constexpr std::uint32_t device_target = 0;
inline constexpr std::uint32_t cpu_target = 1;

/// Where the weight tensors of one block sit relative to each other.
enum class BlockOrder {
    /// attn_norm, attn_q/k/v/output, q/k norms, ffn_norm, ffn_gate_inp, then the experts
    /// (gate, down, up): the device tensors of a block are contiguous.
    grouped,
    /// Tensor names sorted inside the block, as HF-converted files often are: attn_*, then
    /// ffn_down_exps, ffn_gate_exps, ffn_gate_inp, ffn_norm, ffn_up_exps. The router and
    /// ffn_norm sit between CPU experts, so a block has two device clusters.
    name_sorted,
};

struct Layout {
    std::string name;
    ModelDesc model;
    std::uint32_t layers = 0;
};

/// Qwen3-4B-like dense model, Q4_K_M, one file (~2.4 GiB), at -ngl 99: every tensor on the
/// device; token_embd also on the CPU (input embeddings stay there) while the tied output reads
/// the same bytes on the device.
Layout dense_4b();

/// Qwen3-30B-A3B-like MoE (48 layers, 128 experts, ~18.6 GB), Q4_K_M, `-ngl 99 -ot exps=CPU`:
/// the merged expert tensors and token_embd on the CPU, everything else on the device. `shards`
/// > 1 splits it like gguf-split, at tensor boundaries into files of about equal size.
Layout moe_30b_a3b(std::uint32_t shards = 1, BlockOrder order = BlockOrder::grouped);

/// Qwen3-235B-A22B-like MoE (94 layers, 128 experts, ~142 GB), Q4_K_M, experts on the CPU, one
/// file.
Layout moe_235b_a22b();

/// Exactly `tensors` tensors shaped like the 30B-A3B with one tensor per expert (as in the
/// safetensors checkpoints: 393 tensors a layer) in shards of 8 layers, experts on the CPU. For
/// measuring how planning time grows.
Layout scaled_moe(std::size_t tensors);

/// Exactly `tensors` tensors built against the planner: 4 KiB device tensors between 60 KiB CPU
/// tensors in one file, so every gap is equal and below merge_gap: one run that fails the gate,
/// must be split all the way down, and then merged back to the budget.
Layout adversarial_gaps(std::size_t tensors);

/// Sum of the sizes of the tensors on `target`.
std::uint64_t bytes_on(const ModelDesc& model, std::uint32_t target);

} // namespace wm::testkit
