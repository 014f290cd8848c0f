// SPDX-License-Identifier: MIT
// Defaults of the importer interface's optional entries.
#include "weightmap/importer.hpp"

#include <cstring>

#include <fmt/format.h>

namespace wm {

Status Importer::read_back(const ImportedBuffer& buffer, std::uint64_t offset, std::uint64_t size,
                           void* dst) {
    if (buffer.device_address == nullptr)
        return make_error(ErrorKind::unsupported,
                          fmt::format("{} importer cannot read its buffers back", name()));
    if (offset > buffer.size || size > buffer.size - offset)
        return make_error(ErrorKind::invalid_argument,
                          fmt::format("read_back [{}, +{}) outside a buffer of {} bytes", offset,
                                      size, buffer.size));
    std::memcpy(dst, static_cast<const std::byte*>(buffer.device_address) + offset, size);
    return {};
}

Result<ImportedBuffer> Importer::allocate_copy(const void*, std::uint64_t) {
    return make_error(ErrorKind::unsupported,
                      fmt::format("{} importer cannot allocate device copies", name()));
}

Status Importer::free_copy(const ImportedBuffer&) noexcept {
    return make_error(ErrorKind::unsupported,
                      fmt::format("{} importer has no device copies to free", name()));
}

} // namespace wm
