// SPDX-License-Identifier: MIT
// The importer conformance cases, written once and run over every subject of the executable
// (subject.hpp). Each case compares against values it computes itself (the position-hashed
// byte pattern of the test file, the subject's own driver counters before and after), so each
// can fail; a subject that cannot run here reports SKIP (WARN + the report's SKIP line).
//
//   1. alignment refusal with no driver call      5. concurrent import/release
//   2. bytes read back at non-periodic offsets    6. allocate_copy/free_copy pairing
//   3. release exactly once                        7. name, caps and availability
//   4. a foreign buffer refused                    8. a refused run falls back alone
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "conformance/subject.hpp"
#include "support/temp_file.hpp"
#include "weightmap/executor.hpp"
#include "weightmap/log.hpp"
#include "weightmap/planner.hpp"

using namespace wm;
using namespace wm::conformance;
using wm::test::TempFile;

namespace {

constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB;
const std::uint64_t page = host_page_size();

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint64_t round_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }

// --- the model file and its mapping -------------------------------------------------------------

/// A MAP_SHARED mapping of a pattern TempFile, PROT_READ or PROT_READ|PROT_WRITE (HSA locks
/// read-write). The mapping is page-rounded; bytes past the end of the file read as zero.
class ModelMapping {
public:
    ModelMapping(std::uint64_t file_size, bool writable) : file_(file_size) {
        int fd = open(file_.path().c_str(), writable ? O_RDWR : O_RDONLY);
        if (fd < 0) throw std::runtime_error("open " + file_.path());
        length_ = round_up(file_size, page);
        const int prot = PROT_READ | (writable ? PROT_WRITE : 0);
        void* p = mmap(nullptr, length_, prot, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) throw std::runtime_error("mmap " + file_.path());
        base_ = static_cast<std::byte*>(p);
    }
    ~ModelMapping() { munmap(base_, length_); }
    ModelMapping(const ModelMapping&) = delete;
    ModelMapping& operator=(const ModelMapping&) = delete;

    std::byte* base() const { return base_; }
    std::uint64_t length() const { return length_; }
    std::uint64_t file_size() const { return file_.size(); }
    const std::string& path() const { return file_.path(); }

    /// What byte `offset` of the mapping must hold: the file's pattern, zero past its end.
    std::uint8_t expected(std::uint64_t offset) const {
        return offset < file_.size() ? wm::test::pattern_byte(offset) : 0;
    }
    /// Index of the first byte of `bytes` (read from mapping offset `offset`) that differs from
    /// expected(), or -1.
    long mismatch(std::uint64_t offset, const std::uint8_t* bytes, std::uint64_t n) const {
        for (std::uint64_t i = 0; i < n; ++i)
            if (bytes[i] != expected(offset + i)) return static_cast<long>(i);
        return -1;
    }
    /// The mapping's own bytes are still the file's (read through the mapping).
    long mismatch_in_mapping() const {
        return mismatch(0, reinterpret_cast<const std::uint8_t*>(base_), length_);
    }
    /// /proc/self/maps still covers [base, base + length) with lines naming this file.
    bool still_mapped() const;

private:
    TempFile file_;
    std::byte* base_ = nullptr;
    std::uint64_t length_ = 0;
};

struct MapsLine {
    std::uintptr_t lo = 0, hi = 0;
    std::string path;
};

std::vector<MapsLine> read_maps() {
    std::vector<MapsLine> lines;
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        MapsLine m;
        char perms[8] = {};
        int path_at = 0;
        if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %7s %*s %*s %*s %n", &m.lo, &m.hi,
                        perms, &path_at) < 3)
            continue;
        if (path_at > 0 && static_cast<std::size_t>(path_at) <= line.size())
            m.path = line.substr(static_cast<std::size_t>(path_at));
        lines.push_back(m);
    }
    return lines;
}

bool ModelMapping::still_mapped() const {
    auto covered = reinterpret_cast<std::uintptr_t>(base_);
    const std::uintptr_t end = covered + length_;
    for (const MapsLine& m : read_maps()) {
        if (m.hi <= covered || m.lo > covered) continue;
        if (m.path != file_.path()) return false;
        covered = m.hi;
        if (covered >= end) return true;
    }
    return covered >= end;
}

/// True when no byte of [address, address + size) is mapped in this process.
bool unmapped(const void* address, std::uint64_t size) {
    const auto lo = reinterpret_cast<std::uintptr_t>(address);
    const std::uintptr_t hi = lo + size;
    for (const MapsLine& m : read_maps())
        if (m.lo < hi && m.hi > lo) return false;
    return true;
}

