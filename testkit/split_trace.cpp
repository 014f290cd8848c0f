// SPDX-License-Identifier: MIT
#include "testkit/split_trace.hpp"

#include <cstdlib>
#include <map>

#include <fmt/format.h>

namespace wm::testkit::sim {
namespace {

struct Line {
    std::string_view source;
    std::size_t number = 0;
    Error error(const std::string& what) const {
        return {ErrorKind::format, fmt::format("{}:{}: {}", source, number, what)};
    }
};

// The fields of the current line (parse_trace_fields).
Result<std::map<std::string, std::uint64_t>> read_fields(std::string_view rest, const Line& line) {
    return parse_trace_fields(rest, line.source, line.number);
}

// The SplitDesc of a "split" line: every field present, flags 0 or 1.
Result<SplitDesc> read_split(std::map<std::string, std::uint64_t> f, const Line& line) {
    static constexpr const char* names[] = {"backend", "async", "n_inputs", "input_backends",
                                            "copies_async", "buffer_types", "writes_read_later"};
    for (const char* name : names)
        if (f.count(name) == 0) return line.error(fmt::format("split without field {}", name));
    if (f.size() != std::size(names)) return line.error("split with an unknown field");
    for (const char* flag : {"async", "copies_async", "writes_read_later"})
        if (f[flag] > 1) return line.error(fmt::format("field {}: {} is not 0 or 1", flag, f[flag]));
    if (f["backend"] >= split_sync_max_backends || f["n_inputs"] > UINT32_MAX)
        return line.error("field backend or n_inputs out of range");
    return make_split(static_cast<std::uint32_t>(f["backend"]), f["async"] == 1, f["buffer_types"],
                      static_cast<std::uint32_t>(f["n_inputs"]), f["input_backends"],
                      f["copies_async"] == 1, f["writes_read_later"] == 1);
}

} // namespace

Result<std::map<std::string, std::uint64_t>> parse_trace_fields(std::string_view rest,
                                                                std::string_view source,
                                                                std::size_t number) {
    const Line line{source, number};
    std::map<std::string, std::uint64_t> fields;
    while (!rest.empty()) {
        const std::size_t start = rest.find_first_not_of(' ');
        if (start == std::string_view::npos) break;
        rest.remove_prefix(start);
        const std::string_view word = rest.substr(0, rest.find(' '));
        rest.remove_prefix(word.size());
        const std::size_t eq = word.find('=');
        if (eq == std::string_view::npos || eq == 0 || eq + 1 == word.size())
            return line.error(fmt::format("expected key=value, got '{}'", word));
        const std::string key(word.substr(0, eq)), value(word.substr(eq + 1));
        char* end = nullptr;
        const unsigned long long n = std::strtoull(value.c_str(), &end, 0);
        if (end == value.c_str() || *end != '\0' || value[0] == '-')
            return line.error(fmt::format("field {}: '{}' is not a number", key, value));
        if (!fields.emplace(key, n).second)
            return line.error(fmt::format("field {} given twice", key));
    }
    return fields;
}

namespace {

// The trace being read: graphs, and what applies to the next split.
struct TraceReader {
    std::vector<Graph> graphs;
    bool open = false;           // inside graph ... end
    bool carry_next = false;     // the last graph ended with carry=1: the next one continues it
    BackendMask synced_next = 0; // sync lines since the last split
    Line line;

    Result<bool> graph(const std::map<std::string, std::uint64_t>& f) {
        if (open) return line.error("graph inside a graph (missing 'end')");
        const std::size_t carry = f.count("carry");
        if (f.size() != 1 + carry || f.count("n_backends") == 0 || f.at("n_backends") == 0 ||
            f.at("n_backends") > split_sync_max_backends || (carry && f.at("carry") > 1))
            return line.error("graph needs n_backends=1..64, optionally carry=0|1, and nothing else");
        const auto n = static_cast<std::uint32_t>(f.at("n_backends"));
        if (carry_next && graphs.back().n_backends != n)
            return line.error(fmt::format("graph of {} backends continues one of {}", n,
                                          graphs.back().n_backends));
        if (carry_next) {
            graphs.back().graph_starts.push_back(
                static_cast<std::uint32_t>(graphs.back().splits.size()));
        } else {
            Graph g;
            g.name = fmt::format("{}:{}", line.source, line.number);
            g.n_backends = n;
            graphs.push_back(std::move(g));
        }
        graphs.back().carried = graphs.back().carried || (carry && f.at("carry") == 1);
        carry_next = carry && f.at("carry") == 1;
        open = true;
        return true;
    }

