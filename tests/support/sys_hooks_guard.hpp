// SPDX-License-Identifier: MIT
// The syscall hooks (lib/internal/sys_hooks.hpp) installed for a scope: a REQUIRE that fails,
// or any other exit, restores libc's table, so no later test of the executable runs on hooks.
#pragma once

#include "internal/sys_hooks.hpp"

namespace wm::test {

class SysCallsGuard {
public:
    /// Installs `table`, which must outlive the guard.
    explicit SysCallsGuard(const internal::SysCalls& table) { internal::set_syscalls(&table); }
    ~SysCallsGuard() { internal::set_syscalls(nullptr); }
    SysCallsGuard(const SysCallsGuard&) = delete;
    SysCallsGuard& operator=(const SysCallsGuard&) = delete;
};

} // namespace wm::test
