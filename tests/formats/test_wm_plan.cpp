// SPDX-License-Identifier: MIT
// The wm-plan binary (path in $WM_PLAN) and wm-gen-model (path in $WM_GEN_MODEL): the JSON is
// one object with the documented keys and types, consistent with the reader and with itself;
// the CPU region is always import and pins nothing; bad input is one line on stderr and exit
// status 1, never a crash.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "formats/run_process.hpp"
#include "formats/sample_models.hpp"
#include "testkit/synthetic_model.hpp"
#include "support/temp_file.hpp"
#include "weightmap/formats.hpp"

using namespace wm;
using namespace wm::testkit;
using nlohmann::json;

namespace {

struct Fixture {
    wm::test::TempDir dir;
    std::string model;
    SyntheticModel spec;
    Fixture() {
        SyntheticModelOptions o;
        o.layers = 6;
        o.experts = 16;
        o.vocab = 256;
        o.target_bytes = 24 << 20;
        spec = make_synthetic_model(o);
        model = dir.path() + "/moe.gguf";
        REQUIRE(write_gguf(model, spec.spec, DataFill::sparse));
    }
    wm::test::ProcessResult plan(std::vector<std::string> args) {
        args.insert(args.begin(), wm::test::tool_path("WM_PLAN"));
        return wm::test::run_process(args, dir.path());
    }
};

json parse_plan(const wm::test::ProcessResult& r) {
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(r.err.empty());
    json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    REQUIRE_FALSE(j.is_discarded());
    return j;
}

// Keys, types and the arithmetic that ties totals to tensors and runs.
void check_plan_json(const json& j, const ModelInfo& info) {
    REQUIRE(j.is_object());
    for (const char* key : {"import_policy", "files", "tensors", "regions", "totals"})
        REQUIRE(j.contains(key));
    CHECK(j.size() == 5);
    CHECK(j["import_policy"].is_string());

    REQUIRE(j["files"].size() == info.files.size());
    for (std::size_t i = 0; i < info.files.size(); ++i) {
        const json& f = j["files"][i];
        CHECK(f["path"] == info.files[i].path);
        CHECK(f["size"] == info.files[i].size);
        CHECK(f["format"] == to_string(info.files[i].format));
        CHECK(f["tensors"] == info.files[i].tensor_count);
    }

    REQUIRE(j["tensors"].size() == info.tensors.size());
    std::uint64_t device_bytes = 0;
    for (std::size_t i = 0; i < info.tensors.size(); ++i) {
        const json& t = j["tensors"][i];
        CHECK(t["name"] == info.tensors[i].name);
        CHECK(t["file"] == info.tensors[i].file);
        CHECK(t["offset"] == info.tensors[i].offset);
        CHECK(t["size"] == info.tensors[i].size);
        REQUIRE(t["target"].is_string());
        if (t["target"] != "CPU") device_bytes += info.tensors[i].size;
    }

    std::uint64_t pinned = 0, imports = 0;
    for (const json& r : j["regions"]) {
        for (const char* key : {"target", "device_memory", "file", "first", "last", "ctx_bytes",
                                "gate", "decision", "reason", "runs"})
            REQUIRE(r.contains(key));
        const std::string memory = r["device_memory"];
        CHECK((memory == "unified" || memory == "discrete" || memory == "unknown"));
        CHECK(r["target"].is_string());
        CHECK(r["file"].is_number_unsigned());
        CHECK(r["first"].is_number_unsigned());
        CHECK(r["last"].is_number_unsigned());
        CHECK(r["ctx_bytes"].is_number_unsigned());
        CHECK(r["gate"].is_boolean());
        CHECK(r["reason"].is_string());
        REQUIRE(r["runs"].is_array());
        CHECK(r["first"].get<std::uint64_t>() <= r["last"].get<std::uint64_t>());
        const std::string decision = r["decision"];
        CHECK((decision == "import" || decision == "fallback"));
        if (r["target"] == "CPU") {
            CHECK(decision == "import"); // passthrough: always import, pins nothing
            CHECK(r["runs"].empty());
            continue;
        }
        if (decision == "fallback") CHECK(r["runs"].empty());
        for (const json& run : r["runs"]) {
            CHECK(run["offset"].get<std::uint64_t>() % 4096 == 0);
            CHECK(run["size"].get<std::uint64_t>() % 4096 == 0);
            pinned += run["size"].get<std::uint64_t>();
            ++imports;
        }
    }
    const json& t = j["totals"];
    for (const char* key : {"device_bytes", "imported_bytes", "pinned_bytes", "fallback_bytes",
                            "imports"})
        REQUIRE(t[key].is_number_unsigned());
    CHECK(t["device_bytes"] == device_bytes);
    CHECK(t["imported_bytes"].get<std::uint64_t>() + t["fallback_bytes"].get<std::uint64_t>() ==
          device_bytes);
    CHECK(t["pinned_bytes"] == pinned);
    CHECK(t["imports"] == imports);
}

ModelInfo read(const std::string& path) {
    const std::string paths[] = {path};
    auto info = read_model(paths);
    REQUIRE(info);
    return std::move(info).value();
}

} // namespace

