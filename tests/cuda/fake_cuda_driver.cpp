// SPDX-License-Identifier: MIT
// A fake CUDA driver, loaded by the CUDA importer in place of libcuda.so.1. It exports the entry
// points the importer uses, only under the versioned names cuda.h maps them to and with the
// signatures backends/cuda/cuda_driver.hpp declares (static_asserts below, so a drift fails to
// compile), and enforces what NVIDIA's CUDA Driver API reference ("the reference" below) states:
//   * nothing but cuDriverGetVersion and cuGetErrorName/String works before cuInit(0);
//   * memory calls need a current, retained context, and use its device's attributes;
//   * cuMemHostRegister refuses ranges that are unmapped, overlap a registration, or are mapped
//     read-only without CU_MEMHOSTREGISTER_READ_ONLY (where the device needs it);
//   * device pointers live in the fake's own address ranges, never equal to a host pointer, except
//     a plain host pointer, which only a device with PAGEABLE_MEMORY_ACCESS may dereference (any
//     other device doing so is a misuse: real hardware would fault);
//   * each device is one of the models docs/cuda.md tabulates, with its sources;
//   * every registration, allocation and primary-context retain needs its undo: library unload
//     reports what is live, and any misuse, and ends the process with status 1.
// Where the reference names no error code for a refusal, the comment says which code the fake
// picked. Tests steer it through the fake_cuda_* functions (looked up with dlsym).
#include <array>
#include <cinttypes>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "cuda/cuda_driver.hpp"

using namespace wm::cuda;

// A primary context: the one per device. CUcontext points at one of these.
struct wm::cuda::CUctx_st {
    CUdevice device = 0;
    long refcount = 0; // live while > 0
};

