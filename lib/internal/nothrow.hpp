// SPDX-License-Identifier: MIT
// Status- and Result-returning bodies inside noexcept functions (an importer's release,
// free_copy) and at the API's edge (the format readers), where no exception may cross.
#pragma once

#include <type_traits>
#include <utility>

#include "weightmap/result.hpp"

namespace wm::internal {

/// Runs `body` (returning a Result or Status) so that nothing escapes: formatting a message can
/// throw bad_alloc, and a noexcept release that throws terminates the engine. The fallback
/// message is short enough for std::string's small-string buffer, so reporting it allocates
/// nothing.
template <class Body>
auto result_nothrow(Body&& body) noexcept -> std::invoke_result_t<Body> {
    try {
        return std::forward<Body>(body)();
    } catch (...) {
        return Error{ErrorKind::out_of_memory, "out of memory"};
    }
}

template <class Body>
Status status_nothrow(Body&& body) noexcept {
    return result_nothrow(std::forward<Body>(body));
}

} // namespace wm::internal