/// The model mapping is still there (nothing unmapped it) and still holds the file's bytes.
/// REQUIRE: with the mapping gone, reading it would crash the rest of the section.
void require_mapping_intact(const ModelMapping& model) {
    REQUIRE(model.still_mapped());
    const long bad = model.mismatch_in_mapping();
    INFO("first wrong byte of the mapping at " << bad);
    CHECK(bad == -1);
}

bool mentions_alignment(const std::string& message) {
    std::string lower(message);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower.find("align") != std::string::npos;
}

// --- observing an instance --------------------------------------------------------------------

/// Warnings and errors logged while it lives (the process-wide log callback).
class LogCapture {
public:
    LogCapture() {
        set_log_callback([this](LogLevel level, std::string_view message) {
            if (level < LogLevel::warning) return;
            std::lock_guard lock(mutex_);
            lines_.emplace_back(message);
        });
    }
    ~LogCapture() { set_log_callback({}); }
    LogCapture(const LogCapture&) = delete;
    LogCapture& operator=(const LogCapture&) = delete;
    std::vector<std::string> lines() {
        std::lock_guard lock(mutex_);
        return lines_;
    }

private:
    std::mutex mutex_;
    std::vector<std::string> lines_;
};

/// Destroys the instance and checks it had nothing left to free: the Vulkan and HSA importers
/// warn when destroyed with live buffers (each case has already compared its live counter with
/// `before_imports`, taken before its first import).
void finish(Instance& instance, const Observation& before_imports) {
    if (instance.observe && before_imports.live) {
        const Observation now = instance.observe();
        CHECK(*now.live == *before_imports.live);
    }
    {
        LogCapture log;
        instance.importer.reset();
        const std::vector<std::string> warnings = log.lines();
        INFO("warnings at destruction: " << (warnings.empty() ? "" : warnings.front()));
        CHECK(warnings.empty());
    }
    instance.keep_alive.reset();
}

Importer& usable(const Instance& instance) {
    REQUIRE(instance.importer != nullptr);
    const Availability a = instance.importer->available();
    INFO("available(): " << a.reason);
    REQUIRE(a.available);
    return *instance.importer;
}

/// The unit of every range the cases import: a multiple of the page and of caps().alignment.
std::uint64_t chunk_of(const ImporterCaps& caps) {
    return std::max<std::uint64_t>(page, std::max<std::uint64_t>(caps.alignment, 1));
}

std::string describe(const Status& s) { return s ? std::string("ok") : s.error().message; }

/// A driver that refuses file-backed imports (RADV, caps().refuses_file_pages) cannot run the
/// cases that import the model file: check that it does refuse one, with its note, and SKIP.
bool skipped_for_file_pages(const Subject& s, int case_number, Importer& importer,
                            const ModelMapping& model, std::uint64_t chunk) {
    const ImporterCaps caps = importer.caps();
    if (!caps.refuses_file_pages) return false;
    Result<ImportedBuffer> r = importer.import(model.base(), chunk);
    CHECK_FALSE(r.ok());
    if (r.ok()) CHECK(importer.release(r.value()).ok());
    record_skip(s.name, case_number,
                "the device refuses imports of file pages: " +
                    std::string(importer.notes().file_pages));
    return true;
}

/// Runs `body` once per subject, each in a section named for it; a subject that cannot run
/// here records a SKIP instead.
template <class Body>
void for_each_subject(int case_number, const char* title, Body body) {
    for (const Subject& subject : subjects()) {
        DYNAMIC_SECTION(section_name(subject.name, case_number, title)) {
            const std::string why = subject.skip_reason ? subject.skip_reason() : std::string();
            if (!why.empty())
                record_skip(subject.name, case_number, why);
            else
                body(subject);
        }
    }
}

} // namespace

