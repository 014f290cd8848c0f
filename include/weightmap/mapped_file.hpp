// SPDX-License-Identifier: MIT
// mapped_file.hpp - one weight file's mapping: what the mapping layer makes and the executor
// imports from. Its own header so that mapping.hpp (below the executor) need not include
// executor.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace wm {

/// One file's mapping as the executor sees it (the mapping layer, or an engine's own mmap).
/// Plain data; the mapping belongs to whoever made it.
struct MappedFile {
    std::byte* base = nullptr;   ///< page-aligned start of the mapping of file offset 0
    std::uint64_t length = 0;    ///< mapped length: the file size rounded up to whole pages
};

} // namespace wm
