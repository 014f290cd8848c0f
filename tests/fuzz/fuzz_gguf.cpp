// SPDX-License-Identifier: MIT
// libFuzzer target: arbitrary bytes as a GGUF file. The reader must return an error or a model
// that keeps every promise of formats.hpp (inside the file, no overlaps, sizes from type x
// shape); such a model must then place and plan without error, since the planner's checks are a
// subset of the reader's. Traps on any broken promise; ASan/UBSan catch the rest.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "formats/model_invariants.hpp"
#include "weightmap/formats.hpp"
#include "weightmap/placement_rules.hpp"
#include "weightmap/planner.hpp"

namespace {

void check(const wm::Result<wm::ModelInfo>& model) {
    if (!model) {
        if (model.error().message.empty()) __builtin_trap();
        return;
    }
    if (!wm::test::model_invariant_violation(*model).empty()) __builtin_trap();
    static const wm::PlacementRules rules = [] {
        wm::PlacementRules r;
        r.add_cpu_moe();
        return r;
    }();
    auto desc = wm::to_model_desc(*model, rules,
                                  [](std::string_view name) -> wm::Result<wm::TargetDesc> {
        wm::TargetDesc t;
        t.name = std::string(name);
        t.caps.is_cpu = name == wm::cpu_target_name;
        return t;
    });
    if (!desc) __builtin_trap();
    wm::PlanOptions options;
    options.import_enabled = true;
    options.page_size = 4096;
    if (!wm::make_plan(*desc, options)) __builtin_trap();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    check(wm::parse_gguf(bytes, size, "fuzz.gguf"));
    // The same header in a larger file: tensors may now point into data the reader never sees.
    check(wm::parse_gguf(bytes, std::uint64_t{size} + (std::uint64_t{1} << 20), "fuzz.gguf"));
    return 0;
}