// --- 1 ----------------------------------------------------------------------------------------
TEST_CASE("conformance 1: an unaligned import is refused with a reason and no driver call",
          "[conformance]") {
    for_each_subject(1, "alignment refusal with no driver call", [](const Subject& s) {
        Instance instance = s.make();
        Importer& importer = usable(instance);
        const ImporterCaps caps = importer.caps();
        const std::uint64_t align = caps.alignment, chunk = chunk_of(caps);
        ModelMapping model(8 * chunk + 123, caps.needs_writable_mapping);
        if (skipped_for_file_pages(s, 1, importer, model, chunk)) return;
        std::byte* base = model.base();
        const Observation before = instance.observe();

        if (align <= 1) {
            // Nothing can be misaligned to 1 byte: instead the declared alignment must be true
            // the other way, an odd pointer and size are taken as they are.
            INFO("alignment 1: an unaligned import must be accepted as given");
            Result<ImportedBuffer> odd = importer.import(base + 1, 3);
            REQUIRE(odd.ok());
            CHECK(odd.value().host_address == base + 1);
            CHECK(odd.value().size == 3);
            CHECK(importer.release(odd.value()).ok());
            finish(instance, before);
            return;
        }

        struct Attempt {
            std::uint64_t offset, size;
            const char* what;
        };
        const Attempt attempts[] = {
            {1, chunk, "pointer +1"},
            {align / 2, chunk, "pointer + alignment/2"},
            {chunk - 1, chunk, "pointer + chunk-1"},
            {0, align + 1, "size alignment+1"},
            {0, align - 1, "size alignment-1"},
            {chunk, chunk + align / 2, "size chunk + alignment/2"},
        };
        for (const Attempt& a : attempts) {
            INFO(a.what << ": import(base + " << a.offset << ", " << a.size << "), alignment "
                        << align);
            Result<ImportedBuffer> r = importer.import(base + a.offset, a.size);
            CHECK_FALSE(r.ok());
            if (r.ok()) {
                CHECK(importer.release(r.value()).ok());
                continue;
            }
            INFO("reason: " << r.error().message);
            CHECK_FALSE(r.error().message.empty());
            CHECK(mentions_alignment(r.error().message));
        }
        const Observation after = instance.observe();
        if (before.driver_calls) CHECK(*after.driver_calls == *before.driver_calls);
        if (before.live) CHECK(*after.live == *before.live);

        // The counters can move: the same range aligned is taken, through the driver.
        Result<ImportedBuffer> aligned = importer.import(base + chunk, chunk);
        INFO("aligned import: " << (aligned.ok() ? "ok" : aligned.error().message));
        REQUIRE(aligned.ok());
        const Observation imported = instance.observe();
        if (before.driver_calls) CHECK(*imported.driver_calls > *after.driver_calls);
        if (before.live) CHECK(*imported.live > *after.live);
        CHECK(importer.release(aligned.value()).ok());
        if (before.live) CHECK(*instance.observe().live == *before.live);
        if (!before.driver_calls)
            WARN(s.name << " has no driver-call counter: case 1 checks refusal and reason only");
        finish(instance, before);
    });
}

// --- 2 ----------------------------------------------------------------------------------------
TEST_CASE("conformance 2: read_back returns the file's bytes at non-periodic offsets",
          "[conformance]") {
    for_each_subject(2, "bytes read back at non-periodic offsets", [](const Subject& s) {
        Instance instance = s.make();
        Importer& importer = usable(instance);
        const ImporterCaps caps = importer.caps();
        const std::uint64_t chunk = chunk_of(caps);
        // Not a multiple of the page: the import's last page runs past the end of the file.
        ModelMapping model(2 * MiB + 3 * page + 123, caps.needs_writable_mapping);
        if (skipped_for_file_pages(s, 2, importer, model, chunk)) return;
        const Observation before = instance.observe();
        const std::uint64_t mapped = round_down(model.length(), chunk);

        // Two imports, one at the start of the file and one a chunk in, so a read_back that
        // ignored the buffer's start or the offset it is given reads the wrong bytes.
        for (const std::uint64_t start : {std::uint64_t{0}, chunk}) {
            const std::uint64_t size = mapped - start;
            Result<ImportedBuffer> imported = importer.import(model.base() + start, size);
            INFO("import at file offset " << start << " +" << size << ": "
                                          << (imported.ok() ? "ok" : imported.error().message));
            REQUIRE(imported.ok());
            const ImportedBuffer buffer = imported.value();
            CHECK(buffer.host_address == model.base() + start);
            CHECK(buffer.size == size);
            CHECK(buffer.imported);

            std::vector<std::uint64_t> offsets = {0,        1,         4095,      4096 + 7,
                                                  MiB + 13, size - 16, size - 1};
            const std::uint64_t last_file_byte = model.file_size() - 1;
            if (last_file_byte >= start && last_file_byte - start < size)
                offsets.push_back(last_file_byte - start);
            for (const std::uint64_t offset : offsets) {
                const std::uint64_t n = std::min<std::uint64_t>(16, size - offset);
                INFO("window [" << offset << ", +" << n << ") of the import = file offset "
                                << start + offset);
                std::vector<std::uint8_t> got(n);
                for (std::uint64_t i = 0; i < n; ++i)
                    got[i] = static_cast<std::uint8_t>(~model.expected(start + offset + i));
                Status read = importer.read_back(buffer, offset, n, got.data());
                if (s.has_read_back) {
                    INFO("read_back: " << describe(read));
                    REQUIRE(read.ok());
                    const long bad = model.mismatch(start + offset, got.data(), n);
                    INFO("first wrong byte at +" << bad);
                    CHECK(bad == -1);
                } else {
                    REQUIRE_FALSE(read.ok());
                    CHECK(read.error().kind == ErrorKind::unsupported);
                }
                if (s.device_address_is_host) {
                    REQUIRE(buffer.device_address != nullptr);
                    const long bad = model.mismatch(
                        start + offset,
                        static_cast<const std::uint8_t*>(buffer.device_address) + offset, n);
                    INFO("device_address: first wrong byte at +" << bad);
                    CHECK(bad == -1);
                }
            }
            if (s.has_read_back) {
                // The window that runs one byte past the buffer is refused, not clipped.
                std::uint8_t two[2] = {};
                Status past = importer.read_back(buffer, size - 1, 2, two);
                INFO("read_back past the end: " << describe(past));
                CHECK_FALSE(past.ok());
            }
            CHECK(importer.release(buffer).ok());
        }
        if (before.live) CHECK(*instance.observe().live == *before.live);
        finish(instance, before);
    });
}