namespace {

using Guard = std::lock_guard<std::mutex>;

constexpr int max_devices = 8;
constexpr int default_driver_version = 12040; // CUDA 12.4
// Device pointers of mapped host memory are host + this; allocations start at alloc_base. Both
// lie above any user-space address Linux hands out (at most 57 bits), so a device pointer never
// equals a host pointer and the two ranges never meet (host + aperture < 2^58 < alloc_base).
constexpr CUdeviceptr mapped_aperture = CUdeviceptr{1} << 57;
constexpr CUdeviceptr alloc_base = CUdeviceptr{1} << 59;
// cuMemAlloc rounds to this; the reference only promises "suitably aligned for any kind of
// variable", 512 is the fake's choice.
constexpr CUdeviceptr alloc_alignment = 512;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;
constexpr unsigned register_flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                    CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;

// Every exported entry point, by the name fake_cuda_fail_at and fake_cuda_calls take.
constexpr std::array<std::string_view, 22> entry_names = {
    "cuInit", "cuDriverGetVersion", "cuGetErrorName", "cuGetErrorString", "cuDeviceGetCount",
    "cuDeviceGet", "cuDeviceGetName", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxGetDevice",
    "cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemHostGetDevicePointer_v2",
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2",
    "cuMemcpy",
};

// An entry's index, at compile time: entries pass their own __func__, so a name missing from
// the table fails to compile.
consteval std::size_t entry(std::string_view name) {
    for (std::size_t i = 0; i < entry_names.size(); ++i)
        if (entry_names[i] == name) return i;
    throw "not an entry point of the fake";
}

// The index of `name` at run time; -1 for a name the fake does not export.
int entry_at(const char* name) {
    for (std::size_t i = 0; name != nullptr && i < entry_names.size(); ++i)
        if (entry_names[i] == name) return static_cast<int>(i);
    return -1;
}

// The attributes the fake knows, in the order of Model::values; any other is refused.
constexpr std::array<CUdevice_attribute, 8> known_attributes = {
    CU_DEVICE_ATTRIBUTE_INTEGRATED,
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
    CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
    CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
    CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
};
using Attributes = std::array<int, known_attributes.size()>;

int attribute_index(CUdevice_attribute attribute) {
    for (std::size_t i = 0; i < known_attributes.size(); ++i)
        if (known_attributes[i] == attribute) return static_cast<int>(i);
    return -1;
}

// What a device is (fake_cuda_set_device_model): its name, its attributes and what
// cuMemHostRegister answers past its argument checks. docs/cuda.md has the table these come
// from, a source per value; where nobody says, the value is the fake's assumption, marked "(a)".
// Attribute order: INTEGRATED, CAN_MAP_HOST_MEMORY, UNIFIED_ADDRESSING, PAGEABLE_MEMORY_ACCESS,
// CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, HOST_REGISTER_SUPPORTED,
// PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, READ_ONLY_HOST_REGISTER_SUPPORTED.
// `memory`: what cuMemAlloc can hand out on it, past which it is CUDA_ERROR_OUT_OF_MEMORY before
// any calloc (so a test reaches that result without a host allocation the sanitizers refuse):
// the HBM of a card or of GH200 (whose 480 GB of LPDDR5X are the host's), the one pool an
// integrated device shares with the host (datasheets).
struct Model {
    const char* key; // WEIGHTMAP_FAKE_CUDA_MODEL
    const char* name;
    Attributes values;
    CUresult register_result;
    std::uint64_t memory;
};
constexpr Model models[] = {
    // 0 Jetson AGX Orin: integrated, I/O coherent since Xavier (host registration works:
    // open-mpi#9851, CUDA for Tegra); no ATS (llmfit#792); READ_ONLY 1 (a)
    {"orin", "Orin", {1, 1, 1, 0, 1, 1, 0, 1}, CUDA_SUCCESS, 64 * GiB},
    // 1 GH200: hardware coherent, pageable memory through the host's page tables (programming
    // guide, unified memory); registration only populates pages there (Driver API); READ_ONLY 1 (a)
    {"gh200", "NVIDIA GH200 480GB", {0, 1, 1, 1, 1, 1, 1, 1}, CUDA_SUCCESS, 96 * GiB}, // HBM3
    // 2 H200 on PCIe: discrete, registration works (vllm#51080, H200 NVL); no HMM (a: needs the
    // open kernel modules and kernel >= 6.1.24); READ_ONLY 1 (a)
    {"h200", "NVIDIA H200", {0, 1, 1, 0, 1, 1, 0, 1}, CUDA_SUCCESS, 141 * GiB},
    // 3 GB10 (DGX Spark): integrated (daqiri#43), USES_HOST_PAGE_TABLES 1 and kernels read a file
    // mapping (sglang#37068); cuMemHostRegister refused 801 (ds4#158); HOST_REGISTER_SUPPORTED 1
    // and READ_ONLY 0 (a)
    {"gb10", "NVIDIA GB10", {1, 1, 1, 1, 1, 1, 1, 0}, CUDA_ERROR_NOT_SUPPORTED, 128 * GiB},
    // 4 B300: HOST_REGISTER_SUPPORTED 1, USES_HOST_PAGE_TABLES 0, READ_ONLY 0; read-only mmap +
    // READ_ONLY 801, without it INVALID_VALUE, writable mapping registers (vllm-omni#6240);
    // PAGEABLE_MEMORY_ACCESS 0 (a)
    {"b300", "NVIDIA B300", {0, 1, 1, 0, 1, 1, 0, 0}, CUDA_SUCCESS, 288 * GiB},
    // 5 Jetson Nano / TX1: HOST_REGISTER_SUPPORTED 0 (open-mpi#9851), registration 801
    // (CUDAdrv.jl#142; TX2: pycuda#229); no pageable access (a)
    {"tegra-x1", "NVIDIA Tegra X1", {1, 1, 1, 0, 0, 0, 0, 0}, CUDA_ERROR_NOT_SUPPORTED, 4 * GiB},
};
constexpr int model_count = static_cast<int>(std::size(models));

struct Device {
    int model = 0;
    Attributes attributes = models[0].values; // the model's, with overrides applied
};

struct Injection {
    long at = 0; // 1-based count of calls since the setting; 0: disarmed
    long calls = 0;
    CUresult result = CUDA_SUCCESS;
};

struct Registration {
    std::uintptr_t host;
    std::size_t size;
    unsigned flags;
    CUdevice device; // the current context's when registered
};

struct Allocation {
    CUdeviceptr pointer;
    std::size_t size;
    void* backing;
    CUdevice device;
};

struct State {
    std::mutex mutex;
    // configuration (fake_cuda_reset restores it)
    CUresult init_result = CUDA_SUCCESS;
    int driver_version = default_driver_version;
    int device_count = 1;
    std::array<Device, max_devices> devices{};
    std::array<Injection, entry_names.size()> injections{};
    // observation (fake_cuda_reset zeroes it)
    std::array<long, entry_names.size()> calls{};
    long last_register_flags = -1;
    std::uint64_t htod_bytes = 0, dtoh_bytes = 0, dtod_bytes = 0;
    std::uint64_t pinned_bytes = 0, populated_bytes = 0; // by cuMemHostRegister, since reset
    // the driver's own state; fake_cuda_reset only forgets cuInit
    bool initialized = false;
    std::array<CUctx_st, max_devices> contexts{};
    std::vector<Registration> registrations;
    std::vector<Allocation> allocations;
    CUdeviceptr next_alloc = alloc_base;
    std::vector<std::string> misuse; // kept by reset: only fake_cuda_forgive_misuse clears it

