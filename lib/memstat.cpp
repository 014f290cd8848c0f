// SPDX-License-Identifier: MIT
#include "weightmap/memstat.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace wm {
namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

// "1234 kB" / "1234 KiB" / "5 MiB" / "77" (bytes) -> bytes.
std::optional<std::uint64_t> parse_amount(std::string_view value) {
    value = trim(value);
    std::uint64_t number = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
    if (ec != std::errc() || ptr == value.data()) return std::nullopt;
    std::string_view unit = trim(std::string_view(ptr, value.data() + value.size() - ptr));
    std::uint64_t scale = 1;
    if (unit == "kB" || unit == "KiB" || unit == "kiB") scale = 1024;
    else if (unit == "MiB" || unit == "mB" || unit == "MB") scale = 1024 * 1024;
    else if (unit == "GiB") scale = 1024ull * 1024 * 1024;
    else if (!unit.empty()) return std::nullopt;
    if (number > UINT64_MAX / scale) return std::nullopt;
    return number * scale;
}

template <class F>
void for_each_line(std::string_view text, F&& f) {
    while (!text.empty()) {
        std::size_t nl = text.find('\n');
        std::string_view line = text.substr(0, nl);
        std::size_t colon = line.find(':');
        if (colon != std::string_view::npos) f(trim(line.substr(0, colon)), line.substr(colon + 1));
        if (nl == std::string_view::npos) break;
        text.remove_prefix(nl + 1);
    }
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

void take_max(std::optional<std::uint64_t>& into, const std::optional<std::uint64_t>& v) {
    if (v && (!into || *v > *into)) into = v;
}

void add_to(std::optional<std::uint64_t>& into, std::uint64_t v) { into = into.value_or(0) + v; }

} // namespace

MemStat parse_proc_status(std::string_view text) {
    MemStat stat;
    for_each_line(text, [&](std::string_view key, std::string_view value) {
        if (key == "RssFile") stat.rss_file = parse_amount(value);
        else if (key == "RssAnon") stat.rss_anon = parse_amount(value);
        else if (key == "RssShmem") stat.rss_shmem = parse_amount(value);
        else if (key == "VmLck") stat.vm_lck = parse_amount(value);
        else if (key == "VmPin") stat.vm_pin = parse_amount(value);
    });
    return stat;
}

std::optional<std::uint64_t> parse_drm_fdinfo(std::string_view text,
                                              std::map<std::string, DrmMemory>& into) {
    bool is_drm = false;
    std::optional<std::uint64_t> client;
    std::map<std::string, DrmMemory> found;
    // drm-memory-<region> is what amdgpu printed before drm-total-<region> existed; kernels in
    // between print both for the same bytes, so adding them would report GTT twice. It counts
    // only for a region that has no drm-total line.
    std::map<std::string, std::uint64_t> legacy;
    for_each_line(text, [&](std::string_view key, std::string_view value) {
        if (key == "drm-driver") is_drm = true;
        if (key == "drm-client-id") {
            std::uint64_t id = 0;
            std::string_view v = trim(value);
            if (std::from_chars(v.data(), v.data() + v.size(), id).ec == std::errc()) client = id;
        }
        for (std::string_view prefix : {"drm-total-", "drm-memory-", "drm-resident-"}) {
            if (!key.starts_with(prefix)) continue;
            auto amount = parse_amount(value);
            if (!amount) continue;
            const std::string region(key.substr(prefix.size()));
            if (prefix == "drm-memory-") legacy[region] += *amount;
            else if (prefix == "drm-resident-") add_to(found[region].resident, *amount);
            else add_to(found[region].total, *amount);
        }
    });
    if (!is_drm) return std::nullopt;
    for (const auto& [region, amount] : legacy) {
        DrmMemory& mem = found[region];
        if (!mem.total) mem.total = amount;
    }
    for (auto& [region, mem] : found) {
        DrmMemory& out = into[region];
        if (mem.total) add_to(out.total, *mem.total);
        if (mem.resident) add_to(out.resident, *mem.resident);
    }
    return client;
}

