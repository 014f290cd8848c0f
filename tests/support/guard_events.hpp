// SPDX-License-Identifier: MIT
// The file guard tests' descriptor holder and the events a callback received, with waits.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include <unistd.h>

#include "weightmap/file_guard.hpp"

namespace wm::test {

struct Fd {
    int fd = -1;
    explicit Fd(int f) : fd(f) {}
    ~Fd() {
        if (fd >= 0) close(fd);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
};

struct GuardEvents {
    using Kind = FileGuardEventKind;
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<FileGuardEvent> list;

    void push(const FileGuardEvent& e) {
        std::lock_guard lock(mutex);
        list.push_back(e);
        cv.notify_all();
    }
    /// Until more than `skip` events of `kind` arrived.
    bool wait_for(Kind kind, std::chrono::milliseconds timeout, std::size_t skip = 0) {
        std::unique_lock lock(mutex);
        return cv.wait_for(lock, timeout, [&] { return count_locked(kind) > skip; });
    }
    std::size_t count(Kind kind) {
        std::lock_guard lock(mutex);
        return count_locked(kind);
    }
    std::size_t count_locked(Kind kind) const {
        std::size_t n = 0;
        for (const auto& e : list) n += e.kind == kind;
        return n;
    }
    /// The first event of `kind`, or a default one.
    FileGuardEvent first(Kind kind) {
        std::lock_guard lock(mutex);
        for (const auto& e : list)
            if (e.kind == kind) return e;
        return {};
    }
};

} // namespace wm::test