    State() {
        for (int d = 0; d < max_devices; ++d) contexts[static_cast<std::size_t>(d)].device = d;
        // A process the test cannot steer through fake_cuda_* (wm-load, run by a test) gets its
        // device 0 from the environment: a model's key ("gb10", "gh200", "h200", ...).
        const char* wanted = std::getenv("WEIGHTMAP_FAKE_CUDA_MODEL");
        for (int m = 0; wanted != nullptr && m < model_count; ++m)
            if (std::strcmp(wanted, models[m].key) == 0) devices[0] = {m, models[m].values};
    }
};

// Never destroyed: report_leaks() runs after the exit handlers that destroy statics.
State& state() {
    static State* s = new State;
    return *s;
}

// The calling thread's context stack (the reference: "a CPU thread's stack of current contexts").
thread_local std::vector<CUcontext> context_stack;

// Counts a call of entry `index` and returns the result fake_cuda_fail_at armed for this very
// call, else CUDA_SUCCESS. Every call counts, whatever it returns. The entry applies the result
// where the real driver fails for want of resources - after its own checks, before any change -
// so a call that fails a check of its own returns that error and spends the injection.
CUresult count_call(State& s, std::size_t index) {
    ++s.calls[index];
    Injection& i = s.injections[index];
    if (i.at == 0 || ++i.calls != i.at) return CUDA_SUCCESS;
    i.at = 0;
    return i.result;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
    char text[256];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    return text;
}

// Records a misuse the real driver may let pass (or crash on); the unload check fails the
// process for it. Returns `result`, the code the call gives back.
CUresult misuse(State& s, CUresult result, std::string what) {
    std::fprintf(stderr, "fake CUDA driver: %s\n", what.c_str());
    s.misuse.push_back(std::move(what));
    return result;
}

bool valid_device(const State& s, CUdevice device) {
    return device >= 0 && device < s.device_count;
}

int attribute(const State& s, CUdevice device, CUdevice_attribute a) {
    return s.devices[static_cast<std::size_t>(device)]
        .attributes[static_cast<std::size_t>(attribute_index(a))];
}

// The calling thread's current context when it is live (retained), else null.
CUctx_st* current_live() {
    if (context_stack.empty() || context_stack.back()->refcount == 0) return nullptr;
    return context_stack.back();
}

// What every memory entry checks first. The reference lists CUDA_ERROR_NOT_INITIALIZED ("if
// cuInit() has not been called, any function from the driver API will return
// CUDA_ERROR_NOT_INITIALIZED") and CUDA_ERROR_INVALID_CONTEXT for each of them.
CUresult need_context(const State& s) {
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return current_live() == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

struct Access {
    bool readable; // every byte mapped with 'r'
    bool writable; // and with 'w'
};

// How [begin, end) is mapped, from /proc/self/maps (its lines are sorted by address).
Access range_access(std::uintptr_t begin, std::uintptr_t end) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    std::uintptr_t covered = begin;
    bool writable = true;
    while (covered < end && std::getline(maps, line)) {
        std::uintptr_t lo = 0, hi = 0;
        char perms[5] = {};
        if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) != 3)
            continue;
        if (hi <= covered) continue;
        if (lo > covered || perms[0] != 'r') break; // a hole, or a page that cannot be read
        writable = writable && perms[1] == 'w';
        covered = hi;
    }
    const bool readable = covered >= end;
    return {readable, readable && writable};
}

const Registration* registration_containing(const State& s, std::uintptr_t host) {
    for (const Registration& r : s.registrations)
        if (host >= r.host && host - r.host < r.size) return &r;
    return nullptr;
}

// The host bytes behind device range [pointer, pointer + n): inside one live allocation's
// backing store, one DEVICEMAP registration's mapped range, or - for a device with
// PAGEABLE_MEMORY_ACCESS - plain host memory at that very address (a direct import).
struct Target {
    std::byte* bytes = nullptr;
    const Registration* registration = nullptr;
    bool pageable = false; // plain host memory, read through the host's page tables
};

Target device_range(const State& s, CUdeviceptr pointer, std::size_t n) {
    if (n > ~CUdeviceptr{0} - pointer) return {};
    for (const Allocation& a : s.allocations)
        if (pointer >= a.pointer && pointer + n <= a.pointer + a.size)
            return {static_cast<std::byte*>(a.backing) + (pointer - a.pointer), nullptr};
    for (const Registration& r : s.registrations) {
        const CUdeviceptr base = r.host + mapped_aperture;
        if ((r.flags & CU_MEMHOSTREGISTER_DEVICEMAP) != 0 && pointer >= base &&
            pointer + n <= base + r.size)
            return {reinterpret_cast<std::byte*>(r.host + (pointer - base)), &r};
    }
    if (pointer < mapped_aperture && pointer + n <= mapped_aperture)
        return {reinterpret_cast<std::byte*>(pointer), nullptr, true};
    return {};
}