TEST_CASE("wm-plan --json: every tensor on the device") {
    Fixture f;
    const json j = parse_plan(f.plan({"--json", f.model}));
    const ModelInfo info = read(f.model);
    check_plan_json(j, info);
    REQUIRE(j["regions"].size() == 1);
    CHECK(j["regions"][0]["target"] == "device");
    CHECK(j["regions"][0]["gate"] == true);
    CHECK(j["regions"][0]["decision"] == "import");
    CHECK(j["totals"]["fallback_bytes"] == 0);
}

TEST_CASE("wm-plan --json --cpu-moe: experts on the CPU, the rest imported as tight runs") {
    Fixture f;
    const json j = parse_plan(f.plan({"--json", "--cpu-moe", f.model}));
    const ModelInfo info = read(f.model);
    check_plan_json(j, info);
    REQUIRE(j["regions"].size() == 2);
    const json& device = j["regions"][0];
    const json& cpu = j["regions"][1];
    CHECK(device["target"] == "device");
    CHECK(cpu["target"] == "CPU");
    CHECK(device["gate"] == false); // the experts sit between the layers' device tensors
    CHECK(device["decision"] == "import");
    CHECK(device["runs"].size() > 1);
    CHECK(j["totals"]["pinned_bytes"].get<std::uint64_t>() <
          device["last"].get<std::uint64_t>() - device["first"].get<std::uint64_t>());
    for (const json& t : j["tensors"]) {
        const std::string name = t["name"];
        CHECK((t["target"] == "CPU") == (name.find("_exps.") != std::string::npos));
    }

    SECTION("mode gate makes the device region fall back") {
        const json g = parse_plan(f.plan({"--json", "--cpu-moe", "--mode", "gate", f.model}));
        check_plan_json(g, info);
        CHECK(g["regions"][0]["decision"] == "fallback");
        CHECK(g["totals"]["imported_bytes"] == 0);
        CHECK(g["totals"]["pinned_bytes"] == 0);
    }
    SECTION("mode span pins the whole span") {
        const json s = parse_plan(f.plan({"--json", "--cpu-moe", "--mode", "span", f.model}));
        check_plan_json(s, info);
        CHECK(s["totals"]["pinned_bytes"].get<std::uint64_t>() >=
              device["last"].get<std::uint64_t>() - device["first"].get<std::uint64_t>());
    }
    SECTION("-ot with llama.cpp's spelling, and --align") {
        const json o =
            parse_plan(f.plan({"--json", "-ot", "exps=CPU", "--align", "65536", f.model}));
        check_plan_json(o, info);
        for (const json& run : o["regions"][0]["runs"])
            CHECK(run["offset"].get<std::uint64_t>() % 65536 == 0);
        CHECK(o["tensors"] == j["tensors"]);
    }
}

