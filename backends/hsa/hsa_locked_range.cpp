// SPDX-License-Identifier: MIT
// HsaLockedRange: compiled with and without the HSA importer, because it only holds an import
// and releases it through the importer's interface; hsa_lock_superset() is what needs HSA.
#include <cstddef>
#include <utility>

#include "weightmap/backends/hsa.hpp"
#include "weightmap/log.hpp"

namespace wm {

HsaLockedRange::HsaLockedRange(HsaLockedRange&& other) noexcept
    : importer_(std::exchange(other.importer_, nullptr)), buffer_(other.buffer_),
      delta_(other.delta_) {}

HsaLockedRange& HsaLockedRange::operator=(HsaLockedRange&& other) noexcept {
    if (this != &other) {
        if (Status s = release(); !s) log_message({}, LogLevel::warning, s.error().message);
        importer_ = std::exchange(other.importer_, nullptr);
        buffer_ = other.buffer_;
        delta_ = other.delta_;
    }
    return *this;
}

HsaLockedRange::~HsaLockedRange() {
    if (Status s = release(); !s) log_message({}, LogLevel::warning, s.error().message);
}

void* HsaLockedRange::agent_address() const noexcept {
    if (buffer_.device_address == nullptr) return nullptr;
    return static_cast<std::byte*>(buffer_.device_address) + delta_;
}

Status HsaLockedRange::release() noexcept {
    Importer* importer = std::exchange(importer_, nullptr);
    if (importer == nullptr) return {};
    return importer->release(buffer_);
}

} // namespace wm