// --- 3 ----------------------------------------------------------------------------------------
TEST_CASE("conformance 3: each import is released exactly once; a second release is refused",
          "[conformance]") {
    for_each_subject(3, "release exactly once", [](const Subject& s) {
        Instance instance = s.make();
        Importer& importer = usable(instance);
        const ImporterCaps caps = importer.caps();
        const std::uint64_t chunk = chunk_of(caps);
        ModelMapping model(8 * chunk, caps.needs_writable_mapping);
        if (skipped_for_file_pages(s, 3, importer, model, chunk)) return;
        const Observation before = instance.observe();

        std::vector<ImportedBuffer> buffers;
        for (int i = 0; i < 3; ++i) {
            Result<ImportedBuffer> r = importer.import(model.base() + 2 * i * chunk, chunk);
            INFO("import " << i << ": " << (r.ok() ? "ok" : r.error().message));
            REQUIRE(r.ok());
            buffers.push_back(r.value());
        }
        const Observation held = instance.observe();
        if (before.live) CHECK(*held.live >= *before.live + 3);

        for (const ImportedBuffer& b : buffers) {
            Status released = importer.release(b);
            INFO("release: " << describe(released));
            CHECK(released.ok());
        }
        const Observation released = instance.observe();
        if (before.live) CHECK(*released.live == *before.live);
        if (before.driver_calls) CHECK(*released.driver_calls > *held.driver_calls);

        for (std::size_t i = 0; i < buffers.size(); ++i) {
            INFO("second release of import " << i);
            Status again = importer.release(buffers[i]);
            CHECK_FALSE(again.ok());
            if (!again.ok()) CHECK_FALSE(again.error().message.empty());
        }
        const Observation after = instance.observe();
        if (before.driver_calls) CHECK(*after.driver_calls == *released.driver_calls);
        if (before.live) CHECK(*after.live == *released.live);
        require_mapping_intact(model);
        finish(instance, before);
    });
}

