/* SPDX-License-Identifier: MIT */
/* The file guard through the C API (file_guard.h, docs/file_guard.md): a writer in another
 * process blocked in open(O_TRUNC) until wm_file_guard_release, heard through the eventfd and
 * the queue; release from inside the callback; no lease for a file open for writing (EAGAIN),
 * with the write reported as CHANGED; a touch reported as METADATA_CHANGED; the defaults, names
 * and every argument error. */
#include "c_check.h"

#include "c_guard_writer.h"
#include "weightmap/file_guard.h"

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int exit_code(pid_t pid) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A temp file of `size` bytes (seed `seed`), open read-only at *fd, guarded with the defaults
 * into *guard (NULL when a step failed). */
static void guard_temp_file(uint64_t size, uint8_t seed, char path[512], int* fd, wm_file_guard** guard) {
    wm_guarded_file files[1];
    *guard = NULL;
    REQUIRE(c_temp_file(size, seed, path));
    *fd = open(path, O_RDONLY);
    files[0].fd = *fd;
    files[0].path = path;
    REQUIRE_OK(wm_file_guard_create(files, 1, NULL, guard));
}

static void case_writer_waits_for_release(void) {
    char path[512];
    int fd = -1;
    wm_file_guard* guard = NULL;
    guard_temp_file(65536, 7, path, &fd, &guard);
    REQUIRE(guard != NULL);
    close(fd); /* the guard has its own open file description of the file */
    wm_file_guard_file_status st = {sizeof st, WM_FILE_LEASE_NONE, -1, NULL};
    REQUIRE_OK(wm_file_guard_get_file(guard, 0, &st));
    REQUIRE_EQ(st.lease, WM_FILE_LEASE_HELD);
    CHECK_STR_EQ(st.reason, "");

    int done = -1;
    const pid_t pid = c_fork_truncating_writer(path, &done);
    REQUIRE(pid > 0);
    REQUIRE(c_readable(wm_file_guard_event_fd(guard), 5000));
    wm_file_guard_event e = {sizeof e, 99, WM_FILE_GUARD_CHANGED, 0, 0};
    bool has = false;
    REQUIRE_OK(wm_file_guard_next_event(guard, &e, &has));
    REQUIRE(has);
    CHECK_EQ(e.file, 0);
    CHECK_EQ(e.kind, WM_FILE_GUARD_LEASE_BREAKING);
    CHECK(e.monotonic_ns > 0 && e.monotonic_ns <= now_ns());
    CHECK(!c_readable(done, 0));   /* still blocked in open */
    CHECK(!c_readable(done, 200)); /* and 200 ms later */
    CHECK_EQ(c_size_of(path), 65536);
    const double released = c_now_ms();
    REQUIRE_OK(wm_file_guard_release(guard, 0));
    REQUIRE(c_readable(done, 5000));
    const double ms = c_now_ms() - released;
    printf("writer returned %.3f ms after wm_file_guard_release\n", ms);
    CHECK_MSG(ms < 500, "%.1f ms", ms);
    char c = 0;
    CHECK(read(done, &c, 1) == 1 && c == 'o');
    CHECK_EQ(exit_code(pid), 0);
    CHECK_EQ(c_size_of(path), 0);
    REQUIRE_OK(wm_file_guard_get_file(guard, 0, &st));
    CHECK_EQ(st.lease, WM_FILE_LEASE_RELEASED);
    close(done);
    wm_file_guard_destroy(guard);
}

typedef struct in_callback {
    wm_file_guard* guard;
    int breaking;
    wm_status released;
} in_callback;

static void release_in_callback(void* user, const wm_file_guard_event* event) {
    in_callback* state = (in_callback*)user;
    if (event->kind != WM_FILE_GUARD_LEASE_BREAKING) return;
    ++state->breaking;
    state->released = wm_file_guard_release(state->guard, event->file);
}

static void case_release_from_the_callback(void) {
    char path[512];
    REQUIRE(c_temp_file(4096, 8, path));
    const int fd = open(path, O_RDONLY);
    wm_guarded_file files[1];
    files[0].fd = fd;
    files[0].path = path;
    /* The state is only read back after the writer is through, and written by the callback
     * before it releases: the writer's return orders the two. */
    in_callback state = {NULL, 0, WM_ERROR_INTERNAL};
    wm_file_guard_params params;
    wm_file_guard_params_init(&params);
    params.on_event = release_in_callback;
    params.on_event_user = &state;
    params.poll_period_ms = 5;
    REQUIRE_OK(wm_file_guard_create(files, 1, &params, &state.guard));
    int done = -1;
    const pid_t pid = c_fork_truncating_writer(path, &done);
    REQUIRE(c_readable(done, 5000)); /* the callback released it */
    CHECK_EQ(exit_code(pid), 0);
    wm_file_guard_destroy(state.guard); /* joins: the callback's writes are visible */
    CHECK_EQ(state.breaking, 1);
    CHECK_EQ(state.released, WM_OK);
    close(done);
    close(fd);
}