TEST_CASE("wm-plan --device and --import-policy: a discrete card imports nothing unless told to") {
    Fixture f;
    const ModelInfo info = read(f.model);
    const json unified = parse_plan(f.plan({"--json", f.model}));
    CHECK(unified["import_policy"] == "unified_only");
    CHECK(unified["regions"][0]["device_memory"] == "unified"); // wm-plan's assumption
    CHECK(unified["totals"]["fallback_bytes"] == 0);

    const json discrete = parse_plan(f.plan({"--json", "--device", "discrete", f.model}));
    check_plan_json(discrete, info);
    CHECK(discrete["regions"][0]["device_memory"] == "discrete");
    CHECK(discrete["regions"][0]["decision"] == "fallback");
    CHECK_THAT(discrete["regions"][0]["reason"].get<std::string>(),
               Catch::Contains("discrete device (--device discrete): imported weights would be "
                               "read over the bus on every use; import_policy=always to import "
                               "anyway"));
    CHECK(discrete["totals"]["imported_bytes"] == 0);
    CHECK(discrete["totals"]["imports"] == 0);

    const json always =
        parse_plan(f.plan({"--json", "--device", "discrete", "--import-policy", "always", f.model}));
    check_plan_json(always, info);
    CHECK(always["import_policy"] == "always");
    CHECK(always["regions"].size() == unified["regions"].size());
    CHECK(always["totals"] == unified["totals"]); // the same imports as on a unified device
    CHECK_THAT(always["regions"][0]["reason"].get<std::string>(),
               Catch::Contains("import_policy=always on a discrete device"));

    const json never = parse_plan(f.plan({"--json", "--import-policy", "never", f.model}));
    CHECK(never["regions"][0]["reason"] == "import_policy=never");
    CHECK(never["totals"]["imported_bytes"] == 0);
    const json unknown = parse_plan(f.plan({"--json", "--device", "unknown", f.model}));
    CHECK_THAT(unknown["regions"][0]["reason"].get<std::string>(),
               Catch::Contains("device memory unknown"));

    auto table = f.plan({"--device", "discrete", f.model});
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out, Catch::Contains("import policy unified_only"));
    CHECK_THAT(table.out, Catch::Contains("device memory discrete (--device discrete)"));
}

TEST_CASE("wm-plan --tensor-alignment: a device tensor off it falls back alone, with its reason") {
    Fixture f;
    // One tensor of every ggml type, packed at GGUF's 32-byte alignment: at the first larger
    // power of two that splits them, some are off and fall back, the others still import.
    const std::string model = f.dir.path() + "/every-type.gguf";
    REQUIRE(write_gguf(model, wm::test::every_type_gguf_spec(), DataFill::pattern));
    const ModelInfo info = read(model);
    std::uint64_t align = 0;
    std::set<std::string> off;
    for (std::uint64_t a = 64; a <= 4096 && align == 0; a *= 2) {
        off.clear();
        for (const auto& t : info.tensors)
            if (t.offset % a != 0) off.insert(t.name);
        if (!off.empty() && off.size() < info.tensors.size()) align = a;
    }
    REQUIRE(align != 0);
    const std::string arg = std::to_string(align);

    const json j = parse_plan(f.plan({"--json", "--tensor-alignment", arg, model}));
    check_plan_json(j, info);
    const json& device = j["regions"][0];
    CHECK(device["decision"] == "import");
    CHECK_THAT(device["reason"].get<std::string>(),
               Catch::Contains(fmt::format("{} tensor(s)", off.size())) &&
                   Catch::Contains("left out: their offsets are not multiples of the importer's "
                                   "tensor alignment " + arg));
    std::set<std::string> listed;
    for (const json& t : device["fallback_tensors"]) {
        listed.insert(t["name"].get<std::string>());
        const std::uint64_t offset = j["tensors"][t["tensor"].get<std::size_t>()]["offset"];
        CHECK(t["reason"] == fmt::format("offset {:#x} is not a multiple of the importer's tensor "
                                         "alignment {} (target 'device', importer 'device'): no "
                                         "import can serve it where its buffer needs it aligned",
                                         offset, align));
    }
    CHECK(listed == off);
    CHECK(j["totals"]["imported_bytes"].get<std::uint64_t>() > 0);

    // Without it (the default) nothing falls back alone.
    const json plain = parse_plan(f.plan({"--json", model}));
    CHECK(plain["regions"][0]["fallback_tensors"].empty());

    auto table = f.plan({"--tensor-alignment", arg, model});
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out, Catch::Contains("tensor alignment " + arg));
    CHECK_THAT(table.out, Catch::Contains("  falls back: "));
    CHECK_THAT(table.out,
               Catch::Contains("is not a multiple of the importer's tensor alignment " + arg));
}

