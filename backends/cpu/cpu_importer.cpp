// SPDX-License-Identifier: MIT
// CPU passthrough: the CPU reads the mapping where it is, so "importing" is naming the pointer.
#include <memory>

#include "weightmap/registry.hpp"

namespace wm {
namespace {

class CpuImporter final : public Importer {
public:
    std::string_view name() const noexcept override { return "cpu"; }
    ImporterCaps caps() const noexcept override {
        ImporterCaps caps;
        caps.is_cpu = true;
        caps.alignment = 1;
        caps.survives_read_only_reprotect = true; // nothing is locked or registered
        return caps;
    }
    Availability available() const override { return {true, {}}; }
    Result<ImportedBuffer> import(void* host_address, std::uint64_t size) override {
        if (host_address == nullptr || size == 0)
            return make_error(ErrorKind::invalid_argument,
                              "cpu import: null address or zero size");
        ImportedBuffer buffer;
        buffer.host_address = host_address;
        buffer.size = size;
        buffer.device_address = host_address;
        return buffer;
    }
    Status release(const ImportedBuffer&) noexcept override { return {}; }
};

} // namespace

std::unique_ptr<Importer> make_cpu_importer() { return std::make_unique<CpuImporter>(); }

} // namespace wm
