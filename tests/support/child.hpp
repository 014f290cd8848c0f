// SPDX-License-Identifier: MIT
// Running a piece of a test in a forked child: for death tests, and for cases that need another
// identity (CI runs as root, and root passes access(W_OK) and open(O_RDWR) on a 0444 file) or
// another mount namespace (a read-only bind mount).
#pragma once

#include <functional>
#include <string>

namespace wm::test {

/// Result of a child: exited with code, or killed by signal.
struct ChildResult {
    bool exited = false;
    int code = -1;
    int signal = 0;
};

/// Forks; the child runs `body` and _exit()s with its return value (no Catch2 in the child:
/// report through the exit code). Waits for it.
ChildResult run_in_child(const std::function<int()>& body);

/// In the child: becomes uid/gid 65534 (nobody). False if that fails.
bool drop_privileges_to_nobody();

/// In the child: enters a private mount namespace and bind-mounts `dir` read-only over itself.
/// False (with errno set) where unshare(CLONE_NEWNS) is not permitted.
bool remount_read_only_in_private_namespace(const std::string& dir);

} // namespace wm::test
