// SPDX-License-Identifier: MIT
// Default constructors of the optional importers, defined in backends/<name>/ when built.
#pragma once

#include <memory>

#include "weightmap/importer.hpp"

namespace wm {
std::unique_ptr<Importer> create_default_hsa_importer();
std::unique_ptr<Importer> create_default_vulkan_importer();
std::unique_ptr<Importer> create_default_cuda_importer();
} // namespace wm
