// SPDX-License-Identifier: MIT
#include "testkit/synthetic_model.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "weightmap/formats.hpp"

namespace wm::testkit {
namespace {

constexpr std::uint32_t F32 = 0, Q4_K = 12, Q6_K = 14;

std::uint64_t bytes_of(std::uint32_t type, std::vector<std::uint64_t> ne) {
    auto b = ggml_tensor_bytes(type, ne);
    return b ? *b : 0;
}

struct Dims {
    std::uint64_t embd, ff, head, head_kv, head_dim = 128;
};

// Proportions of Llama-3 (dense: ff = 3.5 x embd) and Qwen3-30B-A3B (moe: expert ff = 3/8 x
// embd), rounded to the 256-element K-quant block every row must be a multiple of.
Dims dims_for(std::uint64_t k, SyntheticModelOptions::Shape shape) {
    Dims d;
    d.embd = 256 * k;
    d.head = d.embd / d.head_dim;
    d.head_kv = std::max<std::uint64_t>(1, d.head / 8);
    const std::uint64_t ff = shape == SyntheticModelOptions::Shape::dense ? d.embd * 7 / 2
                                                                          : d.embd * 3 / 8;
    d.ff = std::max<std::uint64_t>(256, (ff + 128) / 256 * 256);
    return d;
}

void add(GgufSpec& spec, std::string name, std::uint32_t type, std::vector<std::uint64_t> ne) {
    spec.tensors.push_back(GgufTensorSpec{std::move(name), type, std::move(ne), std::nullopt});
}

GgufSpec tensors_for(const Dims& d, const SyntheticModelOptions& o) {
    const bool moe = o.shape == SyntheticModelOptions::Shape::moe;
    const std::uint64_t q = d.head * d.head_dim, kv = d.head_kv * d.head_dim, x = o.experts;
    GgufSpec spec;
    add(spec, "token_embd.weight", Q4_K, {d.embd, o.vocab});
    for (std::uint32_t l = 0; l < o.layers; ++l) {
        const std::string b = fmt::format("blk.{}.", l);
        add(spec, b + "attn_norm.weight", F32, {d.embd});
        add(spec, b + "attn_q.weight", Q4_K, {d.embd, q});
        add(spec, b + "attn_k.weight", Q4_K, {d.embd, kv});
        add(spec, b + "attn_v.weight", Q6_K, {d.embd, kv});
        add(spec, b + "attn_output.weight", Q4_K, {q, d.embd});
        if (moe) {
            add(spec, b + "attn_q_norm.weight", F32, {d.head_dim});
            add(spec, b + "attn_k_norm.weight", F32, {d.head_dim});
        }
        add(spec, b + "ffn_norm.weight", F32, {d.embd});
        if (moe) {
            add(spec, b + "ffn_gate_inp.weight", F32, {d.embd, x});
            add(spec, b + "ffn_gate_exps.weight", Q4_K, {d.embd, d.ff, x});
            add(spec, b + "ffn_up_exps.weight", Q4_K, {d.embd, d.ff, x});
            add(spec, b + "ffn_down_exps.weight", Q6_K, {d.ff, d.embd, x});
        } else {
            add(spec, b + "ffn_gate.weight", Q4_K, {d.embd, d.ff});
            add(spec, b + "ffn_up.weight", Q4_K, {d.embd, d.ff});
            add(spec, b + "ffn_down.weight", Q6_K, {d.ff, d.embd});
        }
    }
    add(spec, "output_norm.weight", F32, {d.embd});
    add(spec, "output.weight", Q6_K, {d.embd, o.vocab});
    return spec;
}

std::uint64_t total_bytes(const GgufSpec& spec) {
    std::uint64_t sum = 0;
    for (const GgufTensorSpec& t : spec.tensors) sum += bytes_of(t.type, t.ne);
    return sum;
}

// splitmix64: a fixed generator, so a seed gives the same order with every standard library.
std::uint64_t next_random(std::uint64_t& state) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

} // namespace

SyntheticModel make_synthetic_model(const SyntheticModelOptions& o) {
    const bool moe = o.shape == SyntheticModelOptions::Shape::moe;
    // Total bytes grow with the width k; take the largest k that fits (k = 1 at least).
    std::uint64_t k = 1;
    while (k < 4096 && total_bytes(tensors_for(dims_for(k + 1, o.shape), o)) <= o.target_bytes)
        ++k;
    const Dims d = dims_for(k, o.shape);

    SyntheticModel m;
    m.spec = tensors_for(d, o);
    m.spec.version = o.version;
    m.spec.alignment = o.alignment;
    m.architecture = moe ? "qwen3moe" : "llama";
    m.n_embd = d.embd;
    m.n_ff = d.ff;
    m.n_head = d.head;
    m.n_head_kv = d.head_kv;
    m.head_dim = d.head_dim;
    m.tensor_bytes = total_bytes(m.spec);

    const std::string& a = m.architecture;
    auto& md = m.spec.metadata;
    md.push_back({"general.architecture", GgufValue::string(a)});
    md.push_back(
        {"general.name", GgufValue::string(fmt::format("wm synthetic {} {}L", a, o.layers))});
    md.push_back({"general.file_type", GgufValue::u32(15)}); // LLAMA_FTYPE_MOSTLY_Q4_K_M
    md.push_back({a + ".block_count", GgufValue::u32(o.layers)});
    md.push_back({a + ".context_length", GgufValue::u32(4096)});
    md.push_back({a + ".embedding_length", GgufValue::u32(static_cast<std::uint32_t>(d.embd))});
    md.push_back({a + ".feed_forward_length", GgufValue::u32(static_cast<std::uint32_t>(d.ff))});
    md.push_back({a + ".attention.head_count", GgufValue::u32(static_cast<std::uint32_t>(d.head))});
    md.push_back({a + ".attention.head_count_kv",
                  GgufValue::u32(static_cast<std::uint32_t>(d.head_kv))});
    md.push_back({a + ".rope.freq_base", GgufValue::f32(1000000.0f)});
    md.push_back({a + ".attention.layer_norm_rms_epsilon", GgufValue::f32(1e-6f)});
    if (moe) {
        md.push_back({a + ".expert_count", GgufValue::u32(o.experts)});
        md.push_back({a + ".expert_used_count", GgufValue::u32(o.experts_used)});
        md.push_back({a + ".expert_feed_forward_length",
                      GgufValue::u32(static_cast<std::uint32_t>(d.ff))});
    }
    if (o.tokenizer) {
        md.push_back({"tokenizer.ggml.model", GgufValue::string("gpt2")});
        std::vector<GgufValue> tokens, types;
        tokens.reserve(o.vocab);
        types.reserve(o.vocab);
        for (std::uint32_t i = 0; i < o.vocab; ++i) {
            tokens.push_back(GgufValue::string(fmt::format("<tok{}>", i)));
            types.push_back(GgufValue::i32(1));
        }
        md.push_back(
            {"tokenizer.ggml.tokens", GgufValue::array(GgufType::string, std::move(tokens))});
        md.push_back(
            {"tokenizer.ggml.token_type", GgufValue::array(GgufType::i32, std::move(types))});
    }
    if (o.shuffle_infos) {
        std::vector<std::size_t> order(m.spec.tensors.size());
        std::iota(order.begin(), order.end(), std::size_t{0});
        std::uint64_t state = o.seed;
        for (std::size_t i = order.size(); i > 1; --i)
            std::swap(order[i - 1], order[next_random(state) % i]);
        m.spec.info_order = std::move(order);
    }
    return m;
}

} // namespace wm::testkit
