// SPDX-License-Identifier: MIT
// The GGUF reader finds every tensor where the writer put it: every ggml type, GGUF v2 and v3,
// alignments 32/64/4096, unsorted tensor infos, metadata of every value type skipped, split
// models found from their first shard. Offsets are checked twice: against the writer's layout,
// and against the file's own bytes (the data is the position pattern).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

#include "formats/model_invariants.hpp"
#include "formats/sample_models.hpp"
#include "testkit/pattern.hpp"
#include "testkit/synthetic_model.hpp"
#include "support/temp_file.hpp"
#include "weightmap/formats.hpp"

using namespace wm;
using namespace wm::testkit;

namespace {

std::vector<std::byte> read_bytes(const std::string& path, std::uint64_t offset, std::size_t n) {
    std::vector<std::byte> out(n);
    int fd = open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(pread(fd, out.data(), n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n));
    close(fd);
    return out;
}

// The first and last 64 bytes of every tensor are the pattern of their absolute offsets.
void check_data_at_offsets(const ModelInfo& model) {
    for (const TensorInfo& t : model.tensors) {
        if (t.size == 0) continue;
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(64, t.size));
        auto head = read_bytes(model.files[t.file].path, t.offset, n);
        CHECK(find_pattern_mismatch(t.offset, head) == n);
        auto tail = read_bytes(model.files[t.file].path, t.offset + t.size - n, n);
        CHECK(find_pattern_mismatch(t.offset + t.size - n, tail) == n);
    }
}

const TensorInfo* find(const ModelInfo& m, std::string_view name) {
    for (const TensorInfo& t : m.tensors)
        if (t.name == name) return &t;
    return nullptr;
}

void write_file(const std::string& path, const std::vector<std::byte>& bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    REQUIRE(f.good());
}

} // namespace

TEST_CASE("the ggml type table matches the block structs of ggml-common.h") {
    struct Expect {
        const char* name;
        std::uint32_t id, block, size;
    };
    // From ggml.h (ids) and ggml-common.h's static_asserts (sizes).
    const Expect expected[] = {
        {"F32", 0, 1, 4},       {"F16", 1, 1, 2},        {"Q4_0", 2, 32, 18},
        {"Q4_1", 3, 32, 20},    {"Q5_0", 6, 32, 22},     {"Q5_1", 7, 32, 24},
        {"Q8_0", 8, 32, 34},    {"Q8_1", 9, 32, 36},     {"Q2_K", 10, 256, 84},
        {"Q3_K", 11, 256, 110}, {"Q4_K", 12, 256, 144},  {"Q5_K", 13, 256, 176},
        {"Q6_K", 14, 256, 210}, {"Q8_K", 15, 256, 292},  {"IQ2_XXS", 16, 256, 66},
        {"IQ2_XS", 17, 256, 74}, {"IQ3_XXS", 18, 256, 98}, {"IQ1_S", 19, 256, 50},
        {"IQ4_NL", 20, 32, 18}, {"IQ3_S", 21, 256, 110}, {"IQ2_S", 22, 256, 82},
        {"IQ4_XS", 23, 256, 136}, {"I8", 24, 1, 1},      {"I16", 25, 1, 2},
        {"I32", 26, 1, 4},      {"I64", 27, 1, 8},       {"F64", 28, 1, 8},
        {"IQ1_M", 29, 256, 56}, {"BF16", 30, 1, 2},      {"TQ1_0", 34, 256, 54},
        {"TQ2_0", 35, 256, 66}, {"MXFP4", 39, 32, 17},   {"NVFP4", 40, 64, 36},
        {"Q1_0", 41, 128, 18},
    };
    REQUIRE(ggml_types().size() == std::size(expected));
    for (const Expect& e : expected) {
        INFO(e.name);
        const GgmlType* by_id = find_ggml_type(e.id);
        REQUIRE(by_id != nullptr);
        CHECK(by_id->name == e.name);
        CHECK(by_id->block_size == e.block);
        CHECK(by_id->type_size == e.size);
        CHECK(find_ggml_type(std::string_view(e.name)) == by_id);
    }
    for (std::uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 1000u})
        CHECK(find_ggml_type(removed) == nullptr);
}