// Whether the current device may touch `t` for `n` bytes (writing when `write`). Plain host
// memory needs PAGEABLE_MEMORY_ACCESS: a device without it dereferencing a mapped host pointer is
// a misuse (real hardware faults), an unmapped one just CUDA_ERROR_INVALID_VALUE.
CUresult check_access(State& s, const Target& t, std::size_t n, bool write) {
    if (t.bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto host = reinterpret_cast<std::uintptr_t>(t.bytes);
    if (t.registration == nullptr && !t.pageable) return CUDA_SUCCESS; // an allocation
    const Access access = range_access(host, host + n);
    if (t.pageable && !access.readable) return CUDA_ERROR_INVALID_VALUE;
    if (t.pageable &&
        attribute(s, current_live()->device, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS) == 0)
        return misuse(s, CUDA_ERROR_INVALID_VALUE,
                      format("device %d (no PAGEABLE_MEMORY_ACCESS) dereferenced host pointer "
                             "%p", current_live()->device, static_cast<void*>(t.bytes)));
    if (!access.readable) return CUDA_ERROR_INVALID_VALUE;
    const bool read_only = t.registration != nullptr &&
                           (t.registration->flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0;
    if (write && (read_only || !access.writable)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

// A device-side copy under check_access's rules on each side, counted with DtoD.
CUresult copy_between(State& s, const Target& to, const Target& from, std::size_t size,
                      CUresult injected) {
    if (CUresult r = check_access(s, from, size, false); r != CUDA_SUCCESS) return r;
    if (CUresult r = check_access(s, to, size, true); r != CUDA_SUCCESS) return r;
    if (injected != CUDA_SUCCESS) return injected;
    if (size != 0) std::memmove(to.bytes, from.bytes, size);
    s.dtod_bytes += size;
    return CUDA_SUCCESS;
}

std::uint64_t allocated_on(const State& s, CUdevice device) {
    std::uint64_t bytes = 0;
    for (const Allocation& a : s.allocations)
        if (a.device == device) bytes += a.size;
    return bytes;
}

// cuGetErrorName/cuGetErrorString for every code cuda_driver.hpp declares, as libcuda 12.x
// returns them (the runtime's cudaGetErrorString gives the same strings for these codes).
struct ErrorText {
    CUresult code;
    const char* name;
    const char* text;
};
constexpr ErrorText error_texts[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_INSUFFICIENT_DRIVER, "CUDA_ERROR_INSUFFICIENT_DRIVER",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* error_text(CUresult code) {
    for (const ErrorText& e : error_texts)
        if (e.code == code) return &e;
    return nullptr;
}

// cuGetErrorName and cuGetErrorString: the reference says an unrecognised code returns
// CUDA_ERROR_INVALID_VALUE and sets *pStr to NULL.
CUresult lookup_error(std::size_t index, CUresult code, const char** out, bool name) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, index);
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const ErrorText* e = error_text(code);
    if (e == nullptr) {
        *out = nullptr;
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (injected != CUDA_SUCCESS) return injected;
    *out = name ? e->name : e->text;
    return CUDA_SUCCESS;
}

long retained_contexts(const State& s) {
    long retained = 0;
    for (const CUctx_st& c : s.contexts) retained += c.refcount > 0 ? 1 : 0;
    return retained;
}

// Runs at library unload (process exit: the tests keep their own handle open).
__attribute__((destructor)) void report_leaks() {
    State& s = state();
    const long retained = retained_contexts(s);
    if (s.registrations.empty() && s.allocations.empty() && retained == 0 && s.misuse.empty())
        return;
    std::fprintf(stderr,
                 "fake CUDA driver: at unload %zu registration(s), %zu allocation(s) and %ld "
                 "retained primary context(s) are live; %zu misuse(s)\n",
                 s.registrations.size(), s.allocations.size(), retained, s.misuse.size());
    for (const Registration& r : s.registrations)
        std::fprintf(stderr, "  live registration %#" PRIxPTR " +%#zx flags %#x device %d\n",
                     r.host, r.size, r.flags, r.device);
    for (const Allocation& a : s.allocations)
        std::fprintf(stderr, "  live allocation %#llx +%#zx device %d\n", a.pointer, a.size,
                     a.device);
    for (const CUctx_st& c : s.contexts)
        if (c.refcount > 0)
            std::fprintf(stderr, "  primary context of device %d retained %ld time(s)\n",
                         c.device, c.refcount);
    for (const std::string& m : s.misuse) std::fprintf(stderr, "  misuse: %s\n", m.c_str());
    std::fflush(nullptr); // _exit does not flush, and the test's own output explains the leak
    _exit(1);
}

} // namespace

// --- the CUDA Driver API ----------------------------------------------------------------------

extern "C" {

// The reference: "Currently, the Flags parameter must be 0"; cuInit lists
// CUDA_ERROR_INVALID_VALUE. The result is the test's (fake_cuda_set_init_result): a machine
// without a GPU says CUDA_ERROR_NO_DEVICE. Any number of calls; a failure leaves the driver as
// it was.
CUresult cuInit(unsigned int flags) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (injected != CUDA_SUCCESS) return injected;
    if (s.init_result != CUDA_SUCCESS) return s.init_result;
    s.initialized = true;
    return CUDA_SUCCESS;
}

// Works before cuInit. The reference: CUDA_ERROR_INVALID_VALUE when driverVersion is NULL.
CUresult cuDriverGetVersion(int* driver_version) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (driver_version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (injected != CUDA_SUCCESS) return injected;
    *driver_version = s.driver_version;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
    return lookup_error(entry(__func__), error, name, true);
}

CUresult cuGetErrorString(CUresult error, const char** text) {
    return lookup_error(entry(__func__), error, text, false);
}

CUresult cuDeviceGetCount(int* count) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (injected != CUDA_SUCCESS) return injected;
    *count = s.device_count;
    return CUDA_SUCCESS;
}

// CUdevice is the ordinal. An ordinal out of range: CUDA_ERROR_INVALID_DEVICE (listed).
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    if (injected != CUDA_SUCCESS) return injected;
    *device = ordinal;
    return CUDA_SUCCESS;
}

// The reference: a NUL-terminated name of at most `length` bytes. A null name or a length
// below 1 is CUDA_ERROR_INVALID_VALUE (listed; which condition gives it is the fake's choice).
CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (name == nullptr || length < 1) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    if (injected != CUDA_SUCCESS) return injected;
    const int model = s.devices[static_cast<std::size_t>(device)].model;
    std::snprintf(name, static_cast<std::size_t>(length), "%s", models[model].name);
    return CUDA_SUCCESS;
}

// An attribute the fake does not model is CUDA_ERROR_INVALID_VALUE, as the real driver says for
// one it does not know: an importer asking for anything else must teach the fake first.
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute_id, CUdevice device) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (value == nullptr || attribute_index(attribute_id) < 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    if (injected != CUDA_SUCCESS) return injected;
    *value = attribute(s, device, attribute_id);
    return CUDA_SUCCESS;
}

// The device's one primary context, reference-counted: every retain needs a release.
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    if (injected != CUDA_SUCCESS) return injected;
    CUctx_st& c = s.contexts[static_cast<std::size_t>(device)];
    ++c.refcount;
    *context = &c;
    return CUDA_SUCCESS;
}