static void case_no_lease_when_open_for_writing(void) {
    char path[512];
    REQUIRE(c_temp_file(4096, 9, path));
    const int writer = open(path, O_WRONLY);
    const int fd = open(path, O_RDONLY);
    wm_guarded_file files[1];
    files[0].fd = fd;
    files[0].path = path;
    wm_file_guard* guard = NULL;
    REQUIRE_OK(wm_file_guard_create(files, 1, NULL, &guard));
    wm_file_guard_file_status st = {sizeof st, WM_FILE_LEASE_HELD, 0, NULL};
    REQUIRE_OK(wm_file_guard_get_file(guard, 0, &st));
    CHECK_EQ(st.lease, WM_FILE_LEASE_NONE);
    CHECK_EQ(st.lease_errno, EAGAIN);
    CHECK_CONTAINS(st.reason, path);
    CHECK_CONTAINS(st.reason, "EAGAIN");
    CHECK(pwrite(writer, "x", 1, 0) == 1);
    REQUIRE(c_readable(wm_file_guard_event_fd(guard), 5000));
    wm_file_guard_event e = {sizeof e, 99, WM_FILE_GUARD_LEASE_BREAKING, 0, 0};
    bool has = false;
    REQUIRE_OK(wm_file_guard_next_event(guard, &e, &has));
    CHECK(has);
    CHECK_EQ(e.kind, WM_FILE_GUARD_CHANGED);
    CHECK_OK(wm_file_guard_release(guard, 0)); /* no lease: a no-op */
    wm_file_guard_destroy(guard);
    close(fd);
    close(writer);
}

static void case_defaults_and_names(void) {
    wm_file_guard_params p;
    memset(&p, 0xA5, sizeof p);
    wm_file_guard_params_init(&p);
    CHECK_EQ(p.struct_size, sizeof p);
    CHECK(p.on_event == NULL && p.on_event_user == NULL && p.log == NULL && p.log_user == NULL);
    CHECK_EQ(p.poll_period_ms, 20);
    CHECK_STR_EQ(wm_file_guard_event_kind_name(WM_FILE_GUARD_LEASE_BREAKING), "lease_breaking");
    CHECK_STR_EQ(wm_file_guard_event_kind_name(WM_FILE_GUARD_LEASE_BROKEN_BY_TIMEOUT),
                 "lease_broken_by_timeout");
    CHECK_STR_EQ(wm_file_guard_event_kind_name(WM_FILE_GUARD_CHANGED), "changed");
    CHECK_STR_EQ(wm_file_guard_event_kind_name(WM_FILE_GUARD_PATH_MOVED), "path_moved");
    CHECK_STR_EQ(wm_file_guard_event_kind_name(WM_FILE_GUARD_METADATA_CHANGED), "metadata_changed");
    CHECK(p.regions == NULL && p.region_count == 0);
    CHECK_STR_EQ(wm_file_guard_event_kind_name((wm_file_guard_event_kind)42), "?");
    CHECK_EQ(wm_file_guard_file_count(NULL), 0);
    CHECK_EQ(wm_file_guard_event_fd(NULL), -1);
    wm_file_guard_destroy(NULL);
}

