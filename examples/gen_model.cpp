// SPDX-License-Identifier: MIT
// wm-gen-model: writes a GGUF model shaped like a real llama.cpp one (dense or MoE, any size) for
// trying wm-plan and wm-load without downloading 19 GB.
//
// Data is either the verifiable pattern - the byte at absolute file offset o is
// wm::testkit::model_pattern_byte(o) (testkit/pattern.hpp), padding included - or, with
// --sparse, a hole: an 8 GiB model is written in milliseconds and takes no disk.
//
//   wm-gen-model --shape moe --layers 48 --experts 128 --size-mib 8192 --sparse -o moe.gguf
//   wm-gen-model --shape dense --size-mib 300 --split 3 -o dense.gguf   # dense-0000i-of-00003.gguf
#include <chrono>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "testkit/gguf_writer.hpp"
#include "testkit/synthetic_model.hpp"

int main(int argc, char** argv) {
    using wm::testkit::SyntheticModelOptions;
    SyntheticModelOptions o;
    std::string shape = "moe", out;
    std::uint64_t size_mib = 256;
    std::uint32_t split = 1;
    bool sparse = false;

    CLI::App app{"wm-gen-model: write a llama.cpp-shaped GGUF model (dense or MoE) whose data is "
                 "a verifiable pattern or a sparse hole"};
    app.add_option("--shape", shape, "dense | moe (default moe)")
        ->check(CLI::IsMember({"dense", "moe"}));
    app.add_option("--layers", o.layers, "transformer blocks (default 4)")
        ->check(CLI::Range(1, 4096));
    app.add_option("--experts", o.experts, "experts per MoE layer (default 8)")
        ->check(CLI::Range(1, 1024));
    app.add_option("--experts-used", o.experts_used, "experts used per token (metadata only)");
    app.add_option("--size-mib", size_mib,
                   "approximate tensor data in MiB (default 256): the widest model that fits")
        ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 30));
    app.add_option("--vocab", o.vocab, "vocabulary size (default 32000)")
        ->check(CLI::Range(1, 1 << 22));
    app.add_option("--alignment", o.alignment, "GGUF general.alignment (default 32; 64, 4096, ...)")
        ->check([](const std::string& v) -> std::string {
            std::uint64_t n = 0;
            try {
                n = std::stoull(v);
            } catch (...) {
                return "not a number: " + v;
            }
            return n != 0 && n <= (1u << 30) && (n & (n - 1)) == 0
                       ? ""
                       : "must be a power of two up to 1 GiB: " + v;
        });
    app.add_option("--gguf-version", o.version, "2 or 3 (default 3)")->check(CLI::IsMember({2, 3}));
    app.add_option("--split", split, "write N shards PREFIX-0000i-of-0000N.gguf (default 1)")
        ->check(CLI::Range(1, 999));
    app.add_flag("--sparse", sparse, "leave the data a hole (ftruncate) instead of the pattern");
    app.add_flag("--shuffle-infos", o.shuffle_infos, "write the tensor infos in a random order");
    app.add_option("--seed", o.seed, "seed of --shuffle-infos (default 1)");
    app.add_flag_callback("--no-tokenizer", [&] { o.tokenizer = false; },
                          "omit the tokenizer arrays from the metadata");
    app.add_option("-o,--output", out, "output path (with --split: PREFIX.gguf or PREFIX)")
        ->required();
    CLI11_PARSE(app, argc, argv);

    o.shape =
        shape == "dense" ? SyntheticModelOptions::Shape::dense : SyntheticModelOptions::Shape::moe;
    o.target_bytes = size_mib << 20;
    const auto model = wm::testkit::make_synthetic_model(o);
    const auto fill = sparse ? wm::testkit::DataFill::sparse : wm::testkit::DataFill::pattern;

    const auto start = std::chrono::steady_clock::now();
    std::vector<std::string> paths;
    std::uint64_t bytes = 0;
    if (split <= 1) {
        auto layout = wm::testkit::write_gguf(out, model.spec, fill);
        if (!layout) {
            fmt::print(stderr, "wm-gen-model: {}\n", layout.error().message);
            return 1;
        }
        paths.push_back(out);
        bytes = layout->file_size;
    } else {
        std::string prefix = out;
        if (prefix.size() > 5 && prefix.ends_with(".gguf")) prefix.resize(prefix.size() - 5);
        auto written = wm::testkit::write_gguf_split(prefix, model.spec, split, fill);
        if (!written) {
            fmt::print(stderr, "wm-gen-model: {}\n", written.error().message);
            return 1;
        }
        paths = written->paths;
        for (const auto& l : written->layouts) bytes += l.file_size;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    fmt::print("{} {}: {} layers{}, n_embd {}, n_ff {}, heads {}/{}, vocab {}, {} tensors\n",
               model.architecture, shape, o.layers,
               o.shape == SyntheticModelOptions::Shape::moe ? fmt::format(", {} experts", o.experts)
                                                            : "",
               model.n_embd, model.n_ff, model.n_head, model.n_head_kv, o.vocab,
               model.spec.tensors.size());
    fmt::print(
        "tensor data {:.1f} MiB; {} file(s), {:.1f} MiB, {} in {:.2f} s; GGUF v{}, alignment "
        "{}{}\n",
        static_cast<double>(model.tensor_bytes) / (1 << 20), paths.size(),
        static_cast<double>(bytes) / (1 << 20), sparse ? "sparse" : "pattern-filled", seconds,
        o.version, o.alignment, o.shuffle_infos ? ", infos shuffled" : "");
    for (const std::string& p : paths) fmt::print("  {}\n", p);
    return 0;
}