TEST_CASE("wm-plan prints the table: regions, decisions, runs and totals") {
    Fixture f;
    auto r = f.plan({"--cpu-moe", f.model});
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("qwen3moe"));
    CHECK_THAT(r.out, Catch::Contains("decision"));
    CHECK_THAT(r.out, Catch::Contains("CPU passthrough"));
    CHECK_THAT(r.out, Catch::Contains("run   0: pin ["));
    CHECK_THAT(r.out, Catch::Contains("totals: device "));
}

TEST_CASE("wm-plan reads a split model from its first shard and a safetensors index") {
    Fixture f;
    // wm-gen-model, the real CLI, writes the split.
    auto gen = wm::test::run_process({wm::test::tool_path("WM_GEN_MODEL"), "--shape", "dense",
                                      "--layers", "3", "--vocab", "128", "--size-mib", "4",
                                      "--split", "3", "--alignment", "64", "-o",
                                      f.dir.path() + "/dense.gguf"},
                                     f.dir.path());
    INFO(gen.err);
    REQUIRE(gen.status == 0);
    const std::string first = f.dir.path() + "/dense-00001-of-00003.gguf";
    const json j = parse_plan(f.plan({"--json", first}));
    check_plan_json(j, read(first));
    CHECK(j["files"].size() == 3);
    CHECK(j["regions"].size() == 3); // one device region per file

    SafetensorsSpec shard;
    shard.tensors = {{"model.layers.0.mlp.experts.0.up_proj.weight", "BF16", {64, 64}, {}},
                     {"model.norm.weight", "F32", {64}, {}}};
    REQUIRE(write_safetensors(f.dir.path() + "/m-1.safetensors", shard, DataFill::sparse));
    const std::string index = f.dir.path() + "/model.safetensors.index.json";
    REQUIRE(
        write_safetensors_index(index,
                                {{"model.layers.0.mlp.experts.0.up_proj.weight", "m-1.safetensors"},
                                 {"model.norm.weight", "m-1.safetensors"}},
                                0));
    const json s = parse_plan(f.plan({"--json", "-ot", "experts=CPU", index}));
    check_plan_json(s, read(index));
    CHECK(s["files"][0]["format"] == "safetensors");
    CHECK(s["tensors"][0]["target"] == "CPU");
}

TEST_CASE("wm-plan: bad input is one line on stderr and exit status 1") {
    Fixture f;
    const std::string truncated = f.dir.path() + "/truncated.gguf";
    {
        auto bytes = gguf_bytes(wm::test::small_gguf_spec());
        REQUIRE(bytes);
        std::ofstream out(truncated, std::ios::binary);
        out.write(reinterpret_cast<const char*>(bytes->data()), 100);
    }
    const std::string garbage = f.dir.path() + "/garbage.gguf";
    std::ofstream(garbage) << "this is not a model\n";

    struct Bad {
        std::vector<std::string> args;
        const char* says;
    };
    const Bad cases[] = {
        {{f.dir.path() + "/missing.gguf"}, "No such file"},
        {{truncated}, "truncated"},
        {{garbage}, "neither GGUF"},
        {{f.dir.path()}, "not a regular file"},
        {{"-ot", "(unclosed=CPU", f.model}, "bad regular expression"},
        {{"-ot", "noequals", f.model}, "expected REGEX=TARGET"},
        {{"--align", "3", f.model}, "power of two"},
        {{"--tensor-alignment", "48", f.model}, "power of two"},
        {{"--mode", "fast", f.model}, "fast"},
        {{"--device", "apu", f.model}, "apu"},
        {{"--import-policy", "sometimes", f.model}, "sometimes"},
        {{"--bogus", f.model}, "--bogus"},
        {{}, "required"},
        {{f.model, garbage}, "neither GGUF"},
    };
    for (const Bad& c : cases) {
        INFO(fmt::format("{}", fmt::join(c.args, " ")));
        auto r = f.plan(c.args);
        INFO(r.err);
        CHECK(r.status == 1);
        CHECK(r.out.empty());
        REQUIRE_FALSE(r.err.empty());
        CHECK(r.err.back() == '\n');
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        CHECK_THAT(r.err, Catch::StartsWith("wm-plan: "));
        CHECK_THAT(r.err, Catch::Contains(c.says));
    }
}
