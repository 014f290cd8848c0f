// SPDX-License-Identifier: MIT
// Collects the process-wide log's warnings for one test; restores the default sink however the
// test ends.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "weightmap/log.hpp"

namespace wm::test {

struct CaptureLog {
    std::mutex mutex;
    std::vector<std::string> warnings;
    CaptureLog() {
        set_log_callback([this](LogLevel level, std::string_view message) {
            std::lock_guard<std::mutex> guard(mutex);
            if (level == LogLevel::warning) warnings.emplace_back(message);
        });
    }
    ~CaptureLog() { set_log_callback({}); }
    CaptureLog(const CaptureLog&) = delete;
    CaptureLog& operator=(const CaptureLog&) = delete;
};

} // namespace wm::test
