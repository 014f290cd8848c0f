// SPDX-License-Identifier: MIT
// Undo: runs a release on scope exit unless dismissed. Every acquire-then-record path uses it
// (acquire, arm, record, dismiss), so that a record that throws (bad_alloc growing a map or a
// vector) releases what was just acquired instead of leaking a lock, registration or mapping.
#pragma once

#include <utility>

namespace wm::internal {

template <class F>
class Undo {
public:
    explicit Undo(F f) : f_(std::move(f)) {}
    ~Undo() {
        if (armed_) f_();
    }
    Undo(const Undo&) = delete;
    Undo& operator=(const Undo&) = delete;
    void dismiss() noexcept { armed_ = false; }

private:
    F f_;
    bool armed_ = true;
};

} // namespace wm::internal
