// SPDX-License-Identifier: MIT
// Runs a command and collects its exit status, stdout and stderr (for the CLI tools' tests).
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace wm::test {

struct ProcessResult {
    int status = -1;          ///< exit status; -1 when it did not exit normally
    std::string out, err;
    double seconds = 0;       ///< wall time from spawn to exit
};

/// Runs argv[0] (a path) with argv; stdout and stderr go through files in `scratch_dir`.
inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const std::string& scratch_dir) {
    const std::string out_path = scratch_dir + "/stdout", err_path = scratch_dir + "/stderr";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const auto start = std::chrono::steady_clock::now();
    pid_t pid = 0;
    int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("posix_spawn failed for " + argv[0]);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    ProcessResult r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
    auto slurp = [](const std::string& path) {
        std::ifstream f(path, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
    };
    r.out = slurp(out_path);
    r.err = slurp(err_path);
    return r;
}

/// The path in environment variable `name` (set by meson for the tool under test).
inline std::string tool_path(const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') throw std::runtime_error(std::string(name) + " is not set");
    return v;
}

} // namespace wm::test