TEST_CASE("ggml tensor bytes come from the type and every dimension") {
    const std::uint64_t q4k[] = {4096, 11008, 2};
    CHECK(*ggml_tensor_bytes(12, q4k) == 4096 / 256 * 144 * 11008 * 2);
    const std::uint64_t f32[] = {7, 3};
    CHECK(*ggml_tensor_bytes(0, f32) == 84);
    CHECK(*ggml_tensor_bytes(0, {}) == 4); // a 0-dimensional tensor is a scalar
    const std::uint64_t zero[] = {256, 0};
    CHECK(*ggml_tensor_bytes(12, zero) == 0);

    const std::uint64_t not_block[] = {100};
    auto r = ggml_tensor_bytes(12, not_block);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains("not a multiple of the Q4_K block size 256"));
    const std::uint64_t five[] = {1, 1, 1, 1, 1};
    CHECK_THAT(ggml_tensor_bytes(0, five).error().message, Catch::Contains("at most 4"));
    const std::uint64_t huge[] = {std::uint64_t{1} << 63};
    CHECK_THAT(ggml_tensor_bytes(0, huge).error().message, Catch::Contains("INT64_MAX"));
    const std::uint64_t overflow[] = {std::uint64_t{1} << 31, std::uint64_t{1} << 31,
                                      std::uint64_t{1} << 31};
    CHECK_THAT(ggml_tensor_bytes(0, overflow).error().message, Catch::Contains("overflows"));
    CHECK_THAT(ggml_tensor_bytes(99, f32).error().message,
               Catch::Contains("unknown ggml type id 99"));
}

TEST_CASE("every type is read at the writer's offset for GGUF v2/v3 and alignments 32, 64, 4096") {
    wm::test::TempDir dir;
    for (std::uint32_t version : {2u, 3u}) {
        for (std::uint64_t alignment : {32u, 64u, 4096u}) {
            INFO("version " << version << ", alignment " << alignment);
            const GgufSpec spec = wm::test::every_type_gguf_spec(version, alignment);
            const std::string path = fmt::format("{}/v{}-a{}.gguf", dir.path(), version, alignment);
            auto layout = write_gguf(path, spec, DataFill::pattern);
            REQUIRE(layout);
            const std::string paths[] = {path};
            auto model = read_gguf(paths);
            REQUIRE(model);
            REQUIRE(model->files.size() == 1);
            const ModelFile& f = model->files[0];
            CHECK(f.version == version);
            CHECK(f.alignment == alignment);
            CHECK(f.data_offset == layout->data_offset);
            CHECK(f.data_offset % alignment == 0);
            CHECK(f.size == layout->file_size);
            CHECK(f.tensor_count == spec.tensors.size());
            CHECK(model->architecture == "every-type");
            REQUIRE(model->tensors.size() == spec.tensors.size());
            for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
                const TensorInfo& t = model->tensors[i];
                INFO(t.name);
                CHECK(t.name == spec.tensors[i].name);
                CHECK(t.offset == layout->offsets[i]);
                CHECK(t.size == layout->sizes[i]);
                CHECK(t.size > 0);
                CHECK(t.shape == spec.tensors[i].ne);
                CHECK(t.type == find_ggml_type(spec.tensors[i].type)->name);
                CHECK((t.offset - f.data_offset) % alignment == 0);
            }
            CHECK(wm::test::model_invariant_violation(*model).empty());
            check_data_at_offsets(*model);
        }
    }
}

TEST_CASE("tensor infos in any order keep their header order and their offsets") {
    wm::test::TempDir dir;
    SyntheticModelOptions o;
    o.layers = 3;
    o.experts = 4;
    o.vocab = 64;
    o.target_bytes = 1 << 20;
    o.shuffle_infos = true;
    o.seed = 7;
    const SyntheticModel m = make_synthetic_model(o);
    REQUIRE(m.spec.info_order.size() == m.spec.tensors.size());
    bool sorted = std::is_sorted(m.spec.info_order.begin(), m.spec.info_order.end());
    REQUIRE_FALSE(sorted);
    const std::string path = dir.path() + "/shuffled.gguf";
    auto layout = write_gguf(path, m.spec, DataFill::pattern);
    REQUIRE(layout);
    const std::string paths[] = {path};
    auto model = read_gguf(paths);
    REQUIRE(model);
    REQUIRE(model->tensors.size() == m.spec.tensors.size());
    for (std::size_t k = 0; k < m.spec.info_order.size(); ++k) {
        const std::size_t i = m.spec.info_order[k]; // the k-th info describes tensor i
        CHECK(model->tensors[k].name == m.spec.tensors[i].name);
        CHECK(model->tensors[k].offset == layout->offsets[i]);
        CHECK(model->tensors[k].size == layout->sizes[i]);
    }
    check_data_at_offsets(*model);
}

