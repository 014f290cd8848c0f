// SPDX-License-Identifier: MIT
// The per-importer result table: a Catch2 listener that reads each conformance section's
// outcome ("<subject> | case <n>: ...") and prints, at the end of the run, one line per subject:
// "cpu: 8/8", "hsa-fake: 7/8 (FAIL: case 3)", "vulkan-default: SKIP (no Vulkan device)".
// A section that made no assertion and did not skip is a failure ("no assertion"): no case may
// pass vacuously. $WM_CONFORMANCE_REPORT, when set, names a file that gets the same lines.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "conformance/subject.hpp"

namespace wm::conformance {
namespace {

constexpr const char* separator = " | case ";
constexpr int case_count = 8;

enum class Outcome { pass, fail, skip, empty };

struct Table {
    std::mutex mutex;
    std::map<std::pair<std::string, int>, std::string> skips; // (subject, case) -> reason
    // subject -> case -> outcome, in the order subjects were first seen
    std::vector<std::string> order;
    std::map<std::string, std::map<int, Outcome>> outcomes;
};

Table& table() {
    static Table t;
    return t;
}

bool parse(const std::string& section, std::string& subject, int& case_number) {
    const auto at = section.find(separator);
    if (at == std::string::npos) return false;
    subject = section.substr(0, at);
    case_number = std::atoi(section.c_str() + at + std::char_traits<char>::length(separator));
    return case_number > 0;
}

struct ReportListener : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;

    void sectionEnded(Catch::SectionStats const& stats) override {
        std::string subject;
        int number = 0;
        if (!parse(stats.sectionInfo.name, subject, number)) return;
        Table& t = table();
        std::lock_guard lock(t.mutex);
        Outcome outcome = Outcome::pass;
        if (t.skips.count({subject, number}) != 0)
            outcome = stats.assertions.failed > 0 ? Outcome::fail : Outcome::skip;
        else if (stats.assertions.failed > 0)
            outcome = Outcome::fail;
        else if (stats.assertions.passed == 0)
            outcome = Outcome::empty;
        if (t.outcomes.count(subject) == 0) t.order.push_back(subject);
        Outcome& slot = t.outcomes[subject][number];
        // A section can end more than once only when Catch re-enters it; keep the worst.
        if (slot != Outcome::fail) slot = outcome;
    }

    void testRunEnded(Catch::TestRunStats const& stats) override {
        Table& t = table();
        std::vector<std::string> lines;
        bool any_run = false, any_empty = false;
        {
            std::lock_guard lock(t.mutex);
            for (const std::string& subject : t.order) {
                const auto& cases = t.outcomes[subject];
                int passed = 0, skipped = 0;
                std::string failed, empty, skip_reason;
                for (const auto& [number, outcome] : cases) {
                    switch (outcome) {
                    case Outcome::pass: ++passed; break;
                    case Outcome::fail:
                        failed += (failed.empty() ? "" : ", ") + std::to_string(number);
                        break;
                    case Outcome::empty:
                        empty += (empty.empty() ? "" : ", ") + std::to_string(number);
                        break;
                    case Outcome::skip:
                        ++skipped;
                        if (skip_reason.empty()) skip_reason = t.skips[{subject, number}];
                        break;
                    }
                }
                const int ran = static_cast<int>(cases.size()) - skipped;
                std::string line = subject + ": ";
                if (ran == 0) {
                    line += "SKIP (" + skip_reason + ")";
                } else {
                    any_run = true;
                    line += std::to_string(passed) + "/" + std::to_string(ran);
                    if (ran != case_count || skipped != 0)
                        line += " (of " + std::to_string(case_count) + " cases; " +
                                std::to_string(skipped) + " skipped)";
                    if (!failed.empty()) line += " FAIL: case " + failed;
                    if (!empty.empty()) {
                        line += " NO ASSERTION: case " + empty;
                        any_empty = true;
                    }
                }
                lines.push_back(line);
            }
        }
        std::fflush(stdout);
        std::printf("\n=== importer conformance (%s) ===\n", stats.runInfo.name.c_str());
        for (const std::string& line : lines) std::printf("%s\n", line.c_str());
        if (const char* path = std::getenv("WM_CONFORMANCE_REPORT"); path != nullptr && *path) {
            if (FILE* f = std::fopen(path, "a")) {
                for (const std::string& line : lines) std::fprintf(f, "%s\n", line.c_str());
                std::fclose(f);
            }
        }
        std::fflush(stdout);
        if (any_empty) {
            std::printf("FAIL: a conformance section made no assertion and did not skip\n");
            std::fflush(stdout);
            std::exit(1);
        }
        if (!lines.empty() && !any_run && stats.totals.assertions.failed == 0) {
            // Every subject of this executable skipped every case: meson's SKIP, never a pass.
            std::printf("SKIP: no subject of this executable can run here\n");
            std::fflush(stdout);
            std::exit(77);
        }
    }
};

} // namespace

void record_skip(const std::string& subject, int case_number, const std::string& reason) {
    {
        Table& t = table();
        std::lock_guard lock(t.mutex);
        t.skips[{subject, case_number}] = reason;
    }
    WARN("SKIP " << subject << " case " << case_number << ": " << reason);
}

std::string section_name(const std::string& subject, int case_number, const char* title) {
    return subject + separator + std::to_string(case_number) + ": " + title;
}

} // namespace wm::conformance

using ConformanceReportListener = wm::conformance::ReportListener;
CATCH_REGISTER_LISTENER(ConformanceReportListener)
