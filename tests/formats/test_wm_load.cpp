// SPDX-License-Identifier: MIT
// The wm-load binary (path in $WM_LOAD) with the CPU importer standing in for a unified-memory
// device (it runs on every machine): it prints the device kind and policy it loaded under, and
// --device / --import-policy change what is imported, --no-populate skips the read-ahead, every
// tensor verified either way.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "formats/run_process.hpp"
#include "support/dirty_pages.hpp"
#include "support/temp_file.hpp"
#include "testkit/synthetic_model.hpp"

using namespace wm;
using namespace wm::testkit;
using nlohmann::json;

namespace {

struct Fixture {
    wm::test::TempDir dir;
    std::string model;
    Fixture() {
        SyntheticModelOptions o;
        o.layers = 4;
        o.experts = 0;
        o.vocab = 256;
        o.target_bytes = 8 << 20;
        model = dir.path() + "/dense.gguf";
        REQUIRE(write_gguf(model, make_synthetic_model(o).spec, DataFill::pattern));
    }
    json load(std::vector<std::string> args, const char* importer = "cpu") {
        args.insert(args.begin(), {wm::test::tool_path("WM_LOAD"), "--importer", importer,
                                   "--json"});
        args.push_back(model);
        const auto r = wm::test::run_process(args, dir.path());
        INFO(r.err);
        REQUIRE(r.status == 0);
        json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
        REQUIRE_FALSE(j.is_discarded());
        CHECK(j["tensors_mismatched"] == 0);
        CHECK(j["tensors_verified"].get<int>() > 0);
        return j;
    }
};

} // namespace

TEST_CASE("wm-load reports the device kind and the policy, and --device changes the plan") {
    Fixture f;
    const json unified = f.load({});
    CHECK(unified["device_memory"] == "unified");
    CHECK(unified["device_memory_note"] == "the CPU reads its own memory");
    CHECK(unified["import_policy"] == "unified_only");
    CHECK(unified["fallback_bytes"] == 0);
    CHECK(unified["imports"] == 1);

    const json discrete = f.load({"--device", "discrete"});
    CHECK(discrete["imports"] == 0);
    CHECK(discrete["imported_bytes"] == 0);
    CHECK(discrete["copied_bytes"] == discrete["device_bytes"]);

    const json always = f.load({"--device", "discrete", "--import-policy", "always"});
    CHECK(always["import_policy"] == "always");
    CHECK(always["imported_bytes"] == unified["imported_bytes"]);

    const json never = f.load({"--import-policy", "never"});
    CHECK(never["imports"] == 0);

    // the import extents are read in ahead of the import unless --no-populate
    CHECK(unified["populate_seconds"].get<double>() > 0);
    const json cold = f.load({"--no-populate"});
    CHECK(cold["populate_seconds"].get<double>() == 0);
    CHECK(cold["imported_bytes"] == unified["imported_bytes"]);

    const auto text = wm::test::run_process(
        {wm::test::tool_path("WM_LOAD"), "--importer", "cpu", f.model}, f.dir.path());
    REQUIRE(text.status == 0);
    CHECK_THAT(text.out, Catch::Contains("device memory   unified (the CPU reads its own memory), "
                                         "import policy unified_only"));
}

#ifdef WEIGHTMAP_FAKE_CUDA_PATH
// wm-load's own process loads the fake driver (it fails the process at exit on a leak), so these
// runs also prove wm-load releases every registration and copy.
TEST_CASE("wm-load --importer cuda imports on an integrated device and verifies through it") {
    Fixture f;
    setenv("WEIGHTMAP_CUDA_LIBRARY", WEIGHTMAP_FAKE_CUDA_PATH, 1);
    const json integrated = f.load({}, "cuda");
    CHECK(integrated["importer"] == "cuda");
    CHECK(integrated["device_memory"] == "unified");
    CHECK(integrated["device_memory_note"] ==
          "Orin: CU_DEVICE_ATTRIBUTE_INTEGRATED 1; import method register");
    CHECK(integrated["imports"].get<int>() >= 1);
    CHECK(integrated["cuda_method"] == "register");
    CHECK(integrated["registrations"] == integrated["imports"]);
    CHECK(integrated["fallback_bytes"] == 0);

    // A discrete card is unavailable by default, and with the opt-in the plan still copies.
    setenv("WEIGHTMAP_FAKE_CUDA_MODEL", "h200", 1);
    const auto refused = wm::test::run_process(
        {wm::test::tool_path("WM_LOAD"), "--importer", "cuda", f.model}, f.dir.path());
    CHECK(refused.status != 0);
    CHECK_THAT(refused.err, Catch::Contains("'NVIDIA H200' is a discrete GPU"));
    setenv("WEIGHTMAP_CUDA_ALLOW_DISCRETE", "1", 1);
    const json discrete = f.load({}, "cuda");
    CHECK(discrete["device_memory"] == "discrete");
    CHECK(discrete["imports"] == 0);
    CHECK(discrete["copied_bytes"] == discrete["device_bytes"]);
    unsetenv("WEIGHTMAP_CUDA_ALLOW_DISCRETE");
    unsetenv("WEIGHTMAP_FAKE_CUDA_MODEL");
    unsetenv("WEIGHTMAP_CUDA_LIBRARY");
}

