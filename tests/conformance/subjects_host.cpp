// SPDX-License-Identifier: MIT
// The conformance subjects that need no Vulkan device: the CPU passthrough, the HSA importer on
// the fake runtime (tests/hsa), the CUDA importer on the fake driver (tests/cuda), and the test
// fakes (tests/fakes). Public API only, apart from
// the fakes themselves.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conformance/subject.hpp"
#include "fakes/fake_importers.hpp"
#include "weightmap/backends/hsa.hpp"
#include "weightmap/planner.hpp"
#include "weightmap/registry.hpp"

#ifdef WM_CONFORMANCE_FAKE_HSA
#include "hsa/fake_hsa.hpp"
#endif
#ifdef WM_CONFORMANCE_FAKE_CUDA
#include "cuda/fake_cuda.hpp"
#include "weightmap/backends/cuda.hpp"
#endif

namespace wm::conformance {
namespace {

// A fake driver's counters are process-wide: `reset` them only when no instance of the subject
// is alive (case 4 holds two), never under a live one's baseline. Each instance keeps the
// returned token.
[[maybe_unused]] std::shared_ptr<void> baseline(std::weak_ptr<void>& alive, void (*reset)()) {
    std::shared_ptr<void> token = alive.lock();
    if (!token) {
        reset();
        token = std::make_shared<int>(0);
        alive = token;
    }
    return token;
}

Subject cpu_subject() {
    Subject s;
    s.name = "cpu";
    s.importer_name = "cpu";
    s.expect_cpu = true;
    s.has_read_back = true;
    s.has_copies = true;
    s.device_address_is_host = true;
    s.make = [] {
        Instance instance;
        instance.importer = make_cpu_importer();
        instance.observe = [] { return Observation{}; }; // no driver: nothing to count
        return instance;
    };
    return s;
}

Subject hsa_subject() {
    Subject s;
    s.name = "hsa-fake";
    s.importer_name = "hsa";
    s.has_read_back = true; // copies from host_address (the locked pages themselves)
    s.has_copies = false;
    s.device_address_is_host = false; // the fake's agent pointers are host + 2^44, like a dGPU
#ifdef WM_CONFORMANCE_FAKE_HSA
    s.make = [] {
        static std::weak_ptr<void> alive;
        std::shared_ptr<void> token = baseline(alive, [] { wm::test::FakeHsa::fresh(); });
        HsaImporterParams params; // every GPU agent of the fake, no budget
        params.library_path = WEIGHTMAP_FAKE_HSA_PATH;
        Result<std::unique_ptr<Importer>> made = make_hsa_importer(params);
        if (!made) throw std::runtime_error("make_hsa_importer: " + made.error().message);
        Instance instance;
        instance.keep_alive = token;
        instance.importer = std::move(made).value();
        instance.observe = [] {
            // A handle of our own on the fake (the same instance the importer dlopened);
            // FakeHsa::fresh() would reset the counters.
            static const wm::test::FakeHsa fake;
            Observation o;
            o.driver_calls = fake.lock_calls() + fake.unlock_calls();
            o.live = fake.live_locks();
            o.made = fake.lock_calls();
            o.destroyed = fake.unlock_calls();
            return o;
        };
        return instance;
    };
#else
    s.skip_reason = [] {
        return std::string("the HSA importer is not built (meson -Dhsa=enabled needs the ROCm "
                           "HSA headers, libhsa-runtime-dev)");
    };
    s.make = [] { return Instance{}; };
#endif
    return s;
}

#ifdef WM_CONFORMANCE_FAKE_CUDA
using CudaModel = wm::test::FakeCuda::Model;

template <CudaModel model>
void fresh_fake_cuda() {
    wm::test::FakeCuda::fresh().set_device_model(0, model);
}
#endif

// The CUDA importer on one device model of the fake driver (docs/cuda.md's table). A direct
// import calls no driver entry, so its subject counts live imports through the importer's state.
template <int model>
Subject cuda_subject(const char* name, bool direct) {
    Subject s;
    s.name = name;
    s.importer_name = "cuda";
    s.has_read_back = true;  // cuMemcpyDtoH from the device pointer (direct: through DtoD)
    s.has_copies = true;     // cuMemAlloc + cuMemcpyHtoD
    // the fake's device pointers are host + 2^57; a direct import's is the host pointer
    s.device_address_is_host = direct;
    if (model == 2) s.expect_memory = DeviceMemory::discrete; // the H200 on PCIe
    if (model == 1) s.expect_memory = DeviceMemory::coherent; // GH200: HBM, host over C2C
#ifdef WM_CONFORMANCE_FAKE_CUDA
    s.make = [direct] {
        static std::weak_ptr<void> alive; // the fake's cuInit is process-wide too
        std::shared_ptr<void> token =
            baseline(alive, &fresh_fake_cuda<static_cast<CudaModel>(model)>);
        CudaImporterParams params;
        params.library_path = WEIGHTMAP_FAKE_CUDA_PATH;
        params.allow_discrete = true; // the H200 imports too: the plan is not under test here
        Result<std::unique_ptr<Importer>> made = make_cuda_importer(params);
        if (!made) throw std::runtime_error("make_cuda_importer: " + made.error().message);
        Instance instance;
        instance.keep_alive = token;
        instance.importer = std::move(made).value();
        const Importer* importer = instance.importer.get();
        instance.observe = [importer, direct] {
            static const wm::test::FakeCuda fake; // FakeCuda::fresh() would reset the counters
            Observation o;
            if (!direct) {
                o.made = fake.calls("cuMemHostRegister_v2");
                o.destroyed = fake.calls("cuMemHostUnregister");
                o.driver_calls = *o.made + *o.destroyed + fake.calls("cuMemAlloc_v2") +
                                 fake.calls("cuMemFree_v2") + fake.calls("cuMemcpyDtoH_v2");
            }
            auto state = cuda_importer_state(*importer);
            o.live = fake.live_registrations() + fake.live_allocations() +
                     static_cast<std::int64_t>(state ? state->direct_imports : 0);
            return o;
        };
        return instance;
    };
#else
    (void)direct;
    s.skip_reason = [] { return std::string("the CUDA importer is not built (-Dcuda=disabled)"); };
    s.make = [] { return Instance{}; };
#endif
    return s;
}

Subject fake_subject(const std::string& name, bool device) {
    Subject s;
    s.name = name;
    s.importer_name = name;
    s.has_read_back = true; // the interface's default: memcpy from device_address
    s.has_copies = false;
    s.device_address_is_host = true;
    s.make = [name, device] {
        auto fake = std::make_unique<wm::test::FakeImporter>(
            name, device ? wm::test::device_caps(host_page_size()) : wm::test::unified_caps());
        fake->reject_unaligned = device;
        wm::test::FakeImporter* raw = fake.get();
        Instance instance;
        instance.importer = std::move(fake);
        instance.observe = [raw] {
            Observation o;
            o.live = raw->live_imports();
            o.made = static_cast<std::int64_t>(raw->imports().size());
            o.destroyed = static_cast<std::int64_t>(raw->releases().size());
            return o;
        };
        return instance;
    };
    return s;
}

} // namespace

const std::vector<Subject>& subjects() {
    // CUDA device models: 0 orin (registers), 1 gh200 and 3 gb10 (direct), 2 h200 (registers).
    static const std::vector<Subject> all = {cpu_subject(), hsa_subject(),
                                             cuda_subject<0>("cuda-fake", false),
                                             cuda_subject<1>("cuda-fake-gh200", true),
                                             cuda_subject<3>("cuda-fake-gb10", true),
                                             cuda_subject<2>("cuda-fake-h200", false),
                                             fake_subject("fake", false),
                                             fake_subject("fake-device", true)};
    return all;
}

} // namespace wm::conformance
