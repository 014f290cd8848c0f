// SPDX-License-Identifier: MIT
// The CUDA importer's class, private to backends/cuda: cuda_importer.cpp implements it and
// cuda_pin.cpp (cuda_pin_fallbacks) uses its pin()/unpin().
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cuda_driver.hpp"
#include "weightmap/backends/cuda.hpp"
#include "weightmap/importer.hpp"

namespace wm::cuda {

/// What the importer read of its device once, at creation.
struct DeviceFacts {
    CUdevice device = 0;
    std::string name;                  ///< cuDeviceGetName, e.g. "NVIDIA GB10"
    bool integrated = false;           ///< CU_DEVICE_ATTRIBUTE_INTEGRATED
    bool pageable_access = false;      ///< ..._PAGEABLE_MEMORY_ACCESS
    bool host_page_tables = false;     ///< ..._PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
    bool read_only_register = false;   ///< ..._READ_ONLY_HOST_REGISTER_SUPPORTED
    bool host_register = false;        ///< ..._HOST_REGISTER_SUPPORTED
    bool can_map_host = false;         ///< ..._CAN_MAP_HOST_MEMORY
    DeviceMemory memory = DeviceMemory::unknown;
    std::string memory_note;
    CudaImportMethod method = CudaImportMethod::unavailable; ///< from the attributes above
    std::string method_note;
};

class CudaImporter final : public Importer {
public:
    /// driver == nullptr: unavailable for `reason`, and nothing else is used. `engine_context`
    /// null: the primary context of facts.device, retained on first use.
    CudaImporter(std::unique_ptr<Driver> driver, DeviceFacts facts, CUcontext engine_context,
                 Availability availability);
    ~CudaImporter() override;

    std::string_view name() const noexcept override { return "cuda"; }
    ImporterCaps caps() const noexcept override;
    ImporterNotes notes() const noexcept override;
    Availability available() const override { return availability_; }
    Status release_checked(const ImportedBuffer& buffer) noexcept override;
    Status read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                             std::uint64_t size, void* dst) override;
    Result<ImportedBuffer> allocate_copy(const void* src, std::uint64_t size) override;
    Status free_copy(const ImportedBuffer& buffer) noexcept override;

    /// Page-locks [host, host + size) for DMA copies (no device mapping): both page-aligned.
    /// Works whenever the driver loaded and the device supports host registration, whatever
    /// available() says about imports.
    Status pin(void* host, std::uint64_t size);
    /// Unregisters a pin made by pin(); refuses anything else without calling the driver.
    Status unpin(void* host) noexcept;
    /// Why pin() cannot work here; empty when it can.
    std::string pin_unavailable_reason() const;
    CudaImporterState state() const;

protected:
    Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) override;

private:
    // import: registered and mapped; direct: the host pointer, nothing registered; pin:
    // registered for DMA, not an import.
    enum class Kind { import, direct, pin };
    struct Registration {
        std::uint64_t size = 0;
        CUdeviceptr device_pointer = 0; // 0 for a pin; the host address for a direct import
        Kind kind = Kind::import;
    };

    Result<CUcontext> context();
    Status check_range(const char* what, void* host, std::uint64_t size) const;
    Status register_range(void* host, std::uint64_t size, unsigned flags, Kind kind,
                          CUdeviceptr* device_pointer, CUresult* refusal = nullptr);
    Result<ImportedBuffer> import_registered(void* host, std::uint64_t size);
    Result<ImportedBuffer> import_direct(void* host, std::uint64_t size);
    void switch_to_direct(const std::string& refusal);
    Status read_through_device(CUdeviceptr source, std::uint64_t size, void* dst);
    Status unregister(std::uintptr_t host, const Registration& registration) noexcept;
    Result<CUdeviceptr> device_range(const ImportedBuffer& buffer, std::uint64_t offset,
                                     std::uint64_t size, bool* direct);
    void release_leftovers() noexcept;
    bool needs_writable_mapping(CudaImportMethod method) const noexcept;
    std::string device_memory_note(CudaImportMethod method) const;
    std::string describe(CUresult result) const { return driver_->describe(result); }

    std::unique_ptr<Driver> driver_; // null when unavailable
    const DeviceFacts facts_;
    const CUcontext engine_context_;
    const Availability availability_;
    const std::uint64_t page_;
    std::atomic<CudaImportMethod> method_; // register_host until the driver refuses it (801)
    // notes().device_memory under each method, made once: the method may switch while an earlier
    // caller still holds the note it was given.
    const std::string memory_note_register_, memory_note_other_;

    mutable std::mutex mutex_;
    CUcontext primary_ = nullptr; // retained on first use when there is no engine context
    std::map<std::uintptr_t, Registration> registrations_; // imports and pins, by host address
    std::map<CUdeviceptr, std::uint64_t> copies_;          // allocate_copy's, by device pointer
};

} // namespace wm::cuda
