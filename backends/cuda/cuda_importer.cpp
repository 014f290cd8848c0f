// SPDX-License-Identifier: MIT
// The CUDA importer: page-aligned ranges of the weight mapping, either used directly (a device
// that reads pageable memory through the host's page tables) or registered with
// cuMemHostRegister(DEVICEMAP [| READ_ONLY]), in the engine's context or the device's primary one.
#include "cuda_importer.hpp"

#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "backend_factories.hpp"
#include "internal/dl_resolve.hpp"
#include "internal/nothrow.hpp"
#include "internal/undo.hpp"
#include "weightmap/backends/cuda.hpp"
#include "weightmap/log.hpp"
#include "weightmap/planner.hpp"

namespace wm::cuda {
namespace {

// Makes a context current on this thread for one call and restores the previous one, so an
// engine's current context is never changed behind its back.
class Current {
public:
    Current(const Api& api, CUcontext context)
        : api_(api), result_(api.ctx_push_current(context)) {}
    ~Current() {
        CUcontext popped = nullptr;
        if (result_ == CUDA_SUCCESS) api_.ctx_pop_current(&popped);
    }
    Current(const Current&) = delete;
    Current& operator=(const Current&) = delete;
    CUresult result() const noexcept { return result_; }

private:
    const Api& api_;
    const CUresult result_;
};

std::string flag_names(unsigned flags) {
    std::string out;
    const auto add = [&](unsigned bit, const char* name) {
        if ((flags & bit) != 0) out += fmt::format("{}{}", out.empty() ? "" : "|", name);
    };
    add(CU_MEMHOSTREGISTER_PORTABLE, "PORTABLE");
    add(CU_MEMHOSTREGISTER_DEVICEMAP, "DEVICEMAP");
    add(CU_MEMHOSTREGISTER_READ_ONLY, "READ_ONLY");
    return out.empty() ? "0" : out;
}

// What a refused registration most likely means, for the reason the region falls back with.
const char* register_hint(CUresult result, unsigned flags) {
    if (result == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        return " (some of these pages are already registered in this process: by the engine, "
               "another importer or a pin)";
    if (result == CUDA_ERROR_INVALID_VALUE && (flags & CU_MEMHOSTREGISTER_READ_ONLY) == 0)
        return " (pages the CPU maps read-only need CU_MEMHOSTREGISTER_READ_ONLY, which this "
               "device does not support: map the weights MAP_SHARED with PROT_READ|PROT_WRITE)";
    return "";
}

// What registering without READ_ONLY means for the weight file (B300: vllm-omni#6240).
constexpr const char* writable_note =
    " (no READ_ONLY_HOST_REGISTER_SUPPORTED: the files are opened O_RDWR and mapped MAP_SHARED "
    "PROT_READ|PROT_WRITE, so the registered pages are the file's page cache, not a copy, and a "
    "stray store would reach the file)";

ImportedBuffer imported_buffer(void* host, std::uint64_t size, void* device_address) {
    ImportedBuffer buffer;
    buffer.host_address = host;
    buffer.size = size;
    buffer.device_address = device_address;
    buffer.imported = true;
    return buffer;
}

} // namespace

CudaImporter::CudaImporter(std::unique_ptr<Driver> driver, DeviceFacts facts,
                           CUcontext engine_context, Availability availability)
    : driver_(std::move(driver)), facts_(std::move(facts)), engine_context_(engine_context),
      availability_(std::move(availability)), page_(host_page_size()), method_(facts_.method),
      memory_note_register_(device_memory_note(CudaImportMethod::register_host)),
      memory_note_other_(device_memory_note(facts_.method == CudaImportMethod::register_host
                                                ? CudaImportMethod::direct
                                                : facts_.method)) {}

CudaImporter::~CudaImporter() {
    if (!driver_) return;
    release_leftovers();
    if (primary_ != nullptr) driver_->api().primary_ctx_release(facts_.device);
}

void CudaImporter::release_leftovers() noexcept {
    if (registrations_.empty() && copies_.empty()) return;
    const std::size_t registered = registrations_.size(), copied = copies_.size();
    for (const auto& [host, registration] : registrations_)
        if (registration.kind != Kind::direct) (void)unregister(host, registration);
    registrations_.clear();
    for (const auto& [device_pointer, size] : copies_) {
        if (Result<CUcontext> ctx = context(); ctx) {
            Current current(driver_->api(), ctx.value());
            if (current.result() == CUDA_SUCCESS) driver_->api().mem_free(device_pointer);
        }
    }
    copies_.clear();
    (void)internal::status_nothrow([&]() -> Status {
        log_message({}, LogLevel::warning,
                    fmt::format("cuda importer destroyed with {} registration(s) and {} copy "
                                "buffer(s) still held; released them (release every buffer and "
                                "destroy placements first)",
                                registered, copied));
        return {};
    });
}

// The Driver API requires READ_ONLY to register pages the CPU maps read-only, except where the
// device reads through the host's page tables; without either, HSA's rule applies. A direct
// import registers nothing, so it takes whatever the mapping is.
bool CudaImporter::needs_writable_mapping(CudaImportMethod method) const noexcept {
    return driver_ != nullptr && method == CudaImportMethod::register_host &&
           !facts_.read_only_register && !facts_.host_page_tables;
}

std::string CudaImporter::device_memory_note(CudaImportMethod method) const {
    if (driver_ == nullptr) return facts_.memory_note;
    return fmt::format("{}; import method {}{}", facts_.memory_note, to_string(method),
                       needs_writable_mapping(method) ? writable_note : "");
}

ImporterCaps CudaImporter::caps() const noexcept {
    ImporterCaps caps;
    caps.needs_writable_mapping = needs_writable_mapping(method_.load());
    caps.alignment = page_; // CUDA 4.x required page alignment; later docs say nothing
    caps.max_import_size = 0;
    caps.is_cpu = false;
    caps.survives_read_only_reprotect = false; // not documented either way
    caps.device_memory = facts_.memory;
    return caps;
}

ImporterNotes CudaImporter::notes() const noexcept {
    const bool registering = method_.load() == CudaImportMethod::register_host;
    return {{}, registering ? memory_note_register_ : memory_note_other_};
}

Result<CUcontext> CudaImporter::context() {
    if (engine_context_ != nullptr) return engine_context_;
    std::lock_guard<std::mutex> guard(mutex_);
    if (primary_ != nullptr) return primary_;
    CUcontext retained = nullptr;
    const CUresult result = driver_->api().primary_ctx_retain(&retained, facts_.device);
    if (result != CUDA_SUCCESS)
        return make_error(ErrorKind::import_failed,
                          fmt::format("cuDevicePrimaryCtxRetain(device {} '{}') failed: {}",
                                      facts_.device, facts_.name, describe(result)));
    primary_ = retained;
    return retained;
}

// Enters the importer's context for one driver call (`current` holds it until it goes).
#define WM_CUDA_ENTER(current)                                                                    \
    Result<CUcontext> current##_context = context();                                             \
    if (!current##_context) return std::move(current##_context).error();                         \
    Current current(driver_->api(), current##_context.value());                                  \
    if (current.result() != CUDA_SUCCESS)                                                        \
        return make_error(ErrorKind::import_failed,                                              \
                          fmt::format("cuCtxPushCurrent failed: {}", describe(current.result())));

Status CudaImporter::check_range(const char* what, void* host, std::uint64_t size) const {
    const auto address = reinterpret_cast<std::uintptr_t>(host);
    if (host == nullptr || size == 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: null address ({}) or zero size ({})", what, host, size));
    if (address % page_ != 0 || size % page_ != 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: {} +{:#x} is not aligned to the {}-byte page", what,
                                      host, size, page_));
    if (size > UINTPTR_MAX - address)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("{}: {} +{:#x} wraps the address space", what, host, size));
    return {};
}

Status CudaImporter::register_range(void* host, std::uint64_t size, unsigned flags, Kind kind,
                                    CUdeviceptr* device_pointer, CUresult* refusal) {
    WM_CUDA_ENTER(current)
    const Api& api = driver_->api();
    const CUresult registered = api.mem_host_register(host, size, flags);
    if (refusal != nullptr) *refusal = registered;
    if (registered != CUDA_SUCCESS)
        return make_error(ErrorKind::import_failed,
                          fmt::format("cuMemHostRegister({}, {:#x}, {}) failed on '{}': {}{}",
                                      host, size, flag_names(flags), facts_.name,
                                      describe(registered), register_hint(registered, flags)));
    CUdeviceptr mapped = 0;
    if (kind == Kind::import) {
        const CUresult got = api.mem_host_get_device_pointer(&mapped, host, 0);
        if (got != CUDA_SUCCESS || mapped == 0) {
            api.mem_host_unregister(host);
            return make_error(ErrorKind::import_failed,
                              fmt::format("cuMemHostGetDevicePointer({}) failed on '{}': {}; "
                                          "unregistered it",
                                          host, facts_.name,
                                          got != CUDA_SUCCESS ? describe(got)
                                                              : "a null device pointer"));
        }
    }
    // Unregistered again when recording it throws (bad_alloc): no registration outlives its record.
    internal::Undo unregister([&] { api.mem_host_unregister(host); });
    std::lock_guard<std::mutex> guard(mutex_);
    registrations_[reinterpret_cast<std::uintptr_t>(host)] = {size, mapped, kind};
    unregister.dismiss();
    *device_pointer = mapped;
    return {};
}

Status CudaImporter::unregister(std::uintptr_t host, const Registration& registration) noexcept {
    return internal::status_nothrow([&]() -> Status {
        WM_CUDA_ENTER(current)
        const CUresult result = driver_->api().mem_host_unregister(reinterpret_cast<void*>(host));
        if (result != CUDA_SUCCESS)
            return make_error(ErrorKind::import_failed,
                              fmt::format("cuMemHostUnregister({:#x}, {} bytes) failed: {}", host,
                                          registration.size, describe(result)));
        return {};
    });
}

Result<ImportedBuffer> CudaImporter::import_checked(void* host_address, std::uint64_t size) {
    if (!availability_.available)
        return make_error(ErrorKind::unsupported,
                          fmt::format("cuda importer not available: {}", availability_.reason));
    if (method_.load() == CudaImportMethod::direct) return import_direct(host_address, size);
    return import_registered(host_address, size);
}

Result<ImportedBuffer> CudaImporter::import_registered(void* host, std::uint64_t size) {
    const unsigned flags = CU_MEMHOSTREGISTER_DEVICEMAP |
                           (facts_.read_only_register ? CU_MEMHOSTREGISTER_READ_ONLY : 0u);
    CUdeviceptr device_pointer = 0;
    CUresult refusal = CUDA_SUCCESS;
    Status registered = register_range(host, size, flags, Kind::import, &device_pointer, &refusal);
    // GB10 answers 801 (ds4#158). A device that reads pageable memory itself needs no
    // registration, and copying every refused run instead would hold the weights twice (ds4#158:
    // ~87 GB of device copies of an 80.76 GiB model).
    if (!registered && refusal == CUDA_ERROR_NOT_SUPPORTED && facts_.pageable_access) {
        switch_to_direct(registered.error().message);
        return import_direct(host, size);
    }
    if (!registered) return registered.error();
    return imported_buffer(host, size, reinterpret_cast<void*>(
                                           static_cast<std::uintptr_t>(device_pointer)));
}

// The device reads these pages through the host's page tables: the host pointer is the device's
// pointer, and nothing is registered, pinned or copied.
Result<ImportedBuffer> CudaImporter::import_direct(void* host, std::uint64_t size) {
    const auto address = reinterpret_cast<std::uintptr_t>(host);
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = registrations_.lower_bound(address);
    const bool overlaps = (it != registrations_.end() && it->first < address + size) ||
                          (it != registrations_.begin() &&
                           std::prev(it)->first + std::prev(it)->second.size > address);
    if (overlaps)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("cuda import: {} +{:#x} overlaps a live import or pin of "
                                      "this importer", host, size));
    registrations_[address] = {size, static_cast<CUdeviceptr>(address), Kind::direct};
    return imported_buffer(host, size, host);
}

void CudaImporter::switch_to_direct(const std::string& refusal) {
    CudaImportMethod expected = CudaImportMethod::register_host;
    if (!method_.compare_exchange_strong(expected, CudaImportMethod::direct)) return;
    (void)internal::status_nothrow([&]() -> Status {
        log_message({}, LogLevel::warning,
                    fmt::format("cuda: {}; '{}' reads pageable memory "
                                "(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS 1), so this and "
                                "every later import uses the mapping directly",
                                refusal, facts_.name));
        return {};
    });
}

CudaImporterState CudaImporter::state() const {
    CudaImporterState state;
    state.method = availability_.available ? method_.load() : CudaImportMethod::unavailable;
    state.pageable_access = facts_.pageable_access;
    state.method_note = availability_.available ? facts_.method_note : availability_.reason;
    std::lock_guard<std::mutex> guard(mutex_);
    for (const auto& [host, registration] : registrations_) {
        state.registrations += registration.kind == Kind::import ? 1 : 0;
        state.direct_imports += registration.kind == Kind::direct ? 1 : 0;
    }
    return state;
}

Status CudaImporter::release_checked(const ImportedBuffer& buffer) noexcept {
    return internal::status_nothrow([&]() -> Status {
        if (!driver_)
            return make_error(ErrorKind::invalid_argument,
                              "cuda release: this importer is not available and holds nothing");
        const auto host = reinterpret_cast<std::uintptr_t>(buffer.host_address);
        Registration registration;
        {
            std::lock_guard<std::mutex> guard(mutex_);
            auto it = registrations_.find(host);
            if (it == registrations_.end() || it->second.kind == Kind::pin ||
                it->second.size != buffer.size ||
                it->second.device_pointer != reinterpret_cast<std::uintptr_t>(buffer.device_address))
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("cuda release: {} +{:#x} (device pointer {}) is not "
                                              "an import of this importer",
                                              buffer.host_address, buffer.size,
                                              buffer.device_address));
            registration = it->second;
            registrations_.erase(it);
        }
        if (registration.kind == Kind::direct) return {}; // nothing was registered
        return unregister(host, registration);
    });
}

// The device pointer of [offset, offset + size) of one of this importer's imports or copies.
Result<CUdeviceptr> CudaImporter::device_range(const ImportedBuffer& buffer, std::uint64_t offset,
                                               std::uint64_t size, bool* direct) {
    const auto device = static_cast<CUdeviceptr>(
        reinterpret_cast<std::uintptr_t>(buffer.device_address));
    bool known = false;
    {
        std::lock_guard<std::mutex> guard(mutex_);
        if (buffer.imported) {
            auto it = registrations_.find(reinterpret_cast<std::uintptr_t>(buffer.host_address));
            *direct = it != registrations_.end() && it->second.kind == Kind::direct;
            known = it != registrations_.end() && it->second.kind != Kind::pin &&
                    it->second.device_pointer == device && it->second.size == buffer.size;
        } else {
            auto it = copies_.find(device);
            known = it != copies_.end() && it->second == buffer.size;
        }
    }
    if (!known)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("cuda read_back: {} (device pointer {}, {} bytes) is not a "
                                      "live {} of this importer",
                                      buffer.host_address, buffer.device_address, buffer.size,
                                      buffer.imported ? "import" : "copy"));
    if (offset > buffer.size || size > buffer.size - offset)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("cuda read_back [{}, +{}) outside a buffer of {} bytes",
                                      offset, size, buffer.size));
    return device + offset;
}