// --- 4 ----------------------------------------------------------------------------------------
TEST_CASE("conformance 4: a buffer this importer did not make is refused and left alone",
          "[conformance]") {
    for_each_subject(4, "a foreign buffer refused", [](const Subject& s) {
        Instance mine = s.make();
        Instance other = s.make();
        Importer& importer = usable(mine);
        Importer& foreign_importer = usable(other);
        const ImporterCaps caps = importer.caps();
        const std::uint64_t chunk =
            std::max(chunk_of(caps), chunk_of(foreign_importer.caps()));
        ModelMapping model(16 * chunk + 77, caps.needs_writable_mapping ||
                                                foreign_importer.caps().needs_writable_mapping);
        if (skipped_for_file_pages(s, 4, importer, model, chunk)) return;
        const Observation before = mine.observe();

        Result<ImportedBuffer> own = importer.import(model.base() + 2 * chunk, chunk);
        REQUIRE(own.ok());
        Result<ImportedBuffer> theirs =
            foreign_importer.import(model.base() + 6 * chunk, 2 * chunk);
        REQUIRE(theirs.ok());
        ImportedBuffer forged; // never imported by anyone, points into the model mapping
        forged.host_address = model.base() + 10 * chunk;
        forged.size = chunk;
        forged.device_address = forged.host_address;
        forged.imported = true;

        // A device copy made by the other instance, where there are copies.
        std::optional<ImportedBuffer> their_copy;
        if (s.has_copies) {
            Result<ImportedBuffer> c = foreign_importer.allocate_copy(model.base() + 5, 1000);
            INFO("other instance's allocate_copy: " << (c.ok() ? "ok" : c.error().message));
            REQUIRE(c.ok());
            their_copy = c.value();
        }
        const Observation held = mine.observe();

        struct Foreign {
            const char* what;
            ImportedBuffer buffer;
        };
        std::vector<Foreign> foreign = {{"another instance's import", theirs.value()},
                                        {"a hand-made buffer into the mapping", forged}};
        if (their_copy) foreign.push_back({"another instance's copy", *their_copy});
        for (const Foreign& f : foreign) {
            INFO("release(" << f.what << ")");
            Status r = importer.release(f.buffer);
            CHECK_FALSE(r.ok());
            if (!r.ok()) CHECK_FALSE(r.error().message.empty());
        }
        // free_copy of anything but this importer's own copy: refused where there are copies,
        // `unsupported` where there are none; either way nothing is unmapped or freed.
        foreign.push_back({"an own import", own.value()});
        for (const Foreign& f : foreign) {
            INFO("free_copy(" << f.what << ")");
            Status r = importer.free_copy(f.buffer);
            CHECK_FALSE(r.ok());
            if (!r.ok() && !s.has_copies) CHECK(r.error().kind == ErrorKind::unsupported);
        }
        const Observation after = mine.observe();
        if (before.driver_calls) CHECK(*after.driver_calls == *held.driver_calls);
        if (before.live) CHECK(*after.live == *held.live);
        require_mapping_intact(model);

        // Nothing was released for real: both imports (and the copy) are still their owners'.
        if (s.has_read_back) {
            std::uint8_t got[16] = {};
            Status r = importer.read_back(own.value(), 7, sizeof got, got);
            INFO("read_back of the own import after the refusals: " << describe(r));
            REQUIRE(r.ok());
            CHECK(model.mismatch(2 * chunk + 7, got, sizeof got) == -1);
        }
        // Last, as it may take the own import with it: this importer's own buffer with another
        // size (its handles intact) is not what import() returned either.
        ImportedBuffer resized = own.value();
        resized.size = 3 * chunk;
        const Observation before_resized = mine.observe();
        Status r = importer.release(resized);
        INFO("release(an own import with the wrong size): " << describe(r));
        CHECK_FALSE(r.ok());
        if (before.live) CHECK(*mine.observe().live == *before_resized.live);
        if (r.ok()) {
            // It released the own import: a second release must now be refused.
            CHECK_FALSE(importer.release(own.value()).ok());
        } else {
            CHECK(importer.release(own.value()).ok());
        }
        CHECK(foreign_importer.release(theirs.value()).ok());
        if (their_copy) CHECK(foreign_importer.free_copy(*their_copy).ok());
        if (before.live) CHECK(*mine.observe().live == *before.live);
        finish(other, before);
        finish(mine, before);
    });
}

