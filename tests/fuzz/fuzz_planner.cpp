// SPDX-License-Identifier: MIT
// libFuzzer target: arbitrary bytes decoded into files, targets and tensors, planned in all three
// modes. The planner must either refuse an inconsistent description or return a plan that
// keeps every promise tests/support/plan_invariants.hpp checks (the unit tests use the same
// checker). Traps on any broken promise.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "support/plan_invariants.hpp"
#include "weightmap/planner.hpp"

namespace {

struct Bytes {
    const std::uint8_t* data;
    std::size_t size, pos = 0;
    std::uint64_t take(int n) {
        std::uint64_t v = 0;
        for (int i = 0; i < n; ++i) v = v << 8 | (pos < size ? data[pos++] : 0);
        return v;
    }
};

void check(const wm::ModelDesc& m, wm::PlanMode mode) {
    wm::PlanOptions o;
    o.mode = mode;
    o.page_size = 4096;
    o.import_enabled = true;
    o.merge_gap = 1 << 16;
    o.max_imports_per_region = 4;
    auto r = wm::make_plan(m, o);
    if (!r) {
        if (r.error().message.empty()) __builtin_trap();
        return;
    }
    const std::vector<std::string> broken = wm::test::plan_violations(m, *r, o.max_imports_per_region);
    if (!broken.empty()) {
        std::fprintf(stderr, "fuzz_planner: %s\n", broken.front().c_str());
        __builtin_trap();
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    Bytes in{data, size};
    wm::ModelDesc m;
    std::uint32_t files = 1 + in.take(1) % 3;
    for (std::uint32_t f = 0; f < files; ++f) m.files.push_back({"f", in.take(3) << 4});
    std::uint32_t targets = 1 + in.take(1) % 3;
    for (std::uint32_t t = 0; t < targets; ++t) {
        std::uint64_t bits = in.take(1);
        wm::TargetDesc target;
        target.name = "t" + std::to_string(t);
        target.importer_key = bits & 1 ? "shared" : target.name;
        target.caps.is_cpu = (bits & 6) == 6;
        target.caps.alignment = std::uint64_t{1} << (bits >> 3 & 31) % 20;
        target.caps.max_import_size = bits & 0x80 ? (in.take(2) + 1) << 12 : 0;
        // Half the targets unified (the rest discrete or unknown), a quarter with a policy.
        const std::uint64_t kind = in.take(1);
        constexpr wm::DeviceMemory memory[] = {wm::DeviceMemory::unified, wm::DeviceMemory::unified,
                                               wm::DeviceMemory::discrete,
                                               wm::DeviceMemory::unknown};
        target.caps.device_memory = memory[kind % 4];
        if ((kind >> 2) % 4 == 1)
            target.import_policy = kind >> 4 & 1 ? wm::ImportPolicy::always : wm::ImportPolicy::never;
        // Half the targets with a tensor alignment (offsets are multiples of 16 here).
        constexpr std::uint64_t tensor_alignment[] = {1, 0, 1, 1, 32, 64, 256, 65536};
        target.caps.tensor_alignment = tensor_alignment[kind >> 5 & 7];
        m.targets.push_back(target);
    }
    while (in.pos < in.size && m.tensors.size() < 4096) {
        wm::TensorDesc t;
        t.file = static_cast<std::uint32_t>(in.take(1) % (files + 1)); // sometimes out of range
        t.target = static_cast<std::uint32_t>(in.take(1) % targets);
        t.offset = in.take(3) << 4;
        t.size = in.take(3);
        m.tensors.push_back(t);
    }
    for (wm::PlanMode mode : {wm::PlanMode::span, wm::PlanMode::gate, wm::PlanMode::runs})
        check(m, mode);
    return 0;
}