// Releasing a context that is not retained: the reference names no code for it; the fake
// returns CUDA_ERROR_INVALID_CONTEXT (listed) and records a misuse. As the reference says, the
// release pops nothing: a stack that still holds the context now holds a dead one.
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_device(s, device)) return CUDA_ERROR_INVALID_DEVICE;
    CUctx_st& c = s.contexts[static_cast<std::size_t>(device)];
    if (c.refcount == 0)
        return misuse(s, CUDA_ERROR_INVALID_CONTEXT,
                      format("release of device %d's primary context, not retained", device));
    if (injected != CUDA_SUCCESS) return injected;
    --c.refcount;
    return CUDA_SUCCESS;
}

// Only a live primary context can be pushed: anything else is CUDA_ERROR_INVALID_CONTEXT.
CUresult cuCtxPushCurrent_v2(CUcontext context) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    bool live = false;
    for (const CUctx_st& c : s.contexts) live = live || (&c == context && c.refcount > 0);
    if (!live) return CUDA_ERROR_INVALID_CONTEXT;
    if (injected != CUDA_SUCCESS) return injected;
    context_stack.push_back(context);
    return CUDA_SUCCESS;
}

// An empty stack: CUDA_ERROR_INVALID_CONTEXT (listed; the fake's choice of code) and a misuse,
// since it means a pop without its push. `context` may be null.
CUresult cuCtxPopCurrent_v2(CUcontext* context) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (context_stack.empty())
        return misuse(s, CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent on an empty context stack");
    if (injected != CUDA_SUCCESS) return injected;
    if (context != nullptr) *context = context_stack.back();
    context_stack.pop_back();
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (injected != CUDA_SUCCESS) return injected;
    *device = current_live()->device;
    return CUDA_SUCCESS;
}

} // extern "C"

