/* SPDX-License-Identifier: MIT */
/* Special files as model paths, and paths that change under a mapped model (issue 44 items 3 and
 * 7): a FIFO, a directory, a character device and a /proc file are refused promptly, with the
 * path and what it is, by every entry point that opens a path (wm_mapped_model_open,
 * wm_decide_mapping); wm_populate_imports on Linux >= 5.14 reads through the caller's mapping
 * and never opens the path, so a path renamed over by another file (or a FIFO) changes nothing.
 * A case that would hang is ended by alarm() (SIGALRM fails that case). */
#include "c_check.h" /* first: it asks for POSIX */

#include <sys/utsname.h>

#include "attack_engine.h"

enum { HANG_SECONDS = 10 };

/* A FIFO in the temporary directory, removed at the end of the case process. */
static bool make_fifo(char* path) {
    snprintf(path, 512, "%s/wm-attack-fifo-%ld", c_temp_dir(), (long)getpid());
    unlink(path);
    if (mkfifo(path, 0600) != 0) return false;
    if (c_temp_count_ < C_MAX_TEMP) snprintf(c_temp_paths_[c_temp_count_++], 512, "%s", path);
    return true;
}

/* wm_mapped_model_open of `path` fails with `want` and a message naming the path and `what`. */
static void check_open_refused(const char* path, wm_status want, const char* what) {
    const char* paths[1] = {path};
    wm_mapped_model* mapped = NULL;
    alarm(HANG_SECONDS);
    CHECK_STATUS(wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &mapped), want);
    alarm(0);
    CHECK(mapped == NULL);
    CHECK_CONTAINS(wm_last_error(), path);
    CHECK_CONTAINS(wm_last_error(), what);
}

/* issue 44 item 3: open(O_RDONLY) of a FIFO blocked until a writer came. */
static void case_a_fifo_is_refused_by_the_mapping_without_hanging(void) {
    char fifo[512];
    REQUIRE(make_fifo(fifo));
    check_open_refused(fifo, WM_ERROR_INVALID_ARGUMENT, "FIFO");
}

static void case_directories_devices_and_proc_files_are_refused(void) {
    check_open_refused(c_temp_dir(), WM_ERROR_INVALID_ARGUMENT, "directory");
    check_open_refused("/dev/null", WM_ERROR_INVALID_ARGUMENT, "character device");
    check_open_refused("/proc/self/status", WM_ERROR_INVALID_ARGUMENT, "empty");
}

/* issue 44 item 3: wm_decide_mapping asks whether each file may be mapped writable for an
 * importer that needs writable pages, which opened the FIFO O_RDONLY and hung. */
static void case_a_fifo_is_refused_by_the_mapping_decision_without_hanging(void) {
    char fifo[512];
    REQUIRE(make_fifo(fifo));
    engine_importer engine = {.needs_writable_mapping = true};
    wm_importer* importer = NULL;
    REQUIRE(engine_create(&engine, &importer));
    const char* paths[1] = {fifo};
    wm_mapping_decision* decision = NULL;
    alarm(HANG_SECONDS);
    CHECK_OK(wm_decide_mapping(paths, 1, &importer, 1, &decision));
    alarm(0);
    if (decision != NULL) {
        CHECK(wm_mapping_decision_access(decision) == WM_MAPPING_READ_ONLY);
        CHECK_STR_EQ(wm_mapping_decision_unwritable_path(decision), fifo);
        CHECK_CONTAINS(wm_mapping_decision_reason(decision), "FIFO");
    }
    wm_mapping_decision_destroy(decision);
    wm_importer_destroy(importer);
}

static bool kernel_at_least(int major, int minor) {
    struct utsname u;
    int got_major = 0, got_minor = 0;
    if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &got_major, &got_minor) != 2) return false;
    return got_major > major || (got_major == major && got_minor >= minor);
}

typedef struct mapped_fixture {
    char path[512];
    engine_importer engine;
    wm_importer* importer;
    wm_model* model;
    wm_plan* plan;
    wm_mapped_model* mapped;
} mapped_fixture;

/* A 4 MiB file, mapped, with one 2 MiB device tensor at 1 MiB, planned. */
static bool mapped_open(mapped_fixture* fx) {
    memset(fx, 0, sizeof *fx);
    const char* paths[1] = {fx->path};
    return c_temp_file(4 * ATTACK_MiB, 0x44, fx->path) && engine_create(&fx->engine, &fx->importer) &&
           engine_model(fx->path, 4 * ATTACK_MiB, ATTACK_MiB, 2 * ATTACK_MiB, fx->importer, &fx->model) &&
           wm_plan_create(fx->model, NULL, &fx->plan) == WM_OK &&
           wm_mapped_model_open(paths, 1, WM_MAPPING_READ_ONLY, NULL, &fx->mapped) == WM_OK;
}

static void mapped_close(mapped_fixture* fx) {
    wm_mapped_model_destroy(fx->mapped);
    wm_plan_destroy(fx->plan);
    wm_model_destroy(fx->model);
    wm_importer_destroy(fx->importer);
}

/* issue 44 item 7: the path of a mapped model renamed over by a one-page file. Populate opened
 * the path and refused the extent against the new file's size ("the file ends at offset 4096"),
 * though the mapping it reads is whole. */
static void case_populate_reads_the_mapping_not_a_path_renamed_over(void) {
    if (!kernel_at_least(5, 14)) C_SKIP("populate opens the paths before Linux 5.14 (pread)");
    mapped_fixture fx;
    REQUIRE(mapped_open(&fx));
    char other[512];
    REQUIRE(c_temp_file(4096, 0x55, other));
    REQUIRE(rename(other, fx.path) == 0);
    wm_populate_report report = {.struct_size = sizeof report};
    CHECK_OK(wm_populate_imports(fx.model, fx.plan, wm_mapped_model_files(fx.mapped), 1, &report));
    CHECK_EQ(report.bytes, 2 * ATTACK_MiB);
    CHECK_PATTERN((const char*)wm_mapped_model_files(fx.mapped)[0].base + ATTACK_MiB,
                  2 * ATTACK_MiB, 0x44, ATTACK_MiB);
    mapped_close(&fx);
}

/* issue 44 items 3 and 7: the path renamed over by a FIFO; opening it hung populate. */
static void case_populate_ignores_a_fifo_renamed_over_the_path(void) {
    if (!kernel_at_least(5, 14)) C_SKIP("populate opens the paths before Linux 5.14 (pread)");
    mapped_fixture fx;
    REQUIRE(mapped_open(&fx));
    char fifo[512];
    REQUIRE(make_fifo(fifo));
    REQUIRE(rename(fifo, fx.path) == 0);
    alarm(HANG_SECONDS);
    CHECK_OK(wm_populate_imports(fx.model, fx.plan, wm_mapped_model_files(fx.mapped), 1, NULL));
    alarm(0);
    mapped_close(&fx);
}

int main(void) {
    C_RUN(case_a_fifo_is_refused_by_the_mapping_without_hanging);
    C_RUN(case_directories_devices_and_proc_files_are_refused);
    C_RUN(case_a_fifo_is_refused_by_the_mapping_decision_without_hanging);
    C_RUN(case_populate_reads_the_mapping_not_a_path_renamed_over);
    C_RUN(case_populate_ignores_a_fifo_renamed_over_the_path);
    return c_check_finish();
}
