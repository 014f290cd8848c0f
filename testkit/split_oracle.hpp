// SPDX-License-Identifier: MIT
// split_oracle.hpp - races in a scheduler's trace, judged from the bytes each split really read
// and wrote and the waits the scheduler really made. Independent of the helper and of the
// simulator (testkit/split_sim.hpp), which both decide from buffer types: whatever their model
// of memory leaves out (a split reading another backend's buffer in place, say) shows here.
//
// Reads the split-trace format (split_trace.hpp) and three more lines, which the libllama sync
// hook writes (integrations/llama.cpp, LLAMA_WEIGHTMAP_SPLIT_SYNC_TRACE):
//   wait backends=MASK                    before a split: the backends the host waited for
//   read buffer=ID offset=N size=N        after a split's line: bytes it reads (its nodes'
//   write buffer=ID offset=N size=N       sources, its input copies' sources) or writes
// Buffer ids are the engine's buffer handles; offsets are from the buffer's base, so a device
// buffer's private address space needs no host address. `sync backends=MASK` is a host
// synchronization too, wherever it stands.
//
// Model (the ggml scheduler's): a backend runs its splits in submission order; a synchronous
// backend's split has finished when it is submitted; an asynchronous backend's split has
// finished once the host waited for, or synchronized, that backend after submitting it. A hazard
// is a split whose writes overlap bytes that an unfinished split of another backend reads: the
// allocator reused memory still in use (ggml #26040). Unfinished splits carry across graphs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "weightmap/result.hpp"

namespace wm::testkit {

struct OracleReport {
    std::uint64_t graphs = 0;
    std::uint64_t splits = 0;
    std::uint64_t accesses = 0; ///< read and write lines
    std::uint64_t hazards = 0;  ///< splits whose writes overlap an unfinished read
    std::string first_hazard;   ///< "line N: split K (backend B) writes ... read by split J (backend C)"
};

/// Checks a trace. Errors (ErrorKind::format) name `source`, the line and the field.
Result<OracleReport> check_split_trace(std::string_view text, std::string_view source);

} // namespace wm::testkit