    Result<bool> split(std::map<std::string, std::uint64_t> f) {
        if (!open) return line.error("split outside a graph");
        auto split = read_split(std::move(f), line);
        if (!split) return std::move(split).error();
        Graph& g = graphs.back();
        if (split->backend >= g.n_backends)
            return line.error(fmt::format("backend {} of a graph of {} backends", split->backend,
                                          g.n_backends));
        if (synced_next != 0) {
            g.engine_synced.resize(g.splits.size() + 1, 0);
            g.engine_synced.back() = synced_next;
            synced_next = 0;
        }
        g.splits.push_back(*split);
        return true;
    }

    Result<bool> sync(const std::map<std::string, std::uint64_t>& f) {
        if (f.size() != 1 || f.count("backends") == 0)
            return line.error("sync needs backends=MASK and nothing else");
        if (graphs.empty()) return true; // before the first graph: nothing in flight
        synced_next |= f.at("backends");
        return true;
    }

    Result<std::vector<Graph>> done() {
        if (open) return line.error("the last graph has no 'end'");
        if (!graphs.empty()) graphs.back().engine_synced_end |= synced_next;
        return std::move(graphs);
    }
};

} // namespace

Result<std::vector<Graph>> parse_split_trace(std::string_view text, std::string_view source) {
    TraceReader reader;
    reader.line = Line{source, 0};
    while (!text.empty()) {
        const std::size_t nl = text.find('\n');
        std::string_view row = text.substr(0, nl);
        text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
        ++reader.line.number;
        if (row.empty() || row[0] == '#') continue;
        const std::string_view word = row.substr(0, row.find(' '));
        auto fields = read_fields(row.substr(word.size()), reader.line);
        if (!fields) return std::move(fields).error();
        Result<bool> read = true;
        if (word == "graph") {
            read = reader.graph(*fields);
        } else if (word == "split") {
            read = reader.split(std::move(fields).value());
        } else if (word == "sync") {
            read = reader.sync(*fields);
        } else if (word == "end") {
            if (!reader.open) return reader.line.error("end outside a graph");
            reader.open = false;
        } else if (word == "wait" || word == "read" || word == "write") {
            // the oracle's lines (split_oracle.hpp): a replay simulates its rules' waits itself
            // and decides from buffer types, not from the bytes a split touched
        } else {
            return reader.line.error(fmt::format("unknown line '{}'", word));
        }
        if (!read) return std::move(read).error();
    }
    return reader.done();
}

std::string format_split_trace(const Graph& graph) {
    const char* carry = graph.carried ? " carry=1" : "";
    std::string out = fmt::format("graph n_backends={}{}\n", graph.n_backends, carry);
    for (std::size_t i = 0; i < graph.splits.size(); ++i) {
        if (i > 0 && graph.starts_graph(i))
            out += fmt::format("end\ngraph n_backends={}{}\n", graph.n_backends, carry);
        if (const BackendMask synced = graph.engine_synced_before(i))
            out += fmt::format("sync backends={:#x}\n", synced);
        const SplitDesc& s = graph.splits[i];
        out += fmt::format("split backend={} async={} n_inputs={} input_backends={:#x} "
                           "copies_async={} buffer_types={:#x} writes_read_later={}\n",
                           s.backend, s.backend_async ? 1 : 0, s.n_inputs, s.input_backends,
                           s.input_copies_async ? 1 : 0, s.buffer_types,
                           s.writes_read_later ? 1 : 0);
    }
    out += "end\n";
    if (graph.engine_synced_end != 0)
        out += fmt::format("sync backends={:#x}\n", graph.engine_synced_end);
    return out;
}

} // namespace wm::testkit::sim