// --- 5 ----------------------------------------------------------------------------------------
TEST_CASE("conformance 5: concurrent imports and releases of disjoint ranges", "[conformance]") {
    for_each_subject(5, "concurrent import/release", [](const Subject& s) {
        Instance instance = s.make();
        Importer& importer = usable(instance);
        const ImporterCaps caps = importer.caps();
        const std::uint64_t chunk = chunk_of(caps);
        constexpr int threads = 4, per_thread = 16, rounds = 2;
        ModelMapping model(threads * per_thread * chunk + 5, caps.needs_writable_mapping);
        if (skipped_for_file_pages(s, 5, importer, model, chunk)) return;
        const Observation before = instance.observe();

        std::atomic<int> imported{0}, released{0}, wrong{0}, read_wrong{0};
        std::mutex first_error_mutex;
        std::string first_error;
        auto note = [&](const std::string& e) {
            std::lock_guard lock(first_error_mutex);
            if (first_error.empty()) first_error = e;
        };
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] {
                for (int round = 0; round < rounds; ++round) {
                    std::vector<ImportedBuffer> held;
                    for (int i = 0; i < per_thread; ++i) {
                        const std::uint64_t offset =
                            static_cast<std::uint64_t>(t * per_thread + i) * chunk;
                        Result<ImportedBuffer> r = importer.import(model.base() + offset, chunk);
                        if (!r.ok()) {
                            note("import: " + r.error().message);
                            continue;
                        }
                        ++imported;
                        if (r.value().host_address != model.base() + offset ||
                            r.value().size != chunk)
                            ++wrong;
                        if (s.has_read_back) {
                            std::uint8_t got[8] = {};
                            Status rb = importer.read_back(r.value(), 5 + 8 * i, sizeof got, got);
                            if (!rb.ok()) note("read_back: " + rb.error().message);
                            if (!rb.ok() ||
                                model.mismatch(offset + 5 + 8 * i, got, sizeof got) != -1)
                                ++read_wrong;
                        }
                        held.push_back(r.value());
                    }
                    for (const ImportedBuffer& b : held) {
                        Status st = importer.release(b);
                        if (st.ok())
                            ++released;
                        else
                            note("release: " + st.error().message);
                    }
                }
            });
        }
        for (std::thread& th : pool) th.join();

        const int total = threads * per_thread * rounds;
        INFO("first error: " << first_error);
        CHECK(imported.load() == total);
        CHECK(released.load() == total);
        CHECK(wrong.load() == 0);
        CHECK(read_wrong.load() == 0);
        const Observation after = instance.observe();
        if (before.live) CHECK(*after.live == *before.live);
        if (before.made) {
            const std::int64_t made = *after.made - *before.made;
            const std::int64_t destroyed = *after.destroyed - *before.destroyed;
            INFO("driver objects made " << made << ", destroyed " << destroyed);
            CHECK(made >= total);
            CHECK(made == destroyed);
        }
        require_mapping_intact(model);
        finish(instance, before);
    });
}

// --- 6 ----------------------------------------------------------------------------------------
TEST_CASE("conformance 6: allocate_copy and free_copy pair up, or both are unsupported",
          "[conformance]") {
    for_each_subject(6, "allocate_copy/free_copy pairing", [](const Subject& s) {
        Instance instance = s.make();
        Importer& importer = usable(instance);
        const ImporterCaps caps = importer.caps();
        ModelMapping model(4 * chunk_of(caps) + 3 * page + 99, caps.needs_writable_mapping);
        const Observation before = instance.observe();
        // An unaligned source and size: a copy has no alignment precondition.
        const std::uint64_t source = 4096 + 7, size = 3 * page + 5;

        Result<ImportedBuffer> copied = importer.allocate_copy(model.base() + source, size);
        if (!s.has_copies) {
            INFO("allocate_copy: " << (copied.ok() ? "ok" : copied.error().message));
            CHECK_FALSE(copied.ok());
            if (copied.ok()) {
                CHECK(importer.free_copy(copied.value()).ok());
            } else {
                CHECK(copied.error().kind == ErrorKind::unsupported);
            }
            ImportedBuffer none;
            none.host_address = model.base();
            none.size = page;
            none.device_address = model.base();
            none.imported = false;
            Status freed = importer.free_copy(none);
            INFO("free_copy: " << describe(freed));
            REQUIRE_FALSE(freed.ok());
            CHECK(freed.error().kind == ErrorKind::unsupported);
            require_mapping_intact(model);
            finish(instance, before);
            return;
        }

        INFO("allocate_copy: " << (copied.ok() ? "ok" : copied.error().message));
        REQUIRE(copied.ok());
        const ImportedBuffer copy = copied.value();
        CHECK_FALSE(copy.imported);
        CHECK(copy.size == size);
        // A copy is not the source: its host address (if any) lies outside the model mapping.
        const auto lo = reinterpret_cast<std::uintptr_t>(model.base());
        const auto at = reinterpret_cast<std::uintptr_t>(copy.host_address);
        CHECK((copy.host_address == nullptr || at < lo || at >= lo + model.length()));
        const Observation held = instance.observe();
        if (before.live) CHECK(*held.live > *before.live);

        REQUIRE(s.has_read_back);
        for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4095},
                                           std::uint64_t{4096 + 7}, size - 9, size - 1}) {
            const std::uint64_t n = std::min<std::uint64_t>(16, size - offset);
            std::vector<std::uint8_t> got(n);
            for (std::uint64_t i = 0; i < n; ++i)
                got[i] = static_cast<std::uint8_t>(~model.expected(source + offset + i));
            Status r = importer.read_back(copy, offset, n, got.data());
            INFO("read_back of the copy at [" << offset << ", +" << n << "): " << describe(r));
            REQUIRE(r.ok());
            CHECK(model.mismatch(source + offset, got.data(), n) == -1);
        }

        Status freed = importer.free_copy(copy);
        INFO("free_copy: " << describe(freed));
        CHECK(freed.ok());
        const Observation after = instance.observe();
        if (before.live) CHECK(*after.live == *before.live);
        if (s.expect_cpu && copy.host_address != nullptr)
            CHECK(unmapped(copy.host_address, copy.size)); // the CPU copy is its own mapping
        Status twice = importer.free_copy(copy);
        INFO("second free_copy: " << describe(twice));
        CHECK_FALSE(twice.ok());
        if (before.driver_calls) CHECK(*instance.observe().driver_calls == *after.driver_calls);
        require_mapping_intact(model);
        finish(instance, before);
    });
}

