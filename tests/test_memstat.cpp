// SPDX-License-Identifier: MIT
// memstat: real /proc parsing, fixtures with missing fields ("unknown", never 0), DRM fdinfo
// sums in both the current and the older amdgpu spelling, and the sampler's peak.
#include <catch2/catch.hpp>

#include <cstring>
#include <sys/mman.h>
#include <thread>

#include "weightmap/memstat.hpp"

using namespace wm;

TEST_CASE("reads the real /proc/self/status", "[memstat]") {
    MemStat s = read_memstat();
    REQUIRE(s.rss_anon);
    REQUIRE(s.rss_file);
    CHECK(*s.rss_anon > 0);
    CHECK(*s.rss_file > 0);
    CHECK(s.vm_lck.has_value());
}

TEST_CASE("fixture with every field", "[memstat]") {
    const char* text = "Name:\tllama-cli\nVmLck:\t      12 kB\nVmPin:\t       0 kB\n"
                       "RssAnon:\t  186000 kB\nRssFile:\t15849000 kB\nRssShmem:\t     4 kB\n";
    MemStat s = parse_proc_status(text);
    CHECK(s.rss_anon == 186000ull * 1024);
    CHECK(s.rss_file == 15849000ull * 1024);
    CHECK(s.rss_shmem == 4096u);
    CHECK(s.vm_lck == 12288u);
    CHECK(s.vm_pin == 0u); // known zero is not unknown
}

TEST_CASE("fixture from an old kernel: missing fields are unknown, not 0", "[memstat]") {
    // Before Linux 4.5 there was no RssAnon/RssFile/RssShmem; VmPin came in 3.2.
    const char* text = "Name:\told\nVmLck:\t0 kB\nVmRSS:\t1000 kB\n";
    MemStat s = parse_proc_status(text);
    CHECK_FALSE(s.rss_anon.has_value());
    CHECK_FALSE(s.rss_file.has_value());
    CHECK_FALSE(s.vm_pin.has_value());
    CHECK(s.vm_lck == 0u);
    CHECK_FALSE(delta(s.rss_anon, std::optional<std::uint64_t>(5)).has_value());
    CHECK_FALSE(parse_proc_status("RssAnon:\tgarbage kB\n").rss_anon.has_value());
}

TEST_CASE("DRM fdinfo: drm-total/resident summed per region; drm-memory- is the old total",
          "[memstat]") {
    std::map<std::string, DrmMemory> drm;
    const char* current = "pos:\t0\ndrm-driver:\tamdgpu\ndrm-client-id:\t42\n"
                          "drm-total-gtt:\t1509 MiB\ndrm-resident-gtt:\t1400 MiB\n"
                          "drm-total-vram:\t512 KiB\ndrm-engine-gfx:\t123 ns\n";
    auto client = parse_drm_fdinfo(current, drm);
    CHECK(client == 42u);
    CHECK(drm["gtt"].total == 1509ull << 20);
    CHECK(drm["gtt"].resident == 1400ull << 20);
    CHECK(drm["vram"].total == 512u * 1024);
    CHECK_FALSE(drm["vram"].resident.has_value());

    const char* old = "drm-driver:\tamdgpu\ndrm-client-id:\t7\ndrm-memory-gtt:\t100 KiB\n";
    CHECK(parse_drm_fdinfo(old, drm) == 7u);
    CHECK(drm["gtt"].total == (1509ull << 20) + 100 * 1024);

    std::map<std::string, DrmMemory> none;
    CHECK_FALSE(parse_drm_fdinfo("pos:\t0\nflags:\t02\nmnt_id:\t24\n", none).has_value());
    CHECK(none.empty());
}

TEST_CASE("DRM fdinfo: a kernel printing drm-memory- and drm-total- counts the region once",
          "[memstat]") {
    // amdgpu kernels between the two formats print both lines for the same GTT bytes; peak GTT
    // is the figure users compare, so it must not double.
    std::map<std::string, DrmMemory> drm;
    const char* both = "drm-driver:\tamdgpu\ndrm-client-id:\t3\n"
                       "drm-memory-gtt:\t2376 MiB\ndrm-total-gtt:\t2376 MiB\n"
                       "drm-memory-vram:\t64 MiB\ndrm-memory-cpu:\t8 KiB\ndrm-total-cpu:\t8 KiB\n";
    CHECK(parse_drm_fdinfo(both, drm) == 3u);
    CHECK(drm["gtt"].total == 2376ull << 20);
    CHECK(drm["cpu"].total == 8u * 1024);
    // A region with only the old line still counts, once.
    CHECK(drm["vram"].total == 64ull << 20);
    // The order of the lines does not matter.
    std::map<std::string, DrmMemory> reversed;
    parse_drm_fdinfo("drm-driver:\tamdgpu\ndrm-total-gtt:\t10 KiB\ndrm-memory-gtt:\t10 KiB\n",
                     reversed);
    CHECK(reversed["gtt"].total == 10u * 1024);
}

TEST_CASE("peak_of keeps the max of known values", "[memstat]") {
    MemStat a, b;
    a.rss_anon = 10;
    b.rss_anon = 30;
    b.rss_file = 5;
    a.drm["gtt"].total = 100;
    b.drm["gtt"].total = 50;
    MemStat p = peak_of(a, b);
    CHECK(p.rss_anon == 30u);
    CHECK(p.rss_file == 5u);
    CHECK_FALSE(p.vm_pin.has_value());
    CHECK(p.drm["gtt"].total == 100u);
    CHECK(delta(a.rss_anon, b.rss_anon) == 20);
    CHECK(delta(b.rss_anon, a.rss_anon) == -20);
}

TEST_CASE("the sampler sees a transient allocation freed before stop()", "[memstat]") {
    constexpr std::size_t size = 96u << 20;
    MemSampler sampler(std::chrono::milliseconds(2));
    sampler.start();
    MemStat first = sampler.first();
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    std::memset(p, 1, size);
    // Wait until at least two samples ran while the memory was resident.
    std::uint64_t until = sampler.samples() + 3;
    while (sampler.samples() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    munmap(p, size);
    MemStat peak = sampler.stop();
    REQUIRE(first.rss_anon);
    CHECK(*peak.rss_anon >= *first.rss_anon + size - (4u << 20));
    CHECK(*read_memstat().rss_anon < *peak.rss_anon);
}