TEST_CASE("wm-load --importer cuda loads with each device model's method") {
    Fixture f;
    setenv("WEIGHTMAP_CUDA_LIBRARY", WEIGHTMAP_FAKE_CUDA_PATH, 1);
    // GH200 reads host memory over NVLink-C2C but has HBM: copied by default, with the reason
    setenv("WEIGHTMAP_FAKE_CUDA_MODEL", "gh200", 1);
    const json hbm = f.load({}, "cuda");
    CHECK(hbm["device_memory"] == "coherent");
    CHECK(hbm["imported_bytes"] == 0);
    CHECK(hbm["copied_bytes"] == hbm["device_bytes"]);
    for (const char* coherent : {"gh200", "gb10"}) { // direct: nothing registered, all in place
        INFO(coherent);
        setenv("WEIGHTMAP_FAKE_CUDA_MODEL", coherent, 1);
        const json direct =
            f.load(std::string(coherent) == "gh200" ? std::vector<std::string>{"--import-policy",
                                                                               "always"}
                                                    : std::vector<std::string>{},
                   "cuda");
        CHECK(direct["cuda_method"] == "direct");
        CHECK(direct["registrations"] == 0);
        CHECK(direct["mapping"] == "read_only");
        CHECK(direct["imported_bytes"] == direct["device_bytes"]);
        CHECK(direct["copied_bytes"] == 0);
        // The copy arm reads each tensor from the file, not out of the mapped pages.
        const json copied = f.load({"--copy"}, "cuda");
        CHECK(copied["copies_staged"] == true);
        CHECK(copied["copied_bytes"] == copied["device_bytes"]);
    }
    // Discrete cards: unavailable by default, registered under --import-policy always; the B300
    // has no READ_ONLY, so its mapping is writable (vllm-omni#6240).
    for (const char* discrete : {"h200", "b300"}) {
        INFO(discrete);
        setenv("WEIGHTMAP_FAKE_CUDA_MODEL", discrete, 1);
        const auto refused = wm::test::run_process(
            {wm::test::tool_path("WM_LOAD"), "--importer", "cuda", f.model}, f.dir.path());
        // Not 1 under LeakSanitizer: the fake's state outlives its dlclose when wm-load stops
        // early (a fake's artefact, as in the case above).
        CHECK(refused.status != 0);
        CHECK_THAT(refused.err, Catch::Contains("is a discrete GPU"));
        const json always = f.load({"--import-policy", "always"}, "cuda");
        CHECK(always["cuda_method"] == "register");
        CHECK(always["registrations"] == always["imports"]);
        CHECK(always["imported_bytes"] == always["device_bytes"]);
        CHECK(always["copies_staged"] == false);
        CHECK(always["mapping"] == (std::string(discrete) == "b300" ? "writable" : "read_only"));
    }
    setenv("WEIGHTMAP_FAKE_CUDA_MODEL", "tegra-x1", 1);
    const auto nano = wm::test::run_process(
        {wm::test::tool_path("WM_LOAD"), "--importer", "cuda", f.model}, f.dir.path());
    CHECK(nano.status != 0);
    CHECK_THAT(nano.err, Catch::Contains("does not support cuMemHostRegister"));
    unsetenv("WEIGHTMAP_FAKE_CUDA_MODEL");
    unsetenv("WEIGHTMAP_CUDA_LIBRARY");
}
#endif

#ifdef WEIGHTMAP_FAKE_HSA_PATH
TEST_CASE("wm-load --importer hsa on a runtime that refuses read-only locks: copies, and the "
          "model file stays clean") {
    Fixture f;
    REQUIRE(wm::test::write_back(f.model));
    const std::int64_t mtime = wm::test::mtime_ns_of(f.model);
    setenv("WEIGHTMAP_HSA_LIBRARY", WEIGHTMAP_FAKE_HSA_PATH, 1);
    setenv("WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY", "1", 1);
    const auto r = wm::test::run_process(
        {wm::test::tool_path("WM_LOAD"), "--importer", "hsa", "--json", f.model}, f.dir.path());
    unsetenv("WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY");
    unsetenv("WEIGHTMAP_HSA_LIBRARY");
    INFO(r.err);
    REQUIRE(r.status == 0);
    const json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["mapping"] == "read_only");
    CHECK(j["imported_bytes"] == 0);
    CHECK(j["fallback_bytes"] == j["device_bytes"]);
    CHECK(j["copies_unsupported"] == true); // HSA makes no copies: the engine's to make
    CHECK_THAT(r.err, Catch::Contains("would dirty the model file"));
    CHECK(wm::test::mtime_ns_of(f.model) == mtime);
}
#endif
