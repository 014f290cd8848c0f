// SPDX-License-Identifier: MIT
// Status-returning bodies inside noexcept functions (an importer's release, free_copy).
#pragma once

#include <utility>

#include "weightmap/result.hpp"

namespace wm::internal {

/// Runs `body` (returning Status) so that nothing escapes: formatting a message can throw
/// bad_alloc, and a noexcept release that throws terminates the engine. The fallback message is
/// short enough for std::string's small-string buffer, so reporting it allocates nothing.
template <class Body>
Status status_nothrow(Body&& body) noexcept {
    try {
        return std::forward<Body>(body)();
    } catch (...) {
        return Error{ErrorKind::out_of_memory, "out of memory"};
    }
}

} // namespace wm::internal