namespace {

// cuMemHostRegister's refusals of its arguments and of the device, in the order listed.
CUresult check_register(const State& s, std::uintptr_t host, std::size_t size, unsigned flags) {
    const CUdevice device = current_live()->device;
    const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    if (host == 0 || size == 0 || (flags & ~register_flags) != 0) return CUDA_ERROR_INVALID_VALUE;
    // IOMEMORY (memory-mapped I/O of a PCIe peer) is not modelled; the reference lists
    // CUDA_ERROR_NOT_SUPPORTED "on older Linux kernel versions" for it.
    if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) return CUDA_ERROR_NOT_SUPPORTED;
    // The CUDA 4.x reference required p and size to be page-aligned; later ones are silent. The
    // importer always aligns, so the fake keeps the strict rule.
    if (host % page != 0 || size % page != 0 || size > UINTPTR_MAX - host)
        return CUDA_ERROR_INVALID_VALUE;
    // The reference names no code for a device without HOST_REGISTER_SUPPORTED: the fake's choice.
    if (attribute(s, device, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED) == 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    // A model whose driver refuses registration whatever the attribute says (GB10: ds4#158).
    const Model& model = models[s.devices[static_cast<std::size_t>(device)].model];
    if (model.register_result != CUDA_SUCCESS) return model.register_result;
    // The reference: READ_ONLY on a device without READ_ONLY_HOST_REGISTER_SUPPORTED "will cause
    // cuMemHostRegister to error with CUDA_ERROR_NOT_SUPPORTED".
    const bool read_only = (flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0;
    if (read_only &&
        attribute(s, device, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED) == 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    const Access access = range_access(host, host + size);
    if (!access.readable) return CUDA_ERROR_INVALID_VALUE; // unmapped: the fake's choice of code
    // The reference: READ_ONLY "is required in order to register memory mapped to the CPU as
    // read-only" on devices without PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES. The code is
    // the fake's choice.
    if (!access.writable && !read_only &&
        attribute(s, device, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES) == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

// The reference (cuMemHostRegister): "On systems where
// CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES is true, cuMemHostRegister
// will not page-lock the memory range specified by ptr but only populate unpopulated pages."
// The fake reads one byte of each page either way (the pages are faulted in) and counts the
// bytes as pinned or as populated.
void populate_or_pin(State& s, std::uintptr_t host, std::size_t size) {
    const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    for (std::uintptr_t at = host; at < host + size; at += page)
        (void) *reinterpret_cast<const volatile unsigned char*>(at);
    const CUdevice device = current_live()->device;
    if (attribute(s, device, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES) != 0)
        s.populated_bytes += size;
    else
        s.pinned_bytes += size;
}

bool overlaps_registration(const State& s, std::uintptr_t host, std::size_t size) {
    for (const Registration& r : s.registrations)
        if (r.host < host + size && host < r.host + r.size) return true;
    return false;
}

} // namespace

extern "C" {

CUresult cuMemHostRegister_v2(void* p, std::size_t size, unsigned int flags) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    s.last_register_flags = flags;
    const auto host = reinterpret_cast<std::uintptr_t>(p);
    if (CUresult r = check_register(s, host, size, flags); r != CUDA_SUCCESS) return r;
    // The reference: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED when part of the range is.
    if (overlaps_registration(s, host, size)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (injected != CUDA_SUCCESS) return injected;
    s.registrations.push_back({host, size, flags, current_live()->device});
    populate_or_pin(s, host, size);
    return CUDA_SUCCESS;
}

// The reference: p must be the base address given to cuMemHostRegister;
// CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED otherwise. The fake also records a misuse.
CUresult cuMemHostUnregister(void* p) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    const auto host = reinterpret_cast<std::uintptr_t>(p);
    for (auto it = s.registrations.begin(); it != s.registrations.end(); ++it) {
        if (it->host != host) continue;
        if (injected != CUDA_SUCCESS) return injected;
        s.registrations.erase(it);
        return CUDA_SUCCESS;
    }
    return misuse(s, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                  format("cuMemHostUnregister of %p, not the base of a registration", p));
}

// The reference: Flags "must be set to 0"; the call fails for memory registered without
// DEVICEMAP and on a device that cannot map host memory (DEVICEMAP's failure is "deferred to
// cuMemHostGetDevicePointer"); memory registered without PORTABLE is pinned for the registering
// context only. Each is CUDA_ERROR_INVALID_VALUE, the one such code listed. (The runtime's
// cudaHostRegister says UVA makes registered memory mapped and portable anyway: the fake is the
// stricter driver.) The pointer is the fake's own (host + aperture), deliberately never the host
// one, although the reference says it matches p when every visible device has
// CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: so a test sees the importer use the driver's pointer.
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* device_pointer, void* p, unsigned int flags) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    const CUdevice device = current_live()->device;
    const auto host = reinterpret_cast<std::uintptr_t>(p);
    const Registration* r = registration_containing(s, host);
    if (device_pointer == nullptr || flags != 0 || r == nullptr ||
        (r->flags & CU_MEMHOSTREGISTER_DEVICEMAP) == 0 ||
        ((r->flags & CU_MEMHOSTREGISTER_PORTABLE) == 0 && r->device != device) ||
        attribute(s, device, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (injected != CUDA_SUCCESS) return injected;
    *device_pointer = host + mapped_aperture;
    return CUDA_SUCCESS;
}

// The reference: "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE"; past the
// device's memory, or when calloc fails, CUDA_ERROR_OUT_OF_MEMORY.
CUresult cuMemAlloc_v2(CUdeviceptr* device_pointer, std::size_t size) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    if (device_pointer == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    const CUdevice device = current_live()->device;
    const std::uint64_t memory = models[s.devices[static_cast<std::size_t>(device)].model].memory;
    if (size > memory - allocated_on(s, device)) return CUDA_ERROR_OUT_OF_MEMORY;
    if (injected != CUDA_SUCCESS) return injected;
    void* backing = std::calloc(1, size);
    if (backing == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    s.allocations.push_back({s.next_alloc, size, backing, device});
    *device_pointer = s.next_alloc;
    s.next_alloc += (size + alloc_alignment - 1) / alloc_alignment * alloc_alignment;
    return CUDA_SUCCESS;
}

// The reference: dptr must come from an allocation call; it names no code for one that does
// not. The fake returns CUDA_ERROR_INVALID_VALUE (listed) and records a misuse.
CUresult cuMemFree_v2(CUdeviceptr device_pointer) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    for (auto it = s.allocations.begin(); it != s.allocations.end(); ++it) {
        if (it->pointer != device_pointer) continue;
        if (injected != CUDA_SUCCESS) return injected;
        std::free(it->backing);
        s.allocations.erase(it);
        return CUDA_SUCCESS;
    }
    return misuse(s, CUDA_ERROR_INVALID_VALUE,
                  format("cuMemFree of %#llx, not the base of an allocation", device_pointer));
}

// The device range must lie in one allocation, one DEVICEMAP registration or (a device with
// PAGEABLE_MEMORY_ACCESS) readable host memory, and the device may not write a READ_ONLY
// registration nor pages the CPU maps read-only. The reference names no code for these:
// CUDA_ERROR_INVALID_VALUE is the fake's choice.
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t size) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    const Target t = device_range(s, dst, size);
    if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_access(s, t, size, true); r != CUDA_SUCCESS) return r;
    if (injected != CUDA_SUCCESS) return injected;
    if (size != 0) std::memcpy(t.bytes, src, size);
    s.htod_bytes += size;
    return CUDA_SUCCESS;
}

// From a registration or a direct host pointer it reads the host bytes: what the device sees.
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t size) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    const Target t = device_range(s, src, size);
    if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_access(s, t, size, false); r != CUDA_SUCCESS) return r;
    if (injected != CUDA_SUCCESS) return injected;
    if (size != 0) std::memcpy(dst, t.bytes, size);
    s.dtoh_bytes += size;
    return CUDA_SUCCESS;
}

// Device to device, each side under the rules of the two above. Pageable host memory on either
// side is refused: the reference gives cuMemcpyDtoD device pointers only, and the Runtime API's
// cudaMemcpy calls a kind that does not match the pointers undefined behaviour, refused on some
// systems where cudaMemcpyDefault works (issue 43). The fake takes the strict reading.
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t size) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    const Target to = device_range(s, dst, size), from = device_range(s, src, size);
    if (to.pageable || from.pageable) return CUDA_ERROR_INVALID_VALUE;
    return copy_between(s, to, from, size, injected);
}

