// SPDX-License-Identifier: MIT
// The mapping policy over the registry's defaults with the registry's CUDA importer loading the
// fake driver (WEIGHTMAP_CUDA_LIBRARY): read-only registration keeps the weights read-only; a
// device without it makes the mapping writable; a discrete device that will not import does
// not count.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/fake_cuda.hpp"
#include "support/temp_file.hpp"
#include "weightmap/mapping.hpp"
#include "weightmap/registry.hpp"

using namespace wm;
using wm::test::FakeCuda;

namespace {
// The registry's importer loads the fake, which stays loaded meanwhile (FakeCuda holds it), so
// its process-lifetime state is never allocated twice.
struct FakeDriverForTheRegistry {
    FakeCuda& fake = FakeCuda::fresh();
    FakeDriverForTheRegistry() { setenv("WEIGHTMAP_CUDA_LIBRARY", WEIGHTMAP_FAKE_CUDA_PATH, 1); }
    ~FakeDriverForTheRegistry() {
        unsetenv("WEIGHTMAP_CUDA_LIBRARY");
        unsetenv("WEIGHTMAP_CUDA_ALLOW_DISCRETE");
    }
};

MappingDecision decide_for_two_files() {
    wm::test::TempFile a(8192), b(4096);
    std::vector<std::string> paths{a.path(), b.path()};
    return decide_mapping(paths, {});
}
} // namespace

TEST_CASE("read-only registration keeps the weight files read-only", "[mapping][cuda]") {
    FakeDriverForTheRegistry driver;
    auto cuda = create_importer("cuda");
    REQUIRE(cuda.ok()); // the registry found the fake
    CHECK_FALSE(cuda.value()->caps().needs_writable_mapping);
    MappingDecision d = decide_for_two_files();
    CHECK(d.access == MappingAccess::read_only);
}

TEST_CASE("a device without read-only registration makes the mapping writable",
          "[mapping][cuda]") {
    FakeDriverForTheRegistry driver;
    driver.fake.set_attribute(0, cuda::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0);
    MappingDecision d = decide_for_two_files();
    CHECK(d.access == MappingAccess::writable);
    CHECK_THAT(d.reason, Catch::Contains("'cuda'"));
}

TEST_CASE("a discrete device does not import, so it never asks for a writable mapping",
          "[mapping][cuda]") {
    FakeDriverForTheRegistry driver;
    driver.fake.set_device_model(0, FakeCuda::Model::discrete);
    driver.fake.set_attribute(0, cuda::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0);
    CHECK(decide_for_two_files().access == MappingAccess::read_only);
    // The registry's opt-in makes it available; under unified_only it still would not import.
    setenv("WEIGHTMAP_CUDA_ALLOW_DISCRETE", "1", 1);
    auto cuda = create_importer("cuda");
    REQUIRE(cuda.ok());
    CHECK(cuda.value()->caps().device_memory == DeviceMemory::discrete);
    CHECK(decide_for_two_files().access == MappingAccess::read_only);
    wm::test::TempFile a(4096);
    std::vector<std::string> paths{a.path()};
    CHECK(decide_mapping(paths, {}, ImportPolicy::always).access == MappingAccess::writable);
}

TEST_CASE("each device model's method decides the mapping", "[mapping][cuda]") {
    struct Case {
        FakeCuda::Model model;
        MappingAccess access; // under ImportPolicy::always, the discrete cards opted in
    };
    // Direct (GH200, GB10) registers nothing and READ_ONLY registration (Orin, H200) keeps the
    // pages read-only; only the B300 (no READ_ONLY, vllm-omni#6240) needs them writable.
    const Case cases[] = {{FakeCuda::Model::orin, MappingAccess::read_only},
                          {FakeCuda::Model::gh200, MappingAccess::read_only},
                          {FakeCuda::Model::gb10, MappingAccess::read_only},
                          {FakeCuda::Model::h200, MappingAccess::read_only},
                          {FakeCuda::Model::b300, MappingAccess::writable}};
    for (const Case& c : cases) {
        FakeDriverForTheRegistry driver; // unsets the opt-in again
        setenv("WEIGHTMAP_CUDA_ALLOW_DISCRETE", "1", 1);
        driver.fake.set_device_model(0, c.model);
        wm::test::TempFile a(4096);
        std::vector<std::string> paths{a.path()};
        INFO("model " << static_cast<int>(c.model));
        const MappingDecision d = decide_mapping(paths, {}, ImportPolicy::always);
        INFO(d.reason);
        CHECK(d.access == c.access);
    }
}
