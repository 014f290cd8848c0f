// SPDX-License-Identifier: MIT
// Split traces: the split descriptions a real scheduler fed the helper (ggml's, patched by
// integrations/llama.cpp, with WEIGHTMAP_SPLIT_SYNC_TRACE=FILE), read back as simulator graphs.
//
// The format is text, one graph per block, every number in the SplitDesc field's own terms:
//   graph n_backends=2
//   split backend=1 async=1 n_inputs=2 input_backends=0x1 copies_async=1 buffer_types=0x2 writes_read_later=0
//   ...
//   end
//   sync backends=0x3
// `graph ... carry=1`: the scheduler ended this graph without a drain (SplitSync::end_graph), so
// the next graph block continues the same run (one simulator Graph, Graph::graph_starts).
// `sync backends=MASK`: the scheduler synchronized these backends itself (a full sync before
// results are read, its own sync before input copies); it applies before the next split, or at
// the end of the run (Graph::engine_synced, engine_synced_end).
// Lines starting with '#' and empty lines are ignored; fields may come in any order, each once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "testkit/split_sim.hpp"
#include "weightmap/result.hpp"

namespace wm::testkit::sim {

/// The "key=value key=value ..." fields after a trace line's first word: numbers (any base
/// strtoull takes), each key once. Errors (ErrorKind::format) name `source` and `line`.
Result<std::map<std::string, std::uint64_t>> parse_trace_fields(std::string_view rest,
                                                                std::string_view source,
                                                                std::size_t line);

/// The graphs of a trace, in order, without regions (allocate_regions() makes them). Errors
/// (ErrorKind::format) name `source`, the line and the field.
Result<std::vector<Graph>> parse_split_trace(std::string_view text, std::string_view source);

/// One simulator graph (a run of carried graphs included) in the trace format, for tests.
std::string format_split_trace(const Graph& graph);

} // namespace wm::testkit::sim