// "Copies data between two pointers ... infers the type of the transfer ... from the pointer
// values" (Driver API, cuMemcpy; unified addressing): pageable host memory is accepted on either
// side, under check_access's rules. Assumption: on a device without PAGEABLE_MEMORY_ACCESS the
// real driver would stage such a copy through the CPU; the fake calls it a misuse, the answer
// that never hides a device unable to reach the pointer itself. Counted with DtoD.
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, std::size_t size) {
    State& s = state();
    Guard guard(s.mutex);
    const CUresult injected = count_call(s, entry(__func__));
    if (CUresult r = need_context(s); r != CUDA_SUCCESS) return r;
    const Target to = device_range(s, dst, size), from = device_range(s, src, size);
    return copy_between(s, to, from, size, injected);
}

} // extern "C"

// Each export has the type the importer resolves it as.
static_assert(std::is_same_v<decltype(&cuInit), PFN_cuInit>);
static_assert(std::is_same_v<decltype(&cuDriverGetVersion), PFN_cuDriverGetVersion>);
static_assert(std::is_same_v<decltype(&cuGetErrorName), PFN_cuGetErrorName>);
static_assert(std::is_same_v<decltype(&cuGetErrorString), PFN_cuGetErrorString>);
static_assert(std::is_same_v<decltype(&cuDeviceGetCount), PFN_cuDeviceGetCount>);
static_assert(std::is_same_v<decltype(&cuDeviceGet), PFN_cuDeviceGet>);
static_assert(std::is_same_v<decltype(&cuDeviceGetName), PFN_cuDeviceGetName>);
static_assert(std::is_same_v<decltype(&cuDeviceGetAttribute), PFN_cuDeviceGetAttribute>);
static_assert(std::is_same_v<decltype(&cuDevicePrimaryCtxRetain), PFN_cuDevicePrimaryCtxRetain>);
static_assert(
    std::is_same_v<decltype(&cuDevicePrimaryCtxRelease_v2), PFN_cuDevicePrimaryCtxRelease>);
static_assert(std::is_same_v<decltype(&cuCtxPushCurrent_v2), PFN_cuCtxPushCurrent>);
static_assert(std::is_same_v<decltype(&cuCtxPopCurrent_v2), PFN_cuCtxPopCurrent>);
static_assert(std::is_same_v<decltype(&cuCtxGetDevice), PFN_cuCtxGetDevice>);
static_assert(std::is_same_v<decltype(&cuMemHostRegister_v2), PFN_cuMemHostRegister>);
static_assert(std::is_same_v<decltype(&cuMemHostUnregister), PFN_cuMemHostUnregister>);
static_assert(
    std::is_same_v<decltype(&cuMemHostGetDevicePointer_v2), PFN_cuMemHostGetDevicePointer>);
static_assert(std::is_same_v<decltype(&cuMemAlloc_v2), PFN_cuMemAlloc>);
static_assert(std::is_same_v<decltype(&cuMemFree_v2), PFN_cuMemFree>);
static_assert(std::is_same_v<decltype(&cuMemcpyHtoD_v2), PFN_cuMemcpyHtoD>);
static_assert(std::is_same_v<decltype(&cuMemcpyDtoH_v2), PFN_cuMemcpyDtoH>);
static_assert(std::is_same_v<decltype(&cuMemcpyDtoD_v2), PFN_cuMemcpyDtoD>);
static_assert(std::is_same_v<decltype(&cuMemcpy), PFN_cuMemcpy>);

// --- control, for tests -----------------------------------------------------------------------

