/* SPDX-License-Identifier: MIT */
/* Dead, forged and bogus buffers at the importer entry points (issue 44 items 1 and 11):
 * wm_importer_read_back and wm_importer_release of anything but a live import of that importer
 * are WM_ERROR_INVALID_ARGUMENT and read nothing (a forged or released-and-unmapped CPU import
 * segfaulted); an engine importer's result that is not the range asked for (NULL host, size 0,
 * half the size, a moved range) is refused by wm_importer_import as wm_execute refuses it, and
 * released again. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "c_check.h"    /* first: it asks for POSIX */

#include <sys/mman.h>

#include "attack_engine.h"

/* Two anonymous pages of pattern bytes. */
static char* two_pages(void) {
    const size_t n = 2 * (size_t)c_page_size();
    char* p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    for (size_t i = 0; i < n; ++i) p[i] = (char)c_pattern_byte(0x61, i);
    return p;
}

/* read_back of a forged buffer, and of a live import once released and unmapped, are refused
 * naming the buffer; the live import reads back before that. */
static void check_dead_and_forged_buffers(wm_importer* importer) {
    char* pages = two_pages();
    REQUIRE(pages != NULL);
    const uint64_t size = 2 * c_page_size();
    char got[64];
    wm_imported_buffer forged = {(void*)0x1000, 4096, (void*)0x1000, 0, 0, true};
    CHECK_STATUS(wm_importer_read_back(importer, &forged, 0, sizeof got, got),
                 WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), "not a live import");
    CHECK_STATUS(wm_importer_release(importer, &forged), WM_ERROR_INVALID_ARGUMENT);

    wm_imported_buffer live;
    REQUIRE_OK(wm_importer_import(importer, pages, size, &live));
    CHECK_OK(wm_importer_read_back(importer, &live, 100, sizeof got, got));
    CHECK_PATTERN(got, sizeof got, 0x61, 100);
    CHECK_OK(wm_importer_release(importer, &live));
    REQUIRE(munmap(pages, (size_t)size) == 0);
    CHECK_STATUS(wm_importer_read_back(importer, &live, 100, sizeof got, got),
                 WM_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(wm_last_error(), "not a live import");
    CHECK_STATUS(wm_importer_release(importer, &live), WM_ERROR_INVALID_ARGUMENT); /* twice */
}

/* issue 44 item 1: the CPU importer's read_back copied from the forged address. */
static void case_cpu_read_back_refuses_dead_and_forged_buffers(void) {
    wm_importer* cpu = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&cpu));
    check_dead_and_forged_buffers(cpu);
    wm_importer_destroy(cpu);
}

/* issue 44 item 1: an engine importer without read_back gets the library's default. */
static void case_default_read_back_of_a_custom_importer_refuses_them(void) {
    engine_importer engine = {0};
    wm_importer* importer = NULL;
    REQUIRE(engine_create(&engine, &importer));
    check_dead_and_forged_buffers(importer);
    CHECK_EQ(engine.releases, 1); /* the refused releases never reached the engine */
    wm_importer_destroy(importer);
}

/* Another importer's live import is not this one's. */
static void case_another_importers_import_is_refused(void) {
    wm_importer *a = NULL, *b = NULL;
    REQUIRE_OK(wm_importer_create_cpu(&a));
    REQUIRE_OK(wm_importer_create_cpu(&b));
    char* pages = two_pages();
    REQUIRE(pages != NULL);
    wm_imported_buffer live;
    REQUIRE_OK(wm_importer_import(a, pages, c_page_size(), &live));
    char got[8];
    CHECK_STATUS(wm_importer_read_back(b, &live, 0, sizeof got, got), WM_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(wm_importer_release(b, &live), WM_ERROR_INVALID_ARGUMENT);
    CHECK_OK(wm_importer_release(a, &live));
    munmap(pages, 2 * (size_t)c_page_size());
    wm_importer_destroy(b);
    wm_importer_destroy(a);
}

static const char* result_name(engine_result r) {
    static const char* names[] = {"honest", "NULL host", "size 0", "half the size", "moved"};
    return names[r];
}

/* issue 44 item 11: wm_importer_import handed each bogus result back as WM_OK. */
static void case_wm_importer_import_refuses_a_bogus_result(void) {
    char* pages = two_pages();
    REQUIRE(pages != NULL);
    for (engine_result r = ENGINE_NULL_HOST; r <= ENGINE_MOVED; ++r) {
        engine_importer engine = {.result = r};
        wm_importer* importer = NULL;
        REQUIRE(engine_create(&engine, &importer));
        wm_imported_buffer out;
        memset(&out, 0, sizeof out);
        const wm_status got = wm_importer_import(importer, pages, 2 * c_page_size(), &out);
        CHECK_MSG(got == WM_ERROR_IMPORT_FAILED, "%s: %s (%s)", result_name(r),
                  wm_status_name(got), wm_last_error());
        if (got != WM_OK) CHECK_CONTAINS(wm_last_error(), "returned");
        CHECK_MSG(engine.releases == 1, "%s: the refused import was released %d times",
                  result_name(r), engine.releases);
        if (got == WM_OK) wm_importer_release(importer, &out);
        wm_importer_destroy(importer);
    }
    munmap(pages, 2 * (size_t)c_page_size());
}

/* The same bogus result through wm_execute: the run falls back, the import released. */
static void case_wm_execute_falls_back_on_a_bogus_result(void) {
    char path[512];
    REQUIRE(c_temp_file(ATTACK_MiB, 0x62, path));
    const char* paths[1] = {path};
    wm_mapped_model* mapped = NULL;
    REQUIRE_OK(wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &mapped));
    engine_importer engine = {.result = ENGINE_HALF_SIZE};
    wm_importer* importer = NULL;
    wm_model* model = NULL;
    wm_plan* plan = NULL;
    wm_placement* placement = NULL;
    REQUIRE(engine_create(&engine, &importer));
    REQUIRE(engine_model(path, ATTACK_MiB, 0, ATTACK_MiB, importer, &model));
    REQUIRE_OK(wm_plan_create(model, NULL, &plan));
    CHECK_OK(wm_execute(model, plan, wm_mapped_model_files(mapped), 1, &importer, 1, NULL, &placement));
    wm_tensor_location where = {.struct_size = sizeof where};
    if (placement != NULL && wm_placement_locate(placement, 0, &where) == WM_OK) {
        CHECK(!where.imported);
        CHECK_CONTAINS(where.reason, "returned");
    }
    CHECK_EQ(engine.imports, 1);
    CHECK_EQ(engine.releases, 1);
    wm_placement_destroy(placement);
    wm_plan_destroy(plan);
    wm_model_destroy(model);
    wm_importer_destroy(importer);
    wm_mapped_model_destroy(mapped);
}

int main(void) {
    C_RUN(case_cpu_read_back_refuses_dead_and_forged_buffers);
    C_RUN(case_default_read_back_of_a_custom_importer_refuses_them);
    C_RUN(case_another_importers_import_is_refused);
    C_RUN(case_wm_importer_import_refuses_a_bogus_result);
    C_RUN(case_wm_execute_falls_back_on_a_bogus_result);
    return c_check_finish();
}