// --- 7 ----------------------------------------------------------------------------------------
TEST_CASE("conformance 7: every importer reports its name, capabilities and availability",
          "[conformance]") {
    for_each_subject(7, "name, caps and availability", [](const Subject& s) {
        Instance instance = s.make();
        REQUIRE(instance.importer != nullptr);
        Importer& importer = *instance.importer;
        const std::string name(importer.name());
        CHECK_FALSE(name.empty());
        CHECK(name == s.importer_name);
        CHECK(std::string(importer.name()) == name); // stable across calls

        const Availability a = importer.available();
        INFO("available(): " << a.available << " '" << a.reason << "'");
        CHECK(a.available);
        CHECK(a.reason.empty());

        const ImporterCaps caps = importer.caps();
        INFO("alignment " << caps.alignment);
        CHECK(caps.alignment >= 1);
        CHECK((caps.alignment & (caps.alignment - 1)) == 0);
        INFO("tensor_alignment " << caps.tensor_alignment);
        CHECK((caps.tensor_alignment & (caps.tensor_alignment - 1)) == 0); // 0, 1 or 2^k
        CHECK(caps.is_cpu == s.expect_cpu);
        if (caps.is_cpu) CHECK_FALSE(caps.needs_writable_mapping); // importer.hpp: only non-CPU
        const ImporterNotes notes = importer.notes();
        if (!caps.refuses_file_pages) CHECK(notes.file_pages.empty());
        else CHECK_FALSE(notes.file_pages.empty());
        // How the device reaches imported memory decides whether the default policy imports at
        // all: every importer must report it, say what it read it from, and not change its mind.
        INFO("device_memory " << to_string(caps.device_memory) << " ("
                              << notes.device_memory << ")");
        CHECK(caps.device_memory == s.expect_memory);
        CHECK_FALSE(notes.device_memory.empty());
        if (caps.is_cpu) CHECK(caps.device_memory == DeviceMemory::unified);
        const ImporterCaps again = importer.caps();
        CHECK(again.alignment == caps.alignment);
        CHECK(again.is_cpu == caps.is_cpu);
        CHECK(again.needs_writable_mapping == caps.needs_writable_mapping);
        CHECK(again.device_memory == caps.device_memory);
        CHECK(importer.notes().device_memory == notes.device_memory);

        Instance second = s.make();
        REQUIRE(second.importer != nullptr);
        CHECK(std::string(second.importer->name()) == name); // stable across instances
        CHECK(second.importer->caps().alignment == caps.alignment);
        CHECK(second.importer->caps().device_memory == caps.device_memory);
        const Observation none;
        finish(second, none);
        finish(instance, none);
    });
}

