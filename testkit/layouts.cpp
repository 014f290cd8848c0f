// SPDX-License-Identifier: MIT
#include "testkit/layouts.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

namespace wm::testkit {
namespace {

constexpr std::uint64_t gguf_alignment = 32; // general.alignment default

std::uint64_t align32(std::uint64_t v) { return (v + gguf_alignment - 1) / gguf_alignment * gguf_alignment; }

enum class Type { f32, q4_k, q6_k };

std::uint64_t type_bytes(Type type, std::uint64_t elements) {
    switch (type) {
    case Type::f32: return elements * 4;
    case Type::q4_k: return elements / 256 * 144; // 4.5 bits a weight
    case Type::q6_k: return elements / 256 * 210; // 6.5625 bits a weight
    }
    return 0;
}

// llama.cpp's Q4_K_M gives attn_v and ffn_down Q6_K on these layers (use_more_bits).
bool more_bits(std::uint64_t layer, std::uint64_t layers) {
    return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

struct Shape {
    std::uint64_t hidden, layers, experts, expert_ffn, ffn, q_heads, kv_heads, head_dim, vocab;
    bool tied;
};

struct Pending {
    std::string name;
    std::uint64_t bytes;
    std::uint32_t target;
    bool alias_of_previous = false; // same bytes as the tensor before it (a tied output)
};

// Lays tensors out like llama.cpp's writer: a metadata header (the tokenizer lives in the first
// file), then each tensor's data aligned to 32 bytes. `file_of[i]` is the file of tensor i; files
// are consecutive.
ModelDesc write(const std::string& stem, const std::vector<Pending>& tensors,
                const std::vector<std::uint32_t>& file_of) {
    ModelDesc model;
    TargetDesc device{"GPU0", "hsa", {}};
    device.caps.alignment = 4096;
    device.caps.needs_writable_mapping = true;
    device.caps.device_memory = DeviceMemory::unified; // the APU these layouts come from
    TargetDesc cpu{"CPU", "cpu", {}};
    cpu.caps.is_cpu = true;
    model.targets = {device, cpu};
    const std::uint32_t files = file_of.empty() ? 0 : file_of.back() + 1;
    std::vector<std::uint64_t> count(files, 0);
    for (std::uint32_t f : file_of) ++count[f];
    model.tensors.reserve(tensors.size());
    std::uint64_t cursor = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const std::uint32_t f = file_of[i];
        if (model.files.size() <= f) {
            if (!model.files.empty()) model.files.back().size = cursor;
            model.files.push_back({files == 1 ? stem + ".gguf"
                                              : fmt::format("{}-{:05}-of-{:05}.gguf", stem, f + 1,
                                                            files),
                                   0});
            // ~5.9 MB of tokenizer metadata in the first file, split keys in the others, and
            // about 64 bytes of tensor info per tensor.
            cursor = align32((f == 0 ? 5'921'733 : 16'411) + 64 * count[f]);
        }
        if (tensors[i].alias_of_previous) {
            TensorDesc alias = model.tensors.back();
            alias.name = tensors[i].name;
            alias.target = tensors[i].target;
            model.tensors.push_back(std::move(alias));
            continue;
        }
        model.tensors.push_back({tensors[i].name, f, cursor, tensors[i].bytes, tensors[i].target});
        cursor = align32(cursor + tensors[i].bytes);
    }
    if (!model.files.empty()) model.files.back().size = cursor;
    return model;
}

// Splits like gguf-split --split-max-size: a new file once the current one holds its share.
std::vector<std::uint32_t> shard(const std::vector<Pending>& tensors, std::uint32_t shards) {
    std::uint64_t total = 0;
    for (const Pending& t : tensors) total += t.alias_of_previous ? 0 : t.bytes;
    const std::uint64_t share = (total + shards - 1) / shards;
    std::vector<std::uint32_t> file_of(tensors.size());
    std::uint32_t file = 0;
    std::uint64_t held = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        if (held >= share && file + 1 < shards) {
            ++file;
            held = 0;
        }
        file_of[i] = file;
        held += tensors[i].alias_of_previous ? 0 : tensors[i].bytes;
    }
    return file_of;
}

void add_block(std::vector<Pending>& out, const Shape& s, std::uint64_t layer, BlockOrder order) {
    constexpr std::uint32_t dev = device_target, cpu = cpu_target;
    const std::uint64_t q = s.q_heads * s.head_dim, kv = s.kv_heads * s.head_dim;
    const Type v_type = more_bits(layer, s.layers) ? Type::q6_k : Type::q4_k;
    auto name = [&](const char* what) { return fmt::format("blk.{}.{}.weight", layer, what); };
    const Pending attn_norm{name("attn_norm"), type_bytes(Type::f32, s.hidden), dev};
    const Pending attn_q{name("attn_q"), type_bytes(Type::q4_k, s.hidden * q), dev};
    const Pending attn_k{name("attn_k"), type_bytes(Type::q4_k, s.hidden * kv), dev};
    const Pending attn_v{name("attn_v"), type_bytes(v_type, s.hidden * kv), dev};
    const Pending attn_output{name("attn_output"), type_bytes(Type::q4_k, q * s.hidden), dev};
    const Pending q_norm{name("attn_q_norm"), type_bytes(Type::f32, s.head_dim), dev};
    const Pending k_norm{name("attn_k_norm"), type_bytes(Type::f32, s.head_dim), dev};
    const Pending ffn_norm{name("ffn_norm"), type_bytes(Type::f32, s.hidden), dev};
    if (s.experts == 0) {
        const std::uint64_t w = s.hidden * s.ffn;
        out.insert(out.end(), {attn_norm, attn_q, attn_k, attn_v, attn_output, q_norm, k_norm,
                               ffn_norm,
                               {name("ffn_gate"), type_bytes(Type::q4_k, w), dev},
                               {name("ffn_up"), type_bytes(Type::q4_k, w), dev},
                               {name("ffn_down"), type_bytes(v_type, w), dev}});
        return;
    }
    const std::uint64_t w = s.experts * s.hidden * s.expert_ffn;
    const Pending gate_inp{name("ffn_gate_inp"), type_bytes(Type::f32, s.hidden * s.experts), dev};
    const Pending gate_exps{name("ffn_gate_exps"), type_bytes(Type::q4_k, w), cpu};
    const Pending up_exps{name("ffn_up_exps"), type_bytes(Type::q4_k, w), cpu};
    const Pending down_exps{name("ffn_down_exps"), type_bytes(v_type, w), cpu};
    if (order == BlockOrder::grouped)
        out.insert(out.end(), {attn_norm, attn_q, attn_k, attn_v, attn_output, q_norm, k_norm,
                               ffn_norm, gate_inp, gate_exps, down_exps, up_exps});
    else
        out.insert(out.end(), {attn_k, k_norm, attn_norm, attn_output, attn_q, q_norm, attn_v,
                               down_exps, gate_exps, gate_inp, ffn_norm, up_exps});
}

std::vector<Pending> model_tensors(const Shape& s, BlockOrder order) {
    std::vector<Pending> out;
    // Q4_K_M quantizes a tied token_embd as the output layer it also is: Q6_K.
    const std::uint64_t embd = type_bytes(s.tied ? Type::q6_k : Type::q4_k, s.vocab * s.hidden);
    out.push_back({"token_embd.weight", embd, cpu_target});
    if (s.tied) // the output layer reads token_embd's bytes on the device
        out.push_back({"output.weight (tied: token_embd.weight)", embd, device_target, true});
    for (std::uint64_t layer = 0; layer < s.layers; ++layer) add_block(out, s, layer, order);
    out.push_back({"output_norm.weight", type_bytes(Type::f32, s.hidden), device_target});
    if (!s.tied)
        out.push_back({"output.weight", type_bytes(Type::q6_k, s.vocab * s.hidden), device_target});
    return out;
}

Layout make(std::string name, const std::string& stem, const Shape& s, std::uint32_t shards,
            BlockOrder order) {
    std::vector<Pending> tensors = model_tensors(s, order);
    Layout layout{std::move(name), {}, static_cast<std::uint32_t>(s.layers)};
    layout.model = write(stem, tensors, shard(tensors, shards));
    return layout;
}

constexpr Shape qwen3_4b{2560, 36, 0, 0, 9728, 32, 8, 128, 151936, true};
constexpr Shape qwen3_30b_a3b{2048, 48, 128, 768, 0, 32, 4, 128, 151936, false};
constexpr Shape qwen3_235b_a22b{4096, 94, 128, 1536, 0, 64, 4, 128, 151936, false};

} // namespace

Layout dense_4b() { return make("dense 4B", "dense-4b-q4_k_m", qwen3_4b, 1, BlockOrder::grouped); }

Layout moe_30b_a3b(std::uint32_t shards, BlockOrder order) {
    std::string name = shards > 1 ? fmt::format("30B-A3B x{} shards", shards) : "30B-A3B";
    if (order == BlockOrder::name_sorted) name += " (name-sorted)";
    return make(std::move(name), "moe-30b-a3b-q4_k_m", qwen3_30b_a3b, std::max(shards, 1u), order);
}

Layout moe_235b_a22b() {
    return make("235B-A22B", "moe-235b-a22b-q4_k_m", qwen3_235b_a22b, 1, BlockOrder::grouped);
}

Layout scaled_moe(std::size_t count) {
    const Shape& s = qwen3_30b_a3b;
    constexpr std::uint64_t layers_per_shard = 8;
    std::vector<Pending> tensors;
    std::vector<std::uint32_t> file_of;
    tensors.reserve(count);
    file_of.reserve(count);
    auto push = [&](Pending p, std::uint64_t layer) {
        if (tensors.size() == count) return;
        tensors.push_back(std::move(p));
        file_of.push_back(static_cast<std::uint32_t>(layer / layers_per_shard));
    };
    push({"token_embd.weight", type_bytes(Type::q4_k, s.vocab * s.hidden), cpu_target}, 0);
    const std::uint64_t expert = type_bytes(Type::q4_k, s.hidden * s.expert_ffn);
    std::uint64_t layer = 0;
    for (; tensors.size() < count; ++layer) {
        std::vector<Pending> block;
        add_block(block, s, layer, BlockOrder::grouped);
        for (Pending& p : block)
            if (p.target == device_target) push(std::move(p), layer);
        for (std::uint64_t e = 0; e < s.experts; ++e)
            for (const char* what : {"gate", "down", "up"})
                push({fmt::format("blk.{}.ffn_{}.{}.weight", layer, what, e), expert, cpu_target},
                     layer);
    }
    Layout layout{fmt::format("scaled MoE, {} tensors", count), {}, static_cast<std::uint32_t>(layer)};
    layout.model = write("scaled-moe", tensors, file_of);
    return layout;
}

Layout adversarial_gaps(std::size_t count) {
    Layout layout{fmt::format("adversarial gaps, {} tensors", count), {}, 0};
    ModelDesc& m = layout.model;
    TargetDesc device{"GPU0", "hsa", {}};
    device.caps.alignment = 4096;
    device.caps.device_memory = DeviceMemory::unified;
    TargetDesc cpu{"CPU", "cpu", {}};
    cpu.caps.is_cpu = true;
    m.targets = {device, cpu};
    m.tensors.reserve(count);
    std::uint64_t cursor = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const bool on_device = i % 2 == 0;
        const std::uint64_t size = on_device ? 4096 : 60 * 1024;
        m.tensors.push_back({fmt::format("t{}", i), 0, cursor, size,
                             on_device ? device_target : cpu_target});
        cursor += size;
    }
    m.files = {{"adversarial.gguf", cursor}};
    return layout;
}

std::uint64_t bytes_on(const ModelDesc& model, std::uint32_t target) {
    std::uint64_t total = 0;
    for (const TensorDesc& t : model.tensors)
        if (t.target == target) total += t.size;
    return total;
}

} // namespace wm::testkit