TEST_CASE("metadata of every value type is skipped and the kept keys are read") {
    GgufSpec spec = wm::test::small_gguf_spec(3, 64);
    // general.alignment as a uint64 is accepted too (llama.cpp writes uint32).
    spec.alignment_key = false;
    spec.metadata.insert(spec.metadata.begin(), {"general.alignment", GgufValue::u64(64)});
    GgufLayout layout;
    auto bytes = gguf_bytes(spec, &layout);
    REQUIRE(bytes);
    auto model = parse_gguf(*bytes, bytes->size(), "small.gguf");
    REQUIRE(model);
    CHECK(model->architecture == "llama");
    CHECK(model->files[0].alignment == 64);
    CHECK(model->files[0].data_offset == layout.data_offset);
    CHECK(model->files[0].split_count == 0);
    REQUIRE(model->tensors.size() == 5);
    for (std::size_t i = 0; i < 5; ++i) CHECK(model->tensors[i].offset == layout.offsets[i]);
    const TensorInfo* exps = find(*model, "blk.0.ffn_up_exps.weight");
    REQUIRE(exps != nullptr);
    CHECK(exps->type == "F16");
    CHECK(exps->size == 4 * 2 * 2 * 2);
}

TEST_CASE("parse_gguf needs only the header, and says so when given less") {
    GgufLayout layout;
    auto bytes = gguf_bytes(wm::test::small_gguf_spec(), &layout);
    REQUIRE(bytes);
    std::span<const std::byte> header(bytes->data(), layout.infos_end);
    auto model = parse_gguf(header, bytes->size(), "head.gguf");
    REQUIRE(model);
    CHECK(model->tensors.back().offset == layout.offsets.back());

    auto short_head = parse_gguf(header.first(header.size() - 1), bytes->size(), "head.gguf");
    REQUIRE_FALSE(short_head);
    CHECK(short_head.error().kind == ErrorKind::format);
    CHECK_THAT(short_head.error().message, Catch::Contains("head.gguf: byte"));
    CHECK_THAT(short_head.error().message, Catch::Contains("provided"));

    auto wrong_size = parse_gguf(*bytes, bytes->size() - 1, "x");
    REQUIRE_FALSE(wrong_size);
    CHECK(wrong_size.error().kind == ErrorKind::invalid_argument);
}

TEST_CASE("a split GGUF is found from its first shard and read as one model") {
    wm::test::TempDir dir;
    SyntheticModelOptions o;
    o.layers = 4;
    o.experts = 4;
    o.vocab = 64;
    o.alignment = 64;
    o.target_bytes = 2 << 20;
    const SyntheticModel m = make_synthetic_model(o);
    auto split = write_gguf_split(dir.path() + "/moe", m.spec, 3, DataFill::pattern);
    REQUIRE(split);
    REQUIRE(split->paths.size() == 3);
    CHECK(split->paths[0] == dir.path() + "/moe-00001-of-00003.gguf");

    const std::string first[] = {split->paths[0]};
    auto model = read_gguf(first);
    REQUIRE(model);
    REQUIRE(model->files.size() == 3);
    CHECK(model->architecture == "qwen3moe");
    REQUIRE(model->tensors.size() == m.spec.tensors.size());
    std::size_t k = 0;
    for (std::uint32_t s = 0; s < 3; ++s) {
        CHECK(model->files[s].path == split->paths[s]);
        CHECK(model->files[s].split_no == s);
        CHECK(model->files[s].split_count == 3);
        CHECK(model->files[s].alignment == 64);
        CHECK(model->files[s].tensor_count == split->tensors[s].size());
        for (std::size_t j = 0; j < split->tensors[s].size(); ++j, ++k) {
            const TensorInfo& t = model->tensors[k];
            CHECK(t.file == s);
            CHECK(t.name == m.spec.tensors[split->tensors[s][j]].name);
            CHECK(t.offset == split->layouts[s].offsets[j]);
        }
    }
    CHECK(wm::test::model_invariant_violation(*model).empty());
    check_data_at_offsets(*model);

    SECTION("read_model expands the first shard too") {
        auto same = read_model(first);
        REQUIRE(same);
        CHECK(same->files.size() == 3);
    }
    SECTION("every shard given, in any order, is sorted by split.no") {
        const std::string all[] = {split->paths[2], split->paths[0], split->paths[1]};
        auto shuffled = read_gguf(all);
        REQUIRE(shuffled);
        for (std::uint32_t s = 0; s < 3; ++s) CHECK(shuffled->files[s].path == split->paths[s]);
        CHECK(shuffled->tensors.size() == model->tensors.size());
    }
    SECTION("a shard that is not the first is refused with a hint") {
        const std::string second[] = {split->paths[1]};
        auto r = read_gguf(second);
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("shard 2 of 3"));
    }
    SECTION("a missing shard is named") {
        REQUIRE(unlink(split->paths[2].c_str()) == 0);
        auto r = read_gguf(first);
        REQUIRE_FALSE(r);
        CHECK(r.error().kind == ErrorKind::io);
        CHECK_THAT(r.error().message, Catch::Contains(split->paths[2]));
    }
    SECTION("shards of two different splits are refused") {
        const std::string two[] = {split->paths[0], split->paths[1]};
        auto r = read_gguf(two);
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("split.count is 3 but 2 shard(s)"));
    }
    SECTION("a renamed first shard whose name no longer says where the others are") {
        const std::string renamed = dir.path() + "/renamed.gguf";
        REQUIRE(rename(split->paths[0].c_str(), renamed.c_str()) == 0);
        const std::string one[] = {renamed};
        auto r = read_gguf(one);
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("give every shard's path"));
    }
}