MemStat read_memstat() {
    MemStat stat = parse_proc_status(slurp("/proc/self/status"));
    // Closed however the loop ends: slurp and the maps below may throw bad_alloc.
    struct Close {
        void operator()(DIR* d) const noexcept { closedir(d); }
    };
    const std::unique_ptr<DIR, Close> dir(opendir("/proc/self/fdinfo"));
    if (dir == nullptr) return stat;
    std::set<std::uint64_t> clients;
    while (dirent* entry = readdir(dir.get())) {
        if (entry->d_name[0] == '.') continue;
        std::string text = slurp(std::string("/proc/self/fdinfo/") + entry->d_name);
        if (text.find("drm-driver") == std::string::npos) continue;
        std::map<std::string, DrmMemory> one;
        auto client = parse_drm_fdinfo(text, one);
        // Several fds (dup, or a render node opened twice by one client) report one client.
        if (client && !clients.insert(*client).second) continue;
        for (auto& [region, mem] : one) {
            DrmMemory& out = stat.drm[region];
            if (mem.total) add_to(out.total, *mem.total);
            if (mem.resident) add_to(out.resident, *mem.resident);
        }
    }
    return stat;
}

MemStat peak_of(const MemStat& a, const MemStat& b) {
    MemStat p = a;
    take_max(p.rss_file, b.rss_file);
    take_max(p.rss_anon, b.rss_anon);
    take_max(p.rss_shmem, b.rss_shmem);
    take_max(p.vm_lck, b.vm_lck);
    take_max(p.vm_pin, b.vm_pin);
    for (const auto& [region, mem] : b.drm) {
        take_max(p.drm[region].total, mem.total);
        take_max(p.drm[region].resident, mem.resident);
    }
    return p;
}

std::optional<std::int64_t> delta(const std::optional<std::uint64_t>& before,
                                  const std::optional<std::uint64_t>& after) {
    if (!before || !after) return std::nullopt;
    return static_cast<std::int64_t>(*after) - static_cast<std::int64_t>(*before);
}

struct MemSampler::Impl {
    std::chrono::milliseconds interval;
    std::mutex mutex;
    std::condition_variable wake;
    bool running = false;
    std::thread thread;
    MemStat first, peak;
    std::uint64_t samples = 0;

    void sample() {
        MemStat now = read_memstat();
        std::lock_guard lock(mutex);
        peak = peak_of(peak, now);
        ++samples;
    }
};

MemSampler::MemSampler(std::chrono::milliseconds interval) : impl_(std::make_unique<Impl>()) {
    impl_->interval = interval;
}

MemSampler::~MemSampler() {
    if (impl_->running) stop();
}

void MemSampler::start() {
    if (impl_->running) stop();
    MemStat now = read_memstat();
    {
        std::lock_guard lock(impl_->mutex);
        impl_->first = now;
        impl_->peak = now;
        impl_->samples = 1;
        impl_->running = true;
    }
    impl_->thread = std::thread([impl = impl_.get()] {
        std::unique_lock lock(impl->mutex);
        while (impl->running) {
            if (impl->wake.wait_for(lock, impl->interval, [impl] { return !impl->running; }))
                break;
            lock.unlock();
            impl->sample();
            lock.lock();
        }
    });
}

MemStat MemSampler::stop() {
    {
        std::lock_guard lock(impl_->mutex);
        if (!impl_->running) return impl_->peak;
        impl_->running = false;
    }
    impl_->wake.notify_all();
    if (impl_->thread.joinable()) impl_->thread.join();
    impl_->sample();
    std::lock_guard lock(impl_->mutex);
    return impl_->peak;
}

MemStat MemSampler::first() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->first;
}

std::uint64_t MemSampler::samples() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->samples;
}

} // namespace wm
