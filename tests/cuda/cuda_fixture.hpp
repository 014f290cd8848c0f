// SPDX-License-Identifier: MIT
// What the CUDA importer tests share: an importer on the fake driver, and a file mapped as an
// engine maps weights (read-only by default, as the mapping policy does for this importer).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "cuda/fake_cuda.hpp"
#include "support/file_mapping.hpp"
#include "support/temp_file.hpp"
#include "weightmap/backends/cuda.hpp"
#include "weightmap/planner.hpp"

namespace wm::test {

/// A CUDA importer on the fake driver with `params` (library_path filled in).
inline std::unique_ptr<Importer> fake_cuda_importer(CudaImporterParams params = {}) {
    params.library_path = fake_cuda_path;
    auto made = make_cuda_importer(params);
    if (!made) throw std::runtime_error("make_cuda_importer: " + made.error().message);
    return std::move(made).value();
}

/// A pattern file of `pages` pages and its MAP_SHARED mapping.
struct MappedPatternFile {
    explicit MappedPatternFile(std::uint64_t pages, bool writable = false)
        : file(pages * host_page_size()), map(file.path(), file.size(), writable) {}
    TempFile file;
    FileMapping map;
    std::byte* page(std::uint64_t n) const { return map.base() + n * host_page_size(); }
};

} // namespace wm::test