Status CudaImporter::read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                                       std::uint64_t size, void* dst) {
    if (!driver_)
        return make_error(ErrorKind::unsupported, "cuda read_back: the driver did not load");
    bool direct = false;
    Result<CUdeviceptr> source = device_range(buffer, offset, size, &direct);
    if (!source) return std::move(source).error();
    if (size == 0) return {};
    if (direct) return read_through_device(source.value(), size, dst);
    WM_CUDA_ENTER(current)
    const CUresult result = driver_->api().memcpy_dtoh(dst, source.value(), size);
    if (result != CUDA_SUCCESS)
        return make_error(ErrorKind::import_failed,
                          fmt::format("cuMemcpyDtoH({:#x}, {} bytes) failed: {}", source.value(),
                                      size, describe(result)));
    return {};
}

// A direct import's bytes as the device reads them: the device copies them from the host
// pointer into memory of its own, and that comes back to the host. Reading the host pointer with
// cuMemcpyDtoH alone might be served by the CPU. The copy in is cuMemcpy, whose kind the driver
// infers from the pointers (unified addressing): an explicit-kind copy (cuMemcpyDtoD) of pageable
// host memory is outside its contract and refused on some systems (issue 43).
Status CudaImporter::read_through_device(CUdeviceptr source, std::uint64_t size, void* dst) {
    WM_CUDA_ENTER(current)
    const Api& api = driver_->api();
    CUdeviceptr staging = 0;
    if (const CUresult allocated = api.mem_alloc(&staging, size); allocated != CUDA_SUCCESS)
        return make_error(ErrorKind::import_failed,
                          fmt::format("cuMemAlloc({} bytes) for a read-back failed on '{}': {}",
                                      size, facts_.name, describe(allocated)));
    CUresult result = api.memcpy_unified(staging, source, size);
    const char* step = "cuMemcpy";
    if (result == CUDA_SUCCESS) {
        result = api.memcpy_dtoh(dst, staging, size);
        step = "cuMemcpyDtoH";
    }
    api.mem_free(staging);
    if (result != CUDA_SUCCESS)
        return make_error(ErrorKind::import_failed,
                          fmt::format("{} of a direct import ({:#x}, {} bytes) failed on '{}': {}",
                                      step, source, size, facts_.name, describe(result)));
    return {};
}