static void case_every_error_names_function_file_and_field(void) {
    char path[512];
    REQUIRE(c_temp_file(4096, 10, path));
    const int fd = open(path, O_RDONLY);
    const int rw = open(path, O_RDWR);
    wm_guarded_file files[2];
    files[0].fd = fd;
    files[0].path = path;
    files[1].fd = -1;
    files[1].path = "/m/b.gguf";
    wm_file_guard* guard = (wm_file_guard*)&files; /* must stay untouched on failure */
    wm_file_guard* const untouched = guard;
    CHECK_INVALID(wm_file_guard_create(files, 2, NULL, &guard), "files[1] (/m/b.gguf): fd is -1");
    CHECK(guard == untouched);
    CHECK_INVALID(wm_file_guard_create(files, 0, NULL, &guard), "params.files is empty");
    CHECK_INVALID(wm_file_guard_create(NULL, 1, NULL, &guard), "wm_file_guard_create: files");
    CHECK_INVALID(wm_file_guard_create(files, 1, NULL, NULL), "wm_file_guard_create: out");
    files[1].fd = rw;
    CHECK_INVALID(wm_file_guard_create(files, 2, NULL, &guard), "files[1] (/m/b.gguf)");
    CHECK_CONTAINS(wm_last_error(), "O_RDONLY");
    wm_file_guard_params p;
    wm_file_guard_params_init(&p);
    p.poll_period_ms = 0;
    CHECK_INVALID(wm_file_guard_create(files, 1, &p, &guard), "params.poll_period_ms is 0");
    p.struct_size = 2;
    CHECK_INVALID(wm_file_guard_create(files, 1, &p, &guard), "params->struct_size is 2");
    CHECK(guard == untouched);

    REQUIRE_OK(wm_file_guard_create(files, 1, NULL, &guard));
    CHECK_INVALID(wm_file_guard_release(guard, 1),
                  "wm_file_guard_release: file 1 is out of range (1)");
    CHECK_INVALID(wm_file_guard_release(NULL, 0), "wm_file_guard_release: guard is NULL");
    wm_file_guard_file_status st = {sizeof st, WM_FILE_LEASE_NONE, 0, NULL};
    CHECK_INVALID(wm_file_guard_get_file(guard, 3, &st), "wm_file_guard_get_file: file 3");
    CHECK_INVALID(wm_file_guard_get_file(guard, 0, NULL), "wm_file_guard_get_file: out is NULL");
    st.struct_size = 1;
    CHECK_INVALID(wm_file_guard_get_file(guard, 0, &st), "out->struct_size is 1");
    wm_file_guard_event e = {sizeof e, 0, WM_FILE_GUARD_CHANGED, 0, 0};
    bool has = true;
    CHECK_INVALID(wm_file_guard_next_event(guard, NULL, &has), "wm_file_guard_next_event: out");
    CHECK_INVALID(wm_file_guard_next_event(guard, &e, NULL), "has_event is NULL");
    CHECK_OK(wm_file_guard_next_event(guard, &e, &has));
    CHECK(!has);
    char byte = 0;
    CHECK_INVALID(wm_file_guard_read(guard, 1, 0, &byte, 1), "wm_file_guard_read: file 1");
    CHECK_INVALID(wm_file_guard_read(guard, 0, 0, NULL, 1), "wm_file_guard_read: destination");
    CHECK_INVALID(wm_file_guard_read(NULL, 0, 0, &byte, 1), "wm_file_guard_read: guard is NULL");
    CHECK_OK(wm_file_guard_read(guard, 0, 4095, &byte, 1));
    CHECK(wm_file_guard_read(guard, 0, 4095, &byte, 2) == WM_ERROR_IO);
    CHECK_CONTAINS(wm_last_error(), path);
    CHECK_CONTAINS(wm_last_error(), "truncated");
    wm_file_guard_destroy(guard);
    wm_guarded_region regions[1] = {{1, 0, 4096}};
    p.struct_size = sizeof p;
    p.poll_period_ms = 20;
    p.regions = regions;
    p.region_count = 1;
    CHECK_INVALID(wm_file_guard_create(files, 1, &p, &guard), "params.regions[0].file is 1");
    p.regions = NULL;
    CHECK_INVALID(wm_file_guard_create(files, 1, &p, &guard), "params->regions is NULL");
    close(rw);
    close(fd);
}

/* A touch with the lease held: METADATA_CHANGED through the queue, never CHANGED. */
static void case_touch_is_metadata_changed(void) {
    char path[512];
    int fd = -1;
    wm_file_guard* guard = NULL;
    guard_temp_file(8192, 11, path, &fd, &guard);
    REQUIRE(guard != NULL);
    REQUIRE(utimensat(AT_FDCWD, path, NULL, 0) == 0);
    REQUIRE(c_readable(wm_file_guard_event_fd(guard), 5000));
    wm_file_guard_event e = {sizeof e, 99, WM_FILE_GUARD_CHANGED, 0, 0};
    bool has = false;
    REQUIRE_OK(wm_file_guard_next_event(guard, &e, &has));
    CHECK(has);
    CHECK_EQ(e.kind, WM_FILE_GUARD_METADATA_CHANGED);
    CHECK_EQ(e.deadline_ns, 0);
    wm_file_guard_destroy(guard);
    close(fd);
}

int main(void) {
    C_RUN(case_writer_waits_for_release);
    C_RUN(case_release_from_the_callback);
    C_RUN(case_no_lease_when_open_for_writing);
    C_RUN(case_defaults_and_names);
    C_RUN(case_every_error_names_function_file_and_field);
    C_RUN(case_touch_is_metadata_changed);
    return c_check_finish();
}
