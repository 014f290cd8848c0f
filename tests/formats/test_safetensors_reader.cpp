// SPDX-License-Identifier: MIT
// The safetensors reader: every dtype at the offset the writer put it (relative to the byte
// after the JSON header), __metadata__ and unknown keys ignored, sharded models read through
// model.safetensors.index.json, and an index that does not match its shards refused.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "formats/model_invariants.hpp"
#include "formats/sample_models.hpp"
#include "testkit/pattern.hpp"
#include "support/temp_file.hpp"
#include "weightmap/formats.hpp"

using namespace wm;
using namespace wm::testkit;

namespace {

void write_text(const std::string& path, const std::string& text) {
    std::ofstream f(path);
    f << text;
    REQUIRE(f.good());
}

std::byte byte_at(const std::string& path, std::uint64_t offset) {
    std::byte b{};
    int fd = open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
    close(fd);
    return b;
}

} // namespace

TEST_CASE("safetensors dtypes: bits per element, packed types in whole bytes") {
    CHECK(safetensors_dtypes().size() == 22);
    struct Expect {
        const char* name;
        std::uint32_t bits;
    };
    const Expect expected[] = {{"BOOL", 8}, {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6},
                               {"U8", 8}, {"I8", 8}, {"F8_E5M2", 8}, {"F8_E4M3", 8},
                               {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8},
                               {"I16", 16}, {"U16", 16}, {"F16", 16}, {"BF16", 16},
                               {"I32", 32}, {"U32", 32}, {"F32", 32}, {"C64", 64},
                               {"F64", 64}, {"I64", 64}, {"U64", 64}};
    for (const Expect& e : expected) {
        INFO(e.name);
        const SafetensorsDtype* d = find_safetensors_dtype(e.name);
        REQUIRE(d != nullptr);
        CHECK(d->bits == e.bits);
    }
    const std::uint64_t shape[] = {3, 5};
    CHECK(*safetensors_tensor_bytes("BF16", shape) == 30);
    CHECK(*safetensors_tensor_bytes("F32", {}) == 4); // a scalar
    const std::uint64_t even[] = {6};
    CHECK(*safetensors_tensor_bytes("F4", even) == 3);
    const std::uint64_t four[] = {4};
    CHECK(*safetensors_tensor_bytes("F6_E2M3", four) == 3);
    const std::uint64_t odd[] = {3};
    CHECK_THAT(safetensors_tensor_bytes("F4", odd).error().message,
               Catch::Contains("not a whole number of bytes"));
    const std::uint64_t huge[] = {std::uint64_t{1} << 40, std::uint64_t{1} << 30};
    CHECK_THAT(safetensors_tensor_bytes("U8", huge).error().message, Catch::Contains("overflow"));
    CHECK_THAT(safetensors_tensor_bytes("F12", shape).error().message,
               Catch::Contains("unknown dtype 'F12'"));
}

TEST_CASE("every dtype is read at the writer's offset, relative to the end of the header") {
    wm::test::TempDir dir;
    const SafetensorsSpec spec = wm::test::every_dtype_safetensors_spec();
    const std::string path = dir.path() + "/every.safetensors";
    auto layout = write_safetensors(path, spec, DataFill::pattern);
    REQUIRE(layout);
    CHECK(layout->header.size() % 8 == 0); // padded with spaces, as the library writes it
    const std::string paths[] = {path};
    auto model = read_safetensors(paths);
    REQUIRE(model);
    REQUIRE(model->files.size() == 1);
    const ModelFile& f = model->files[0];
    CHECK(f.format == ModelFormat::safetensors);
    CHECK(f.data_offset == 8 + layout->header.size());
    CHECK(f.alignment == 1);
    CHECK(f.size == layout->file_size);
    REQUIRE(model->tensors.size() == spec.tensors.size());
    for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
        const TensorInfo& t = model->tensors[i];
        INFO(spec.tensors[i].name);
        CHECK(t.name == spec.tensors[i].name);
        CHECK(t.type == spec.tensors[i].dtype);
        CHECK(t.shape == spec.tensors[i].shape);
        CHECK(t.offset == layout->offsets[i]);
        CHECK(t.size == layout->sizes[i]);
        CHECK(byte_at(path, t.offset) == std::byte{model_pattern_byte(t.offset)});
    }
    CHECK(wm::test::model_invariant_violation(*model).empty());
}

