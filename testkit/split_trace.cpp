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

// "key=value key=value ..." after the line's first word, into `fields` (each key once).
Result<std::map<std::string, std::uint64_t>> read_fields(std::string_view rest, const Line& line) {
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

Result<std::vector<Graph>> parse_split_trace(std::string_view text, std::string_view source) {
    std::vector<Graph> graphs;
    bool open = false;
    Line line{source, 0};
    while (!text.empty()) {
        const std::size_t nl = text.find('\n');
        std::string_view row = text.substr(0, nl);
        text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
        ++line.number;
        if (row.empty() || row[0] == '#') continue;
        const std::string_view word = row.substr(0, row.find(' '));
        auto fields = read_fields(row.substr(word.size()), line);
        if (!fields) return std::move(fields).error();
        if (word == "graph") {
            if (open) return line.error("graph inside a graph (missing 'end')");
            if (fields->size() != 1 || fields->count("n_backends") == 0 ||
                fields->at("n_backends") == 0 || fields->at("n_backends") > split_sync_max_backends)
                return line.error("graph needs n_backends=1..64 and nothing else");
            Graph g;
            g.name = fmt::format("{}:{}", source, line.number);
            g.n_backends = static_cast<std::uint32_t>(fields->at("n_backends"));
            graphs.push_back(std::move(g));
            open = true;
        } else if (word == "split") {
            if (!open) return line.error("split outside a graph");
            auto split = read_split(std::move(fields).value(), line);
            if (!split) return std::move(split).error();
            if (split->backend >= graphs.back().n_backends)
                return line.error(fmt::format("backend {} of a graph of {} backends", split->backend,
                                              graphs.back().n_backends));
            graphs.back().splits.push_back(*split);
        } else if (word == "end") {
            if (!open) return line.error("end outside a graph");
            open = false;
        } else {
            return line.error(fmt::format("unknown line '{}'", word));
        }
    }
    if (open) return line.error("the last graph has no 'end'");
    return graphs;
}

std::string format_split_trace(const Graph& graph) {
    std::string out = fmt::format("graph n_backends={}\n", graph.n_backends);
    for (const SplitDesc& s : graph.splits)
        out += fmt::format("split backend={} async={} n_inputs={} input_backends={:#x} "
                           "copies_async={} buffer_types={:#x} writes_read_later={}\n",
                           s.backend, s.backend_async ? 1 : 0, s.n_inputs, s.input_backends,
                           s.input_copies_async ? 1 : 0, s.buffer_types,
                           s.writes_read_later ? 1 : 0);
    return out + "end\n";
}

} // namespace wm::testkit::sim
