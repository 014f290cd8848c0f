// SPDX-License-Identifier: MIT
// Making a CUDA importer: which device, what it can do, and whether importing on it pays.
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "cuda_importer.hpp"
#include "backend_factories.hpp"
#include "internal/dl_resolve.hpp"
#include "weightmap/backends/cuda.hpp"

namespace wm {
namespace {

using namespace cuda;

CUcontext as_context(std::uint64_t value) {
    return reinterpret_cast<CUcontext>(static_cast<std::uintptr_t>(value));
}

// The engine's context's device, or device_ordinal's. invalid_argument: a context the driver
// refuses; unsupported: this machine has no such device.
Result<CUdevice> settle_device(const Driver& driver, const CudaImporterParams& params) {
    const Api& api = driver.api();
    if (params.context != 0) {
        const CUresult pushed = api.ctx_push_current(as_context(params.context));
        if (pushed != CUDA_SUCCESS)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("CudaImporterParams::context {:#x} cannot be made "
                                          "current in '{}': {}",
                                          params.context, driver.path(), driver.describe(pushed)));
        CUdevice device = 0;
        const CUresult got = api.ctx_get_device(&device);
        CUcontext popped = nullptr;
        api.ctx_pop_current(&popped);
        if (got != CUDA_SUCCESS)
            return make_error(ErrorKind::invalid_argument,
                              fmt::format("cuCtxGetDevice in CudaImporterParams::context {:#x} "
                                          "failed: {}", params.context, driver.describe(got)));
        return device;
    }
    int count = 0;
    if (const CUresult r = api.device_get_count(&count); r != CUDA_SUCCESS)
        return make_error(ErrorKind::unsupported,
                          fmt::format("cuDeviceGetCount failed in '{}': {}", driver.path(),
                                      driver.describe(r)));
    CUdevice device = 0;
    if (params.device_ordinal >= count ||
        api.device_get(&device, params.device_ordinal) != CUDA_SUCCESS)
        return make_error(ErrorKind::unsupported,
                          fmt::format("no CUDA device {} in '{}' (it has {})",
                                      params.device_ordinal, driver.path(), count));
    return device;
}

// An attribute the driver does not know (an older driver) reads as 0: the conservative answer.
bool attribute(const Api& api, CUdevice device, CUdevice_attribute which) {
    int value = 0;
    return api.device_get_attribute(&value, which, device) == CUDA_SUCCESS && value != 0;
}

// Integrated GPUs share the host's memory (Jetson; GB10, whose one LPDDR5X pool is all the
// memory it has). A device that is not integrated but reads pageable memory through the host's
// page tables (GH200, GB200, GB300: ATS over NVLink-C2C) reaches host memory coherently, yet has
// HBM of its own: reading weights over the link (~450 GB/s each way) instead of HBM (~4 TB/s,
// NVIDIA's GH200 datasheet) would decode several times slower, so it is coherent, which the
// default policy copies. Anything else reads an import over the bus: PR #22120 imported only
// where CU_DEVICE_ATTRIBUTE_INTEGRATED is set.
void classify(DeviceFacts& facts) {
    if (facts.integrated) {
        facts.memory = DeviceMemory::unified;
        facts.memory_note = facts.name + ": CU_DEVICE_ATTRIBUTE_INTEGRATED 1";
    } else if (facts.host_page_tables) {
        facts.memory = DeviceMemory::coherent;
        facts.memory_note = facts.name + ": CU_DEVICE_ATTRIBUTE_INTEGRATED 0, "
                                         "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 1";
    } else {
        facts.memory = DeviceMemory::discrete;
        facts.memory_note = facts.name + ": CU_DEVICE_ATTRIBUTE_INTEGRATED 0, "
                                         "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 0";
    }
}

// Direct where the device reads pageable memory through the host's page tables (hardware
// coherent: the CUDA programming guide's GH200 case; GB10 reports it too, sglang#37068), so
// nothing needs registering; registration where the device can map registered memory; else
// neither, with the reason. A device with PAGEABLE_MEMORY_ACCESS alone (HMM, software coherent)
// registers first: a mapped registration needs no page faults; it goes direct on an 801.
void choose_method(DeviceFacts& facts) {
    if (facts.pageable_access && facts.host_page_tables) {
        facts.method = CudaImportMethod::direct;
        facts.method_note = facts.name + ": PAGEABLE_MEMORY_ACCESS 1, "
                                         "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 1";
    } else if (!facts.host_register) {
        facts.method_note = fmt::format("'{}' does not support cuMemHostRegister "
                                        "(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED 0) and does "
                                        "not read pageable memory through the host's page tables",
                                        facts.name);
    } else if (!facts.can_map_host) {
        facts.method_note = fmt::format("'{}' cannot map host memory "
                                        "(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY 0)",
                                        facts.name);
    } else {
        facts.method = CudaImportMethod::register_host;
        facts.method_note = fmt::format(
            "{}: HOST_REGISTER_SUPPORTED 1, CAN_MAP_HOST_MEMORY 1, READ_ONLY_HOST_REGISTER_"
            "SUPPORTED {}, PAGEABLE_MEMORY_ACCESS {}",
            facts.name, facts.read_only_register ? 1 : 0, facts.pageable_access ? 1 : 0);
    }
}

DeviceFacts read_facts(const Api& api, CUdevice device) {
    DeviceFacts facts;
    facts.device = device;
    char name[256] = {};
    facts.name = api.device_get_name(name, sizeof name, device) == CUDA_SUCCESS && name[0] != '\0'
                     ? std::string(name, strnlen(name, sizeof name))
                     : fmt::format("CUDA device {}", device);
    facts.integrated = attribute(api, device, CU_DEVICE_ATTRIBUTE_INTEGRATED);
    facts.pageable_access = attribute(api, device, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS);
    facts.host_page_tables =
        attribute(api, device, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
    facts.read_only_register =
        attribute(api, device, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED);
    facts.host_register = attribute(api, device, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
    facts.can_map_host = attribute(api, device, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
    classify(facts);
    choose_method(facts);
    return facts;
}

// Whether imports may be made on this device, and why not.
Availability import_availability(const DeviceFacts& facts, bool allow_discrete) {
    if (facts.method == CudaImportMethod::unavailable) return {false, facts.method_note};
    if (facts.memory == DeviceMemory::discrete && !allow_discrete)
        return {false, fmt::format("'{}' is a discrete GPU ({}): every kernel read of an imported "
                                   "weight would cross the bus; CudaImporterParams::allow_discrete "
                                   "imports anyway, cuda_pin_fallbacks() makes the engine's copies "
                                   "DMA transfers instead",
                                   facts.name, facts.memory_note)};
    return {true, {}};
}

std::unique_ptr<Importer> unavailable(std::string reason) {
    return std::make_unique<CudaImporter>(nullptr, DeviceFacts{}, nullptr,
                                          Availability{false, std::move(reason)});
}

} // namespace

Result<std::unique_ptr<Importer>> make_cuda_importer(const CudaImporterParams& params) {
    if (params.device_ordinal < 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("CudaImporterParams::device_ordinal is {}, not a device "
                                      "ordinal", params.device_ordinal));
    const std::string path =
        internal::library_path(params.library_path, "WEIGHTMAP_CUDA_LIBRARY", "libcuda.so.1");
    auto driver = Driver::open(path);
    if (!driver) return unavailable(std::move(driver).error().message);
    Result<CUdevice> device = settle_device(*driver.value(), params);
    if (!device) {
        if (device.error().kind == ErrorKind::invalid_argument) return std::move(device).error();
        return unavailable(std::move(device).error().message);
    }
    DeviceFacts facts = read_facts(driver.value()->api(), device.value());
    if (params.device_memory != DeviceMemory::unknown) {
        facts.memory_note = fmt::format("CudaImporterParams::device_memory; the driver says {}: {}",
                                        to_string(facts.memory), facts.memory_note);
        facts.memory = params.device_memory;
    }
    Availability availability = import_availability(facts, params.allow_discrete);
    return std::unique_ptr<Importer>(std::make_unique<CudaImporter>(
        std::move(driver).value(), std::move(facts), as_context(params.context),
        std::move(availability)));
}

// The registry's "cuda": the primary context of device 0; WEIGHTMAP_CUDA_ALLOW_DISCRETE=1 is
// allow_discrete (for wm-load on a discrete card, the control runs of scripts/device-cuda.sh).
std::unique_ptr<Importer> create_default_cuda_importer() {
    CudaImporterParams params;
    const char* allow = std::getenv("WEIGHTMAP_CUDA_ALLOW_DISCRETE");
    params.allow_discrete = allow != nullptr && std::strcmp(allow, "1") == 0;
    auto importer = make_cuda_importer(params);
    // Default params are usable, so this cannot fail; stay non-null whatever happens.
    if (!importer) return unavailable(importer.error().message);
    return std::move(importer).value();
}

} // namespace wm