TEST_CASE("__metadata__, unknown keys, any key order and holes between tensors are accepted") {
    const std::string header =
        R"({"__metadata__":{"format":"pt","nested":{"deep":[1,2,{"x":null}]}},)"
        R"("b":{"data_offsets":[16,24],"shape":[2],"dtype":"F32","extra":[true,1.5]},)"
        R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}   )";
    auto bytes = safetensors_bytes_from_header(header, 24);
    auto model = parse_safetensors(bytes, bytes.size(), "meta.safetensors");
    REQUIRE(model);
    REQUIRE(model->tensors.size() == 2);
    const std::uint64_t data = 8 + header.size();
    CHECK(model->tensors[0].name == "b");
    CHECK(model->tensors[0].offset == data + 16);
    CHECK(model->tensors[1].name == "a");
    CHECK(model->tensors[1].offset == data);
    CHECK(model->architecture.empty());
}

TEST_CASE("a sharded safetensors model is read through its index.json") {
    wm::test::TempDir dir;
    SafetensorsSpec shard1, shard2;
    shard1.tensors = {{"model.embed_tokens.weight", "BF16", {16, 8}, {}},
                      {"model.layers.0.self_attn.q_proj.weight", "BF16", {8, 8}, {}}};
    shard2.tensors = {{"model.layers.0.mlp.experts.0.up_proj.weight", "F8_E4M3", {8, 16}, {}},
                      {"lm_head.weight", "F32", {16, 8}, {}}};
    const std::string n1 = "model-00001-of-00002.safetensors",
                      n2 = "model-00002-of-00002.safetensors";
    REQUIRE(write_safetensors(dir.path() + "/" + n1, shard1, DataFill::pattern));
    REQUIRE(write_safetensors(dir.path() + "/" + n2, shard2, DataFill::pattern));
    std::vector<std::pair<std::string, std::string>> map = {
        {"lm_head.weight", n2},
        {"model.embed_tokens.weight", n1},
        {"model.layers.0.mlp.experts.0.up_proj.weight", n2},
        {"model.layers.0.self_attn.q_proj.weight", n1},
    };
    const std::string index = dir.path() + "/model.safetensors.index.json";

    SECTION("every shard, in file-name order") {
        REQUIRE(write_safetensors_index(index, map, 1234));
        const std::string paths[] = {index};
        auto model = read_model(paths);
        REQUIRE(model);
        REQUIRE(model->files.size() == 2);
        CHECK(model->files[0].path == dir.path() + "/" + n1);
        CHECK(model->files[1].path == dir.path() + "/" + n2);
        REQUIRE(model->tensors.size() == 4);
        CHECK(model->tensors[2].name == "model.layers.0.mlp.experts.0.up_proj.weight");
        CHECK(model->tensors[2].file == 1);
        CHECK(wm::test::model_invariant_violation(*model).empty());
    }
    SECTION("a tensor the index puts in the wrong shard") {
        map[0].second = n1;
        REQUIRE(write_safetensors_index(index, map, 0));
        const std::string paths[] = {index};
        auto r = read_safetensors(paths);
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("'lm_head.weight' is not in its shard"));
    }
    SECTION("a shard tensor the index does not list") {
        map.pop_back();
        REQUIRE(write_safetensors_index(index, map, 0));
        const std::string paths[] = {index};
        auto r = read_safetensors(paths);
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("is not in the index"));
    }
    SECTION("a shard path that leaves the index's directory") {
        map[0].second = "../" + n2;
        REQUIRE(write_safetensors_index(index, map, 0));
        const std::string paths[] = {index};
        auto r = read_safetensors(paths);
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("only a plain file name"));
    }
    SECTION("a missing shard") {
        map[0].second = "model-00003-of-00002.safetensors";
        REQUIRE(write_safetensors_index(index, map, 0));
        const std::string paths[] = {index};
        auto r = read_safetensors(paths);
        REQUIRE_FALSE(r);
        CHECK(r.error().kind == ErrorKind::io);
        CHECK_THAT(r.error().message, Catch::Contains("model-00003-of-00002.safetensors: open"));
    }
    SECTION("an index that is not one") {
        write_text(index, R"({"metadata":{},"weight_map":{"a":7}})");
        const std::string paths[] = {index};
        auto r = read_safetensors(paths);
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("must map to a file name string"));
        write_text(index, R"({"metadata":{}})");
        CHECK_THAT(read_safetensors(paths).error().message, Catch::Contains("no 'weight_map'"));
        write_text(index, R"({"weight_map":)");
        CHECK_THAT(read_safetensors(paths).error().message, Catch::Contains("malformed JSON"));
    }
    SECTION("shards given explicitly") {
        const std::string paths[] = {dir.path() + "/" + n2, dir.path() + "/" + n1};
        auto model = read_safetensors(paths);
        REQUIRE(model);
        CHECK(model->files[0].path == paths[0]);
        CHECK(model->tensors.size() == 4);
    }
    SECTION("a tensor in two shards") {
        const std::string paths[] = {dir.path() + "/" + n1, dir.path() + "/" + n1};
        auto r = read_safetensors(paths);
        REQUIRE_FALSE(r);
        CHECK_THAT(r.error().message, Catch::Contains("is in both"));
    }
}