// --- 8 ----------------------------------------------------------------------------------------
namespace {

/// Passes everything to the subject's importer but refuses its N-th import, as a driver out of
/// aperture would: what the executor does next is the subject's business too (it must release
/// exactly the imports that stay, and nothing of the refused one was ever made).
class RefuseNth final : public Importer {
public:
    RefuseNth(Importer& inner, int refuse_at) : inner_(inner), refuse_at_(refuse_at) {}
    std::string_view name() const noexcept override { return inner_.name(); }
    ImporterCaps caps() const noexcept override { return inner_.caps(); }
    ImporterNotes notes() const noexcept override { return inner_.notes(); }
    Availability available() const override { return inner_.available(); }
    Status release_checked(const ImportedBuffer& buffer) noexcept override {
        return inner_.release(buffer);
    }
    Status read_back_checked(const ImportedBuffer& buffer, std::uint64_t offset,
                             std::uint64_t size, void* dst) override {
        return inner_.read_back(buffer, offset, size, dst);
    }
    int calls = 0;

protected:
    Result<ImportedBuffer> import_checked(void* host_address, std::uint64_t size) override {
        if (++calls == refuse_at_)
            return make_error(ErrorKind::import_failed,
                              "conformance: refused import #" + std::to_string(calls));
        return inner_.import(host_address, size);
    }

private:
    Importer& inner_;
    const int refuse_at_;
};

} // namespace

TEST_CASE("conformance 8: a refused run falls back alone; the region's other runs stay imported",
          "[conformance]") {
    for_each_subject(8, "a refused run falls back alone", [](const Subject& s) {
        Instance instance = s.make();
        Importer& importer = usable(instance);
        const ImporterCaps caps = importer.caps();
        const std::uint64_t chunk = chunk_of(caps);
        constexpr std::uint32_t runs = 5;
        ModelMapping model(2 * runs * chunk + 123, caps.needs_writable_mapping);
        if (skipped_for_file_pages(s, 8, importer, model, chunk)) return;
        const Observation before = instance.observe();

        // One device region of five tensors a chunk apart; the what-if size limit of one chunk
        // makes each its own import (the planner merges nothing over it), on every subject, the
        // CPU's included (planned as a device here, so that it has runs to refuse).
        ModelDesc desc;
        desc.files = {{model.path(), model.file_size()}};
        TargetDesc target;
        target.name = "dev";
        target.importer_key = std::string(importer.name());
        target.caps = caps;
        target.caps.is_cpu = false;
        target.caps.max_import_size = chunk;
        target.import_policy = ImportPolicy::always;
        desc.targets = {target};
        for (std::uint32_t k = 0; k < runs; ++k)
            desc.tensors.push_back({"t" + std::to_string(k), 0, 2 * k * chunk, chunk - 1, 0});
        PlanOptions options;
        options.import_enabled = true;
        Result<Plan> plan = make_plan(desc, options);
        REQUIRE(plan.ok());
        REQUIRE(plan->regions.size() == 1);
        REQUIRE(plan->regions[0].runs.size() == runs);

        RefuseNth refusing(importer, 2);
        std::vector<std::string> warnings;
        ExecuteOptions execute;
        execute.log = [&](LogLevel level, std::string_view message) {
            if (level >= LogLevel::warning) warnings.emplace_back(message);
        };
        const MappedFile files[] = {{model.base(), model.length()}};
        Importer* const importers[] = {&refusing};
        {
            Result<Placement> placed = execute_plan(desc, std::move(plan).value(), files,
                                                    importers, execute);
            REQUIRE(placed.ok());
            CHECK(refusing.calls == static_cast<int>(runs));
            const PlanRegion& region = placed->plan().regions[0];
            INFO(region.reason);
            CHECK(region.decision == Decision::import);
            CHECK(region.runs.size() == runs - 1);
            CHECK(placed->import_count() == runs - 1);
            CHECK(warnings.size() == 1);
            for (std::uint32_t k = 0; k < runs; ++k) {
                INFO("tensor " << k);
                const TensorLocation where = placed->locate(k);
                if (k == 1) {
                    CHECK_FALSE(where.imported);
                    CHECK(std::string(where.reason).find("conformance: refused import #2") !=
                          std::string::npos);
                    continue;
                }
                REQUIRE(where.imported);
                CHECK(static_cast<std::byte*>(where.buffer->host_address) +
                          where.offset_in_buffer ==
                      model.base() + 2 * k * chunk);
                if (!s.has_read_back) continue;
                std::vector<std::uint8_t> bytes(chunk - 1);
                REQUIRE(refusing
                            .read_back(*where.buffer, where.offset_in_buffer, bytes.size(),
                                       bytes.data())
                            .ok());
                CHECK(model.mismatch(2 * k * chunk, bytes.data(), bytes.size()) == -1);
            }
            if (before.live) CHECK(*instance.observe().live > *before.live);
        }
        // The placement released the four that stayed; nothing of the refused one is left.
        require_mapping_intact(model);
        finish(instance, before);
    });
}
