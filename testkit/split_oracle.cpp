// SPDX-License-Identifier: MIT
#include "testkit/split_oracle.hpp"

#include "testkit/split_trace.hpp"

#include <map>
#include <vector>

#include <fmt/format.h>

namespace wm::testkit {
namespace {

using Fields = std::map<std::string, std::uint64_t>;

struct Read {
    std::uint64_t split = 0;
    std::uint32_t backend = 0;
    std::uint64_t buffer = 0, begin = 0, end = 0;
};

struct Oracle {
    OracleReport report;
    std::vector<Read> unfinished;       // reads of asynchronous splits no wait has covered yet
    std::vector<Read> current_reads;    // the current split's, added once it is submitted
    std::uint32_t backend = 0;
    bool async = false, in_split = false, hazard_in_split = false;

    void finish(std::uint64_t backends) {
        std::vector<Read> left;
        for (const Read& r : unfinished)
            if (!(backends >> r.backend & 1)) left.push_back(r);
        unfinished.swap(left);
    }
    void submit() { // the current split's reads become unfinished work of its backend
        if (in_split && async)
            unfinished.insert(unfinished.end(), current_reads.begin(), current_reads.end());
        current_reads.clear();
        in_split = false;
    }
    void write(const Read& w, std::size_t line) {
        for (const Read& r : unfinished) {
            if (r.backend == w.backend || r.buffer != w.buffer || r.end <= w.begin || w.end <= r.begin)
                continue;
            if (!hazard_in_split) {
                ++report.hazards;
                if (report.first_hazard.empty())
                    report.first_hazard = fmt::format(
                        "line {}: split {} (backend {}) writes buffer {:#x} [{}, {}) read by unfinished split {} (backend {})",
                        line, w.split, w.backend, w.buffer, w.begin, w.end, r.split, r.backend);
            }
            hazard_in_split = true;
            return;
        }
    }
};

} // namespace

Result<OracleReport> check_split_trace(std::string_view text, std::string_view source) {
    Oracle o;
    std::size_t number = 0;
    auto error = [&](const std::string& what) -> Result<OracleReport> {
        return Error{ErrorKind::format, fmt::format("{}:{}: {}", source, number, what)};
    };
    while (!text.empty()) {
        const std::size_t nl = text.find('\n');
        const std::string_view row = text.substr(0, nl);
        text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
        ++number;
        if (row.empty() || row[0] == '#') continue;
        const std::string_view word = row.substr(0, row.find(' '));
        auto parsed = sim::parse_trace_fields(row.substr(word.size()), source, number);
        if (!parsed) return std::move(parsed).error();
        Fields f = std::move(parsed).value();
        if (word == "graph") {
            o.submit();
            ++o.report.graphs;
        } else if (word == "split") {
            o.submit();
            if (!f.count("backend") || !f.count("async") || f["backend"] >= 64)
                return error("split without a valid backend or async field");
            o.backend = static_cast<std::uint32_t>(f["backend"]);
            o.async = f["async"] != 0;
            o.in_split = true;
            o.hazard_in_split = false;
            ++o.report.splits;
        } else if (word == "wait" || word == "sync") {
            o.submit();
            if (!f.count("backends")) return error(fmt::format("{} without backends", word));
            o.finish(f["backends"]);
        } else if (word == "read" || word == "write") {
            if (!o.in_split) return error(fmt::format("{} outside a split", word));
            if (!f.count("buffer") || !f.count("offset") || !f.count("size"))
                return error(fmt::format("{} needs buffer, offset and size", word));
            const Read access{o.report.splits - 1, o.backend, f["buffer"], f["offset"], f["offset"] + f["size"]};
            ++o.report.accesses;
            if (word == "read")
                o.current_reads.push_back(access);
            else
                o.write(access, number);
        } else if (word == "end") {
            o.submit();
        } else {
            return error(fmt::format("unknown line '{}'", word));
        }
    }
    o.submit();
    return o.report;
}

} // namespace wm::testkit
