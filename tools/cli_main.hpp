// SPDX-License-Identifier: MIT
// What every tool's main() does the same way: one line on stderr for an error, llama.cpp's `-ot`
// spelling, CLI11's help and parse errors, an allocation failure reported instead of thrown, and
// JSON written whatever bytes the model's names hold.
#pragma once

#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan_cli.hpp"

namespace wm::tools {

/// "TOOL: MESSAGE" on stderr as one line, whatever the message holds; returns exit status 1.
inline int fail_line(const char* tool, const std::string& message) {
    std::string line = message;
    for (char& c : line)
        if (c == '\n' || c == '\r') c = ' ';
    fmt::print(stderr, "{}: {}\n", tool, line);
    return 1;
}

/// Parses argv into `app` (-ot accepted for --override), then returns run()'s exit status; a
/// parse error or an exception (allocation failure: nothing else throws) is one line, status 1.
template <class Run>
int run_cli(CLI::App& app, int argc, char** argv, const char* tool, Run&& run) {
    try {
        parse_with_llama_spelling(app, argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return fail_line(tool, fmt::format("{} (see --help)", e.what()));
    }
    try {
        return run();
    } catch (const std::exception& e) {
        return fail_line(tool, e.what());
    }
}

/// Writes `out` indented, bytes that are not UTF-8 (tensor names are the file's bytes) replaced.
inline void print_json(const nlohmann::ordered_json& out) {
    std::cout << out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
}

/// 0 once stdout took everything, else the failure's line.
inline int flush_stdout(const char* tool) {
    std::cout.flush();
    return std::cout ? 0 : fail_line(tool, "writing the output failed");
}

} // namespace wm::tools
