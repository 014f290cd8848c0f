// SPDX-License-Identifier: MIT
// libFuzzer target: arbitrary bytes as a safetensors file. The reader must return an error or a
// model that keeps every promise of formats.hpp (inside the file, no overlaps, sizes from type x
// shape); such a model must then place and plan without error, since the planner's checks are a
// subset of the reader's. Traps on any broken promise; ASan/UBSan catch the rest.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "fuzz/fuzz_model_check.hpp"

using wm::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    check(wm::parse_safetensors(bytes, size, "fuzz.safetensors"));
    // The same header in a larger file: tensors may now point into data the reader never sees.
    check(wm::parse_safetensors(bytes, std::uint64_t{size} + (std::uint64_t{1} << 20),
                                "fuzz.safetensors"));
    return 0;
}
