// SPDX-License-Identifier: MIT
// -ot placement rules as llama.cpp applies them (regex searched in the name, first match wins,
// "device" by default, "CPU" is the CPU) and the ModelDesc they make for the planner.
#include <catch2/catch.hpp>

#include "weightmap/placement_rules.hpp"

using namespace wm;

TEST_CASE("a rule's regex is searched in the name and the first matching rule wins") {
    PlacementRules rules;
    CHECK(rules.target_for("blk.0.attn_q.weight") == "device");
    REQUIRE(rules.add_override(R"(blk\.0\.=Vulkan1)"));
    REQUIRE(rules.add_override("exps=CPU"));
    REQUIRE(rules.add_override("blk=Vulkan2"));
    CHECK(rules.target_for("blk.0.ffn_up_exps.weight") == "Vulkan1"); // first match wins
    CHECK(rules.target_for("blk.1.ffn_up_exps.weight") == "CPU");     // searched, not matched whole
    CHECK(rules.target_for("blk.1.attn_q.weight") == "Vulkan2");
    CHECK(rules.target_for("output.weight") == "device");
    REQUIRE(rules.rules().size() == 3);
    CHECK(rules.rules()[1].pattern == "exps");
    CHECK(rules.rules()[1].target == "CPU");
}

TEST_CASE("--cpu-moe puts every expert tensor on the CPU and nothing else") {
    PlacementRules rules;
    rules.add_cpu_moe();
    for (const char* name : {"blk.0.ffn_up_exps.weight", "blk.12.ffn_down_exps.weight",
                             "blk.3.ffn_gate_exps.weight", "blk.3.ffn_gate_up_exps.weight",
                             "blk.7.ffn_down_chexps.weight"})
        CHECK(rules.target_for(name) == "CPU");
    for (const char* name : {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_up_shexp.weight",
                             "blk.0.ffn_up.weight", "blk.0.attn_k.weight", "token_embd.weight"})
        CHECK(rules.target_for(name) == "device");
}

TEST_CASE("-ot arguments: split at the last '=', llama.cpp's comma lists, regex commas kept") {
    PlacementRules rules;
    REQUIRE(rules.add_override("a=b=CPU")); // the regex holds '='
    CHECK(rules.rules().back().pattern == "a=b");
    REQUIRE(rules.add_override("ffn_up=CPU,ffn_down=GPU1"));
    REQUIRE(rules.rules().size() == 3);
    CHECK(rules.rules()[2].pattern == "ffn_down");
    CHECK(rules.rules()[2].target == "GPU1");
    REQUIRE(rules.add_override(R"(blk\.[0-9]{1,2}\.=CPU)")); // comma inside the regex
    CHECK(rules.rules().back().pattern == R"(blk\.[0-9]{1,2}\.)");
    CHECK(rules.target_for("blk.42.x") == "CPU");
}

TEST_CASE("a bad rule is refused and leaves the rules as they were") {
    PlacementRules rules;
    REQUIRE(rules.add_override("keep=CPU"));
    for (const char* bad : {"(unclosed=CPU", "noequals", "=CPU", "x=", "a=CPU,(=CPU"}) {
        INFO(bad);
        Status s = rules.add_override(bad);
        REQUIRE_FALSE(s);
        CHECK(s.error().kind == ErrorKind::invalid_argument);
        CHECK(rules.rules().size() == 1);
    }
    CHECK_THAT(rules.add_override("(unclosed=CPU").error().message,
               Catch::Contains("bad regular expression"));
}

TEST_CASE("names of the longest length a reader accepts do not exhaust the regex engine") {
    // libstdc++'s std::regex recurses once per character for a repeated group: the reader's
    // name limit is what keeps that recursion shallow.
    PlacementRules rules;
    REQUIRE(rules.add_override(R"(^([a-z]|\.)*x$=CPU)"));
    const std::string name(ReadLimits{}.max_name_length, 'a');
    CHECK(rules.target_for(name) == "device");
    CHECK(rules.target_for(name + "x") == "CPU");
}

namespace {

ModelInfo three_tensor_model() {
    ModelInfo m;
    m.files = {{"a.gguf", 1000, ModelFormat::gguf, 3, 32, 64, 3, 0, 0}};
    m.tensors = {{"blk.0.ffn_up_exps.weight", 0, 64, 100, "F32", {25}},
                 {"blk.0.attn_q.weight", 0, 192, 100, "F32", {25}},
                 {"output.weight", 0, 320, 100, "F32", {25}}};
    return m;
}

Result<TargetDesc> simple_target(std::string_view name) {
    TargetDesc t;
    t.name = "ignored";
    t.caps.is_cpu = name == cpu_target_name;
    t.caps.alignment = 4096;
    return t;
}

} // namespace

TEST_CASE("to_model_desc: targets in order of first use, the CPU last, tensors in order") {
    PlacementRules rules;
    rules.add_cpu_moe();
    REQUIRE(rules.add_override("output=GPU1"));
    auto desc = to_model_desc(three_tensor_model(), rules, simple_target);
    REQUIRE(desc);
    REQUIRE(desc->targets.size() == 3);
    CHECK(desc->targets[0].name == "device");
    CHECK(desc->targets[1].name == "GPU1");
    CHECK(desc->targets[2].name == "CPU");
    CHECK(desc->targets[2].caps.is_cpu);
    REQUIRE(desc->tensors.size() == 3);
    CHECK(desc->tensors[0].target == 2);
    CHECK(desc->tensors[1].target == 0);
    CHECK(desc->tensors[2].target == 1);
    CHECK(desc->tensors[1].offset == 192);
    CHECK(desc->tensors[1].size == 100);
    REQUIRE(desc->files.size() == 1);
    CHECK(desc->files[0].path == "a.gguf");
    CHECK(desc->files[0].size == 1000);
}

TEST_CASE("to_model_desc refuses a factory's error, a CPU mix-up and a bad file index") {
    PlacementRules rules;
    rules.add_cpu_moe();
    auto refused = to_model_desc(three_tensor_model(), rules, [](std::string_view name)
                                                                  -> Result<TargetDesc> {
        if (name == "device") return make_error(ErrorKind::unsupported, "no importer for device");
        return simple_target(name);
    });
    REQUIRE_FALSE(refused);
    CHECK(refused.error().message == "no importer for device");

    auto mixed = to_model_desc(three_tensor_model(), rules,
                               [](std::string_view) -> Result<TargetDesc> { return TargetDesc{}; });
    REQUIRE_FALSE(mixed);
    CHECK_THAT(mixed.error().message, Catch::Contains("\"CPU\" is the CPU"));

    ModelInfo bad = three_tensor_model();
    bad.tensors[1].file = 4;
    auto out_of_range = to_model_desc(bad, rules, simple_target);
    REQUIRE_FALSE(out_of_range);
    CHECK_THAT(out_of_range.error().message, Catch::Contains("file index 4 out of range"));
}