extern "C" {

/// Restores the default configuration (one device of model 0 "orin" without overrides,
/// cuInit succeeds, driver version 12040, no injected failure), forgets cuInit, and zeroes the
/// counters. Live registrations, allocations, retains and misuse are kept: they are a test's
/// leak. The context stacks are the threads' own; fake_cuda_context_depth shows this one's.
void fake_cuda_reset() {
    State& s = state();
    Guard guard(s.mutex);
    s.init_result = CUDA_SUCCESS;
    s.driver_version = default_driver_version;
    s.device_count = 1;
    s.devices.fill(Device{});
    s.injections.fill(Injection{});
    s.calls.fill(0);
    s.last_register_flags = -1;
    s.htod_bytes = s.dtoh_bytes = s.dtod_bytes = 0;
    s.pinned_bytes = s.populated_bytes = 0;
    s.initialized = false;
}

/// cuInit(0) returns `result` without initialising; CUDA_SUCCESS restores.
void fake_cuda_set_init_result(int result) {
    Guard guard(state().mutex);
    state().init_result = result;
}

/// What cuDriverGetVersion reports (1000 * major + 10 * minor).
void fake_cuda_set_driver_version(int version) {
    Guard guard(state().mutex);
    state().driver_version = version;
}

/// Number of devices, 0 to 8; -1 (and no change) outside that.
int fake_cuda_set_device_count(int count) {
    Guard guard(state().mutex);
    if (count < 0 || count > max_devices) return -1;
    state().device_count = count;
    return 0;
}

/// Device `device` (0 to 7) becomes `model` (an index of models[]: 0 orin, 1 gh200, 2 h200,
/// 3 gb10, 4 b300, 5 tegra-x1): its name, attributes and registration answer, dropping its
/// overrides. -1 (and no change) for a bad device or model.
int fake_cuda_set_device_model(int device, int model) {
    Guard guard(state().mutex);
    if (device < 0 || device >= max_devices || model < 0 || model >= model_count) return -1;
    state().devices[static_cast<std::size_t>(device)] = {model, models[model].values};
    return 0;
}

/// Overrides one of device `device`'s attributes (until reset or its next model). -1 (and no
/// change) for a bad device or an attribute the fake does not model.
int fake_cuda_set_attribute(int device, int attribute_id, int value) {
    Guard guard(state().mutex);
    const int index = attribute_index(attribute_id);
    if (device < 0 || device >= max_devices || index < 0) return -1;
    state().devices[static_cast<std::size_t>(device)].attributes[static_cast<std::size_t>(index)] =
        value;
    return 0;
}

/// The n-th call (1-based, counted from now) of exported entry point `entry_name` returns
/// `result` without changing anything (if it passes the entry's own checks first, see
/// count_call); n = 0 or result CUDA_SUCCESS disarms it. Entries are armed independently.
/// -1 (and no change) for a name the fake does not export or a negative n.
int fake_cuda_fail_at(const char* entry_name, long n, int result) {
    Guard guard(state().mutex);
    const int index = entry_at(entry_name);
    if (index < 0 || n < 0) return -1;
    const long at = result == CUDA_SUCCESS ? 0 : n;
    state().injections[static_cast<std::size_t>(index)] = {at, 0, result};
    return 0;
}

/// Calls of exported entry point `entry_name` since reset, whatever they returned; -1 for a
/// name the fake does not export.
long fake_cuda_calls(const char* entry_name) {
    Guard guard(state().mutex);
    const int index = entry_at(entry_name);
    return index < 0 ? -1 : state().calls[static_cast<std::size_t>(index)];
}

long fake_cuda_live_registrations() {
    Guard guard(state().mutex);
    return static_cast<long>(state().registrations.size());
}

/// Total bytes of the live registrations.
std::uint64_t fake_cuda_live_registered_bytes() {
    Guard guard(state().mutex);
    std::uint64_t bytes = 0;
    for (const Registration& r : state().registrations) bytes += r.size;
    return bytes;
}

/// The flags of the live registration that is exactly [host, host + size); -1 when none is.
long fake_cuda_registration_flags(const void* host, std::uint64_t size) {
    Guard guard(state().mutex);
    for (const Registration& r : state().registrations)
        if (r.host == reinterpret_cast<std::uintptr_t>(host) && r.size == size) return r.flags;
    return -1;
}

/// The flags of the last cuMemHostRegister_v2 call that had a current context, whatever it
/// returned; -1 when there was none since reset.
long fake_cuda_last_register_flags() {
    Guard guard(state().mutex);
    return state().last_register_flags;
}

long fake_cuda_live_allocations() {
    Guard guard(state().mutex);
    return static_cast<long>(state().allocations.size());
}

/// Total bytes of the live allocations (as requested, before rounding).
std::uint64_t fake_cuda_live_allocated_bytes() {
    Guard guard(state().mutex);
    std::uint64_t bytes = 0;
    for (const Allocation& a : state().allocations) bytes += a.size;
    return bytes;
}

/// Bytes copied by successful cuMemcpyHtoD_v2 calls since reset.
/// Bytes cuMemHostRegister page-locked since reset (a device without
/// PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES), and bytes it only populated (one with it).
std::uint64_t fake_cuda_pinned_bytes_total() {
    Guard guard(state().mutex);
    return state().pinned_bytes;
}
std::uint64_t fake_cuda_populated_bytes_total() {
    Guard guard(state().mutex);
    return state().populated_bytes;
}

std::uint64_t fake_cuda_htod_bytes() {
    Guard guard(state().mutex);
    return state().htod_bytes;
}

/// Bytes copied by successful cuMemcpyDtoH_v2 calls since reset.
std::uint64_t fake_cuda_dtoh_bytes() {
    Guard guard(state().mutex);
    return state().dtoh_bytes;
}

/// Bytes copied by successful cuMemcpyDtoD_v2 calls since reset.
std::uint64_t fake_cuda_dtod_bytes() {
    Guard guard(state().mutex);
    return state().dtod_bytes;
}

/// Retains of device `device`'s primary context not yet released; -1 for a bad device.
long fake_cuda_primary_ctx_refcount(int device) {
    Guard guard(state().mutex);
    if (device < 0 || device >= max_devices) return -1;
    return state().contexts[static_cast<std::size_t>(device)].refcount;
}

/// Depth of the calling thread's context stack.
int fake_cuda_context_depth() {
    return static_cast<int>(context_stack.size());
}

/// Misuses since load or the last fake_cuda_forgive_misuse: releases of contexts not retained,
/// pops of empty stacks, unregisters and frees of what is not a live base.
long fake_cuda_misuse_count() {
    Guard guard(state().mutex);
    return static_cast<long>(state().misuse.size());
}

/// Forgets the misuse so far: for a test that provoked it on purpose and checked it.
void fake_cuda_forgive_misuse() {
    Guard guard(state().mutex);
    state().misuse.clear();
}

/// What the fake adds to a host address to make its device pointer.
std::uint64_t fake_cuda_mapped_aperture() {
    return mapped_aperture;
}

/// The first device pointer cuMemAlloc_v2 hands out; later ones follow it.
std::uint64_t fake_cuda_alloc_base() {
    return alloc_base;
}

/// Bytes device `device` can allocate (its model's memory: HBM, or the pool it shares).
std::uint64_t fake_cuda_device_memory(int device) {
    State& s = state();
    Guard guard(s.mutex);
    if (device < 0 || device >= s.device_count) return 0;
    return models[s.devices[static_cast<std::size_t>(device)].model].memory;
}

} // extern "C"