Result<ImportedBuffer> CudaImporter::allocate_copy(const void* src, std::uint64_t size) {
    if (!driver_)
        return make_error(ErrorKind::unsupported,
                          fmt::format("cuda allocate_copy: {}", availability_.reason));
    if (src == nullptr || size == 0)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("cuda allocate_copy: null source ({}) or zero size ({})",
                                      src, size));
    WM_CUDA_ENTER(current)
    const Api& api = driver_->api();
    CUdeviceptr device = 0;
    if (const CUresult allocated = api.mem_alloc(&device, size); allocated != CUDA_SUCCESS)
        return make_error(ErrorKind::import_failed,
                          fmt::format("cuMemAlloc({} bytes) failed on '{}': {}", size,
                                      facts_.name, describe(allocated)));
    internal::Undo free([&] { api.mem_free(device); }); // until it is recorded
    if (const CUresult copied = api.memcpy_htod(device, src, size); copied != CUDA_SUCCESS)
        return make_error(ErrorKind::import_failed,
                          fmt::format("cuMemcpyHtoD({} bytes) failed on '{}': {}", size,
                                      facts_.name, describe(copied)));
    {
        std::lock_guard<std::mutex> guard(mutex_);
        copies_[device] = size;
    }
    free.dismiss();
    ImportedBuffer buffer;
    buffer.size = size;
    buffer.device_address = reinterpret_cast<void*>(static_cast<std::uintptr_t>(device));
    buffer.imported = false;
    return buffer;
}

