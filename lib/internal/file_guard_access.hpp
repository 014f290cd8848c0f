// SPDX-License-Identifier: MIT
// What the C API needs of FileGuard beyond its public interface. Internal.
#pragma once

#include "weightmap/file_guard.hpp"

namespace wm::internal {

struct FileGuardAccess {
    /// FileGuard::create, except that no event is delivered until publish(guard): for a wrapper
    /// that must first store the handle where the callback finds it (the C API's *out), so that
    /// the callback's first event can already release. A guard never published delivers
    /// nothing; destroying it is fine.
    static Result<FileGuard> create_unpublished(FileGuardParams params);
    /// Lets the guard's thread deliver events; everything the caller wrote before is visible to
    /// the callback. Idempotent.
    static void publish(FileGuard& guard) noexcept;
};

} // namespace wm::internal
