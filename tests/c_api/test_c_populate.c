/* SPDX-License-Identifier: MIT */
/* wm_populate_imports: the extents a plan imports are in the page cache afterwards (evicted
 * first, so residency cannot come from the file's creation), with the bytes of the plan's
 * extents reported; a file truncated after planning is an I/O error naming the file, not a
 * SIGBUS; wrong calls are invalid arguments. */
#define _DEFAULT_SOURCE /* mincore(2) */
#include "c_check.h" /* first: it asks for POSIX */

#include <fcntl.h>
#include <sys/mman.h>

#include "c_fake_importer.h"

#define MiB (UINT64_C(1024) * 1024)

enum { FILE_SIZE = 6 * 1024 * 1024 };

typedef struct fixture {
    char path[512];
    wm_mapped_model* mapped;
    c_fake fake;
    wm_importer* importer;
    wm_model* model;
    wm_plan* plan;
} fixture;

/* One file, two device tensors (1 MiB at 1 MiB + 100, 2 MiB at 3 MiB) on a unified importer. */
static bool fixture_open(fixture* fx) {
    memset(fx, 0, sizeof *fx);
    if (!c_temp_file(FILE_SIZE, 0x33, fx->path)) return false;
    const char* paths[1] = {fx->path};
    if (wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &fx->mapped) != WM_OK) return false;
    c_fake_init(&fx->fake);
    wm_importer_vtable vt = c_fake_vtable("fake-device");
    uint32_t target = 0;
    return wm_importer_create_custom(&vt, &fx->fake, &fx->importer) == WM_OK &&
           wm_model_create(&fx->model) == WM_OK &&
           wm_model_add_file(fx->model, fx->path, FILE_SIZE, NULL) == WM_OK &&
           wm_model_add_target(fx->model, "device", fx->importer, &target) == WM_OK &&
           wm_model_add_tensor(fx->model, "a", 0, MiB + 100, MiB, target, NULL) == WM_OK &&
           wm_model_add_tensor(fx->model, "b", 0, 3 * MiB, 2 * MiB, target, NULL) == WM_OK &&
           wm_plan_create(fx->model, NULL, &fx->plan) == WM_OK;
}

static void fixture_close(fixture* fx) {
    wm_plan_destroy(fx->plan);
    wm_model_destroy(fx->model);
    wm_importer_destroy(fx->importer);
    wm_mapped_model_destroy(fx->mapped);
}

/* Pages of [offset, offset + size) of the mapping that are in the page cache. */
static uint64_t resident_pages(const fixture* fx, uint64_t offset, uint64_t size) {
    const uint64_t page = c_page_size();
    const uint64_t first = c_align_down(offset, page), n = (c_align_up(offset + size, page) - first) / page;
    unsigned char vec[4096];
    if (n > sizeof vec) return 0;
    char* base = (char*)wm_mapped_model_files(fx->mapped)[0].base;
    if (mincore(base + first, (size_t)(n * page), vec) != 0) return 0;
    uint64_t resident = 0;
    for (uint64_t i = 0; i < n; ++i) resident += vec[i] & 1;
    return resident;
}

static void case_populates_exactly_the_planned_extents(void) {
    fixture fx;
    REQUIRE(fixture_open(&fx));
    wm_plan_totals totals = {.struct_size = sizeof totals};
    REQUIRE_OK(wm_plan_get_totals(fx.plan, &totals));
    REQUIRE(totals.pinned_bytes >= 3 * MiB);
    const int fd = open(fx.path, O_RDONLY);
    REQUIRE(fd >= 0);
    CHECK_EQ(fsync(fd), 0); /* dirty pages are not evicted */
    CHECK_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    const uint64_t before = resident_pages(&fx, MiB, 4 * MiB);
    if (before == 4 * MiB / c_page_size()) C_SKIP("the file system keeps the file cached (tmpfs?)");
    wm_populate_report report = {.struct_size = sizeof report};
    REQUIRE_OK(wm_populate_imports(fx.model, fx.plan, wm_mapped_model_files(fx.mapped), 1, &report));
    CHECK_EQ(report.bytes, totals.pinned_bytes);
    CHECK(report.method != NULL && report.method[0] != '\0');
    const uint64_t pages = (MiB + 100 + MiB - c_align_down(MiB + 100, c_page_size()) + c_page_size() - 1) /
                           c_page_size();
    CHECK_MSG(resident_pages(&fx, MiB + 100, MiB) == pages, "tensor a: %llu of %llu pages resident (%llu before)",
              (unsigned long long)resident_pages(&fx, MiB + 100, MiB), (unsigned long long)pages,
              (unsigned long long)before);
    CHECK_EQ(resident_pages(&fx, 3 * MiB, 2 * MiB), 2 * MiB / c_page_size());
    fixture_close(&fx);
}

static void case_file_truncated_after_planning_is_an_io_error(void) {
    fixture fx;
    REQUIRE(fixture_open(&fx));
    REQUIRE(truncate(fx.path, 2 * MiB) == 0); /* tensor b's extent now lies past the end */
    wm_populate_report report = {.struct_size = sizeof report};
    CHECK_STATUS(wm_populate_imports(fx.model, fx.plan, wm_mapped_model_files(fx.mapped), 1, &report),
                 WM_ERROR_IO);
    CHECK_CONTAINS(wm_last_error(), fx.path);
    CHECK_EQ(report.bytes, 0); /* untouched on failure */
    fixture_close(&fx);
}

static void case_wrong_calls_are_invalid_arguments(void) {
    fixture fx;
    REQUIRE(fixture_open(&fx));
    const wm_mapped_file* files = wm_mapped_model_files(fx.mapped);
    CHECK_INVALID(wm_populate_imports(NULL, fx.plan, files, 1, NULL), "wm_populate_imports");
    CHECK_INVALID(wm_populate_imports(fx.model, NULL, files, 1, NULL), "wm_populate_imports");
    CHECK_INVALID(wm_populate_imports(fx.model, fx.plan, files, 2, NULL), "wm_populate_imports");
    CHECK_INVALID(wm_populate_imports(fx.model, fx.plan, NULL, 1, NULL), "wm_populate_imports");
    wm_populate_report small = {.struct_size = 2};
    CHECK_INVALID(wm_populate_imports(fx.model, fx.plan, files, 1, &small), "wm_populate_imports");
    fixture_close(&fx);
}

int main(void) {
    C_RUN(case_populates_exactly_the_planned_extents);
    C_RUN(case_file_truncated_after_planning_is_an_io_error);
    C_RUN(case_wrong_calls_are_invalid_arguments);
    return c_check_finish();
}
