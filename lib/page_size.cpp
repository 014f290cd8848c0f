// SPDX-License-Identifier: MIT
#include "internal/page_size.hpp"

#include <unistd.h>

namespace wm {

std::uint64_t host_page_size() noexcept {
    static const std::uint64_t page = [] {
        long value = sysconf(_SC_PAGESIZE);
        return value > 0 ? static_cast<std::uint64_t>(value) : std::uint64_t{4096};
    }();
    return page;
}

} // namespace wm
