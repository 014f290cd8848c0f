// SPDX-License-Identifier: MIT
// The mapping policy over the registry's own defaults, with the registry's HSA importer loading
// the fake runtime (WEIGHTMAP_HSA_LIBRARY): the upstream bug — the capability probe walked only
// the engine's explicit device list, never saw the importer, and so never made the mapping
// writable — fails here, because nothing on CI needs a writable mapping otherwise.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "hsa/fake_hsa.hpp"
#include "support/child.hpp"
#include "support/skip.hpp"
#include "support/temp_file.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/registry.hpp"

using namespace wm;

namespace {
// The registry's HSA importer loads the fake runtime. The fake stays loaded meanwhile (FakeHsa
// holds it): its state is a deliberate process-lifetime singleton, and every dlclose + dlopen
// of the library would allocate a new one, which LeakSanitizer rightly reports.
struct FakeRuntimeForTheRegistry {
    wm::test::FakeHsa loaded;
    FakeRuntimeForTheRegistry() { setenv("WEIGHTMAP_HSA_LIBRARY", WEIGHTMAP_FAKE_HSA_PATH, 1); }
    ~FakeRuntimeForTheRegistry() { unsetenv("WEIGHTMAP_HSA_LIBRARY"); }
};
} // namespace

TEST_CASE("no importer list: the registry's HSA importer makes the mapping writable",
          "[mapping][hsa]") {
    FakeRuntimeForTheRegistry fake;
    auto hsa = create_importer("hsa");
    REQUIRE(hsa.ok()); // the fake runtime is what the registry found
    REQUIRE(hsa.value()->caps().needs_writable_mapping);

    wm::test::TempFile a(8192), b(4096);
    std::vector<std::string> paths{a.path(), b.path()};
    MappingDecision d = decide_mapping(paths, {});
    CHECK(d.access == MappingAccess::writable);
    CHECK(d.reason.find("'hsa'") != std::string::npos);
    CHECK(d.unwritable_path.empty());

    // And the mapping the decision leads to is really shared and writable.
    auto mapped = MappedModel::open(paths, d.access);
    REQUIRE(mapped.ok());
    CHECK(mapped->access() == MappingAccess::writable);
    CHECK_FALSE(mapped->is_read_only());
}

TEST_CASE("no importer list, one read-only shard: read-only, naming the shard",
          "[mapping][hsa][may_skip]") {
    FakeRuntimeForTheRegistry fake;
    wm::test::TempDir writable_dir, ro_dir;
    wm::test::TempFile a(4096);
    const std::string ro_path = ro_dir.path() + "/shard-2.gguf";
    REQUIRE(std::system(("cp " + a.path() + " " + ro_path).c_str()) == 0);
    std::vector<std::string> paths{a.path(), ro_path};
    // Root opens a 0444 file O_RDWR: only a read-only mount shows the policy to root.
    auto child = wm::test::run_in_child([&] {
        if (!wm::test::remount_read_only_in_private_namespace(ro_dir.path())) return 77;
        MappingDecision d = decide_mapping(paths, {});
        if (d.access != MappingAccess::read_only) return 1;
        if (d.unwritable_path != ro_path) return 2;
        if (d.reason.find("weight file not writable: " + ro_path) == std::string::npos) return 3;
        return 0;
    });
    REQUIRE(child.exited);
    if (child.code == 77)
        return wm::test::skip("unshare(CLONE_NEWNS) is not permitted here (a read-only mount)");
    CHECK(child.code == 0);
}

TEST_CASE("every registry entry's static caps agree with its importer's", "[registry][hsa]") {
    FakeRuntimeForTheRegistry fake;
    for (const ImporterEntry& entry : importer_registry()) {
        if (!entry.built) continue;
        INFO(entry.name);
        auto importer = entry.create_default();
        REQUIRE(importer != nullptr);
        // decide_mapping skips entries without the static cap: one whose importer does need a
        // writable mapping would silently keep HSA-style imports failing.
        if (importer->caps().needs_writable_mapping) CHECK(entry.may_need_writable_mapping);
    }
}
