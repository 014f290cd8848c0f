// SPDX-License-Identifier: MIT
// A C++ engine's importer table whose callbacks throw (issue 44 item 8). The C API's callbacks
// are C function pointers, but a C++ engine fills them with C++ functions, and nothing stops
// those from throwing. Every wrapper catches: the call that reached the callback fails with
// WM_ERROR_INTERNAL and a message naming the callback and what() (creation, caps, import,
// release, read_back), available says unavailable with that reason (not "out of memory"), a
// throwing destroy is logged. Before, a throwing caps or release went through a noexcept
// wrapper into std::terminate.
#include <catch2/catch.hpp>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "weightmap/weightmap.h"

namespace {

using Catch::Contains;

// Which callback throws; each counts its calls.
struct Engine {
    bool throw_caps_at_creation = false, throw_caps_later = false, throw_available = false,
         throw_import = false, throw_release = false, throw_read_back = false,
         throw_destroy = false;
    int caps_calls = 0, releases = 0;
};

void caps(void* user, wm_importer_caps* c) {
    auto* e = static_cast<Engine*>(user);
    if (e->caps_calls++ == 0 ? e->throw_caps_at_creation : e->throw_caps_later)
        throw std::runtime_error("caps boom");
    c->device_memory = WM_DEVICE_MEMORY_UNIFIED;
}
bool available(void* user, char*, size_t) {
    if (static_cast<Engine*>(user)->throw_available) throw std::runtime_error("available boom");
    return true;
}
wm_status import(void* user, void* host, uint64_t size, wm_imported_buffer* out, char*, size_t) {
    if (static_cast<Engine*>(user)->throw_import) throw std::runtime_error("import boom");
    *out = {host, size, host, 0, 0, true};
    return WM_OK;
}
wm_status release(void* user, const wm_imported_buffer*) {
    auto* e = static_cast<Engine*>(user);
    ++e->releases;
    if (e->throw_release) throw std::runtime_error("release boom");
    return WM_OK;
}
wm_status read_back(void* user, const wm_imported_buffer* b, uint64_t offset, uint64_t size,
                    void* dst, char*, size_t) {
    if (static_cast<Engine*>(user)->throw_read_back) throw std::runtime_error("read_back boom");
    std::memcpy(dst, static_cast<const char*>(b->device_address) + offset, size);
    return WM_OK;
}
void destroy(void* user) {
    if (static_cast<Engine*>(user)->throw_destroy) throw std::logic_error("destroy boom");
}

wm_status create(Engine& engine, wm_importer** out) {
    wm_importer_vtable vt{};
    vt.struct_size = sizeof vt;
    vt.name = "throwing-engine";
    vt.caps = caps;
    vt.available = available;
    vt.import = import;
    vt.release = release;
    vt.read_back = read_back;
    vt.destroy = destroy;
    return wm_importer_create_custom(&vt, &engine, out);
}

// Two pages of anonymous memory to import.
struct Pages {
    std::size_t size = 2 * 4096;
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ~Pages() { munmap(base, size); }
};

std::vector<std::string> logged;
void log_sink(void*, wm_log_level, const char* message) { logged.emplace_back(message); }

} // namespace

TEST_CASE("a caps callback that throws at creation fails the creation, naming it") {
    Engine engine;
    engine.throw_caps_at_creation = true;
    wm_importer* importer = nullptr;
    CHECK(create(engine, &importer) == WM_ERROR_INTERNAL);
    CHECK(importer == nullptr);
    CHECK_THAT(wm_last_error(), Contains("caps callback threw: caps boom"));
}

// issue 44 item 8
TEST_CASE("a caps callback that throws later fails get_caps, and the importer keeps working") {
    Engine engine;
    engine.throw_caps_later = true;
    wm_importer* importer = nullptr;
    REQUIRE(create(engine, &importer) == WM_OK);
    wm_importer_caps c{};
    c.struct_size = sizeof c;
    CHECK(wm_importer_get_caps(importer, &c) == WM_ERROR_INTERNAL);
    CHECK_THAT(wm_last_error(), Contains("caps callback threw: caps boom"));
    Pages pages;
    wm_imported_buffer out{};
    CHECK(wm_importer_import(importer, pages.base, pages.size, &out) == WM_OK); // creation's caps
    CHECK(wm_importer_release(importer, &out) == WM_OK);
    wm_importer_destroy(importer);
}

// issue 44 item 8
TEST_CASE("a release callback that throws fails the release, naming it") {
    Engine engine;
    engine.throw_release = true;
    wm_importer* importer = nullptr;
    REQUIRE(create(engine, &importer) == WM_OK);
    Pages pages;
    wm_imported_buffer out{};
    REQUIRE(wm_importer_import(importer, pages.base, pages.size, &out) == WM_OK);
    CHECK(wm_importer_release(importer, &out) == WM_ERROR_INTERNAL);
    CHECK_THAT(wm_last_error(), Contains("release callback threw: release boom"));
    CHECK(engine.releases == 1);
    CHECK(wm_importer_release(importer, &out) == WM_ERROR_INVALID_ARGUMENT); // no longer live
    wm_importer_destroy(importer);
}

// issue 44 item 8: available was reported as "out of memory"
TEST_CASE("an available callback that throws makes the importer unavailable, naming it") {
    Engine engine;
    engine.throw_available = true;
    wm_importer* importer = nullptr;
    REQUIRE(create(engine, &importer) == WM_OK);
    const char* reason = nullptr;
    CHECK_FALSE(wm_importer_available(importer, &reason));
    REQUIRE(reason != nullptr);
    CHECK_THAT(reason, Contains("available callback threw: available boom"));
    CHECK_THAT(reason, !Contains("out of memory"));
    wm_importer_destroy(importer);
}

TEST_CASE("import and read_back callbacks that throw fail their calls, naming them") {
    Engine engine;
    wm_importer* importer = nullptr;
    REQUIRE(create(engine, &importer) == WM_OK);
    Pages pages;
    wm_imported_buffer out{};
    engine.throw_import = true;
    CHECK(wm_importer_import(importer, pages.base, pages.size, &out) == WM_ERROR_INTERNAL);
    CHECK_THAT(wm_last_error(), Contains("import callback threw: import boom"));
    engine.throw_import = false;
    REQUIRE(wm_importer_import(importer, pages.base, pages.size, &out) == WM_OK);
    engine.throw_read_back = true;
    char got[8];
    CHECK(wm_importer_read_back(importer, &out, 0, sizeof got, got) == WM_ERROR_INTERNAL);
    CHECK_THAT(wm_last_error(), Contains("read_back callback threw: read_back boom"));
    CHECK(wm_importer_release(importer, &out) == WM_OK);
    wm_importer_destroy(importer);
}

TEST_CASE("a destroy callback that throws is logged, and destroy returns") {
    Engine engine;
    engine.throw_destroy = true;
    wm_importer* importer = nullptr;
    REQUIRE(create(engine, &importer) == WM_OK);
    logged.clear();
    wm_set_log_callback(log_sink, nullptr);
    wm_importer_destroy(importer);
    wm_set_log_callback(nullptr, nullptr);
    REQUIRE(logged.size() == 1);
    CHECK_THAT(logged[0], Contains("destroy callback threw: destroy boom"));
}