TEST_CASE("a synthetic MoE model has llama.cpp's tensor names, types and shapes") {
    SyntheticModelOptions o;
    o.layers = 2;
    o.experts = 8;
    o.vocab = 1000;
    o.target_bytes = 8 << 20;
    const SyntheticModel m = make_synthetic_model(o);
    auto bytes = gguf_bytes(m.spec);
    REQUIRE(bytes);
    auto model = parse_gguf(*bytes, bytes->size());
    REQUIRE(model);
    const TensorInfo* gate = find(*model, "blk.1.ffn_gate_exps.weight");
    REQUIRE(gate != nullptr);
    CHECK(gate->type == "Q4_K");
    CHECK(gate->shape == std::vector<std::uint64_t>{m.n_embd, m.n_ff, 8});
    CHECK(gate->size == m.n_embd / 256 * 144 * m.n_ff * 8);
    const TensorInfo* down = find(*model, "blk.1.ffn_down_exps.weight");
    REQUIRE(down != nullptr);
    CHECK(down->type == "Q6_K");
    CHECK(down->shape == std::vector<std::uint64_t>{m.n_ff, m.n_embd, 8});
    for (const char* name : {"token_embd.weight", "output.weight", "output_norm.weight",
                             "blk.0.attn_q.weight", "blk.0.attn_norm.weight",
                             "blk.0.ffn_gate_inp.weight", "blk.0.ffn_up_exps.weight"})
        CHECK(find(*model, name) != nullptr);
    CHECK(find(*model, "blk.0.attn_norm.weight")->type == "F32");
    std::uint64_t total = 0;
    for (const TensorInfo& t : model->tensors) total += t.size;
    CHECK(total == m.tensor_bytes);
    CHECK(total <= o.target_bytes);
    CHECK(model->architecture == "qwen3moe");
}

TEST_CASE("read_model tells the formats apart and refuses what is neither") {
    wm::test::TempDir dir;
    auto gguf = gguf_bytes(wm::test::small_gguf_spec());
    REQUIRE(gguf);
    write_file(dir.path() + "/m.gguf", *gguf);
    write_file(dir.path() + "/m.safetensors",
               safetensors_bytes(wm::test::every_dtype_safetensors_spec()));
    write_file(dir.path() + "/junk.bin", std::vector<std::byte>(100, std::byte{0x41}));
    write_file(dir.path() + "/empty.bin", {});

    const std::string g[] = {dir.path() + "/m.gguf"};
    auto a = read_model(g);
    REQUIRE(a);
    CHECK(a->files[0].format == ModelFormat::gguf);
    const std::string s[] = {dir.path() + "/m.safetensors"};
    auto b = read_model(s);
    REQUIRE(b);
    CHECK(b->files[0].format == ModelFormat::safetensors);

    const std::string mixed[] = {g[0], s[0]};
    auto c = read_model(mixed);
    REQUIRE_FALSE(c);
    CHECK(c.error().kind == ErrorKind::invalid_argument);
    CHECK_THAT(c.error().message, Catch::Contains("not in the same format"));

    const std::string junk[] = {dir.path() + "/junk.bin"};
    auto d = read_model(junk);
    REQUIRE_FALSE(d);
    CHECK(d.error().kind == ErrorKind::format);
    CHECK_THAT(d.error().message, Catch::Contains("junk.bin: byte 0: magic: neither GGUF"));
    CHECK_THAT(d.error().message, Catch::Contains("41 41 41"));

    const std::string empty[] = {dir.path() + "/empty.bin"};
    CHECK_THAT(read_model(empty).error().message, Catch::Contains("starts with nothing"));

    const std::string directory[] = {dir.path()};
    auto e = read_model(directory);
    REQUIRE_FALSE(e);
    CHECK_THAT(e.error().message, Catch::Contains("not a regular file"));

    // A FIFO would block a plain open(); the reader must refuse it without hanging.
    const std::string fifo = dir.path() + "/fifo.gguf";
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    const std::string f[] = {fifo};
    auto r = read_model(f);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains("not a regular file"));

    CHECK(read_model({}).error().kind == ErrorKind::invalid_argument);
}