Status CudaImporter::free_copy(const ImportedBuffer& buffer) noexcept {
    return internal::status_nothrow([&]() -> Status {
        const auto device = static_cast<CUdeviceptr>(
            reinterpret_cast<std::uintptr_t>(buffer.device_address));
        {
            std::lock_guard<std::mutex> guard(mutex_);
            auto it = copies_.find(device);
            if (buffer.imported || it == copies_.end() || it->second != buffer.size)
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("cuda free_copy: device pointer {} ({} bytes) is "
                                              "not a copy of this importer",
                                              buffer.device_address, buffer.size));
            copies_.erase(it);
        }
        WM_CUDA_ENTER(current)
        if (const CUresult freed = driver_->api().mem_free(device); freed != CUDA_SUCCESS)
            return make_error(ErrorKind::import_failed,
                              fmt::format("cuMemFree({:#x}) failed: {}", device, describe(freed)));
        return {};
    });
}

std::string CudaImporter::pin_unavailable_reason() const {
    if (!driver_) return availability_.reason;
    if (!facts_.host_register)
        return fmt::format("'{}' does not support cuMemHostRegister "
                           "(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED 0)",
                           facts_.name);
    return {};
}

Status CudaImporter::pin(void* host, std::uint64_t size) {
    if (std::string why = pin_unavailable_reason(); !why.empty())
        return make_error(ErrorKind::unsupported, "cuda pin: " + why);
    if (Status ok = check_range("cuda pin", host, size); !ok) return ok;
    CUdeviceptr unused = 0;
    return register_range(host, size,
                          facts_.read_only_register ? CU_MEMHOSTREGISTER_READ_ONLY : 0u,
                          Kind::pin, &unused);
}

Status CudaImporter::unpin(void* host) noexcept {
    return internal::status_nothrow([&]() -> Status {
        const auto address = reinterpret_cast<std::uintptr_t>(host);
        Registration registration;
        {
            std::lock_guard<std::mutex> guard(mutex_);
            auto it = registrations_.find(address);
            if (it == registrations_.end() || it->second.kind != Kind::pin)
                return make_error(ErrorKind::invalid_argument,
                                  fmt::format("cuda unpin: {} is not pinned by this importer",
                                              host));
            registration = it->second;
            registrations_.erase(it);
        }
        return unregister(address, registration);
    });
}

#undef WM_CUDA_ENTER

} // namespace wm::cuda

namespace wm {

Result<CudaImporterState> cuda_importer_state(const Importer& cuda_importer) {
    const auto* importer = dynamic_cast<const cuda::CudaImporter*>(&cuda_importer);
    if (importer == nullptr)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("cuda_importer_state: importer '{}' was not made by "
                                      "make_cuda_importer", cuda_importer.name()));
    return importer->state();
}

} // namespace wm
