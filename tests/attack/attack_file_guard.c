/* SPDX-License-Identifier: MIT */
/* Attacks on the file guard (file_guard.h) as a careless engine makes them (issue 44): two
 * guards on copies of one descriptor, a guard destroyed in a fork()ed child, a slow log callback
 * during create while a writer arrives, and descriptors that are no regular file open for
 * reading (O_PATH, a FIFO, a directory, a /proc file). A writer is another process blocked in
 * open(O_WRONLY | O_TRUNC); the guard's callback releases it, never the kernel's 45 s
 * lease-break-time. Every case arms alarm(): a hang fails the case (SIGALRM), not the run. */
#define _GNU_SOURCE /* O_PATH, F_GETLEASE */
#include "c_check.h"

#include "c_guard_writer.h"
#include "weightmap/file_guard.h"

enum { watchdog_s = 20, quiet_ms = 300, hold_ms = 300, wait_ms = 5000 };

static void sleep_ms(int ms) {
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

/* --- a writer in another process ------------------------------------------------------------ */

/* The child's exit code, 128 + signal if killed; -1 if it did not end within `timeout_ms` (it
 * is then killed). */
static int exit_code_within(pid_t pid, int timeout_ms) {
    int status = 0;
    const double deadline = c_now_ms() + timeout_ms;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (c_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        sleep_ms(5);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* --- what a guard's callback saw ------------------------------------------------------------ */

/* The callback writes one letter per event to a pipe, so the case's thread reads them in order
 * with a timeout: 'B' lease_breaking, 'T' lease_broken_by_timeout, 'C' changed, 'M' path_moved,
 * lower case when the handle was not yet known (guard still NULL); then 'R' once its
 * wm_file_guard_release of a breaking lease returned WM_OK ('F' if it failed). */
typedef struct recorder {
    wm_file_guard* guard; /* written by wm_file_guard_create through `out` */
    int hold_ms;          /* how long the callback keeps a breaking lease before releasing */
    int events[2];        /* pipe */
} recorder;

static bool recorder_init(recorder* r, int hold) {
    r->guard = NULL;
    r->hold_ms = hold;
    return pipe(r->events) == 0;
}

static void recorder_close(recorder* r) {
    close(r->events[0]);
    close(r->events[1]);
}

static void record(recorder* r, char c) {
    if (write(r->events[1], &c, 1) != 1) abort();
}

static void on_event(void* user, const wm_file_guard_event* event) {
    static const char letters[] = "BTCM";
    recorder* r = (recorder*)user;
    const bool known = r->guard != NULL;
    const char c = event->kind <= WM_FILE_GUARD_PATH_MOVED ? letters[event->kind] : '?';
    record(r, known ? c : (char)(c - 'A' + 'a'));
    if (event->kind != WM_FILE_GUARD_LEASE_BREAKING || !known) return;
    sleep_ms(r->hold_ms); /* the writer must still be blocked meanwhile */
    record(r, wm_file_guard_release(r->guard, event->file) == WM_OK ? 'R' : 'F');
}

/* The next letter the callback recorded within `timeout_ms`, or '-' when none came. */
static char next_event(recorder* r, int timeout_ms) {
    char c = '-';
    if (!c_readable(r->events[0], timeout_ms) || read(r->events[0], &c, 1) != 1) return '-';
    return c;
}

static wm_status guard_files(const wm_guarded_file* files, uint32_t count, recorder* r,
                             wm_log_fn log, void* log_user) {
    wm_file_guard_params params;
    wm_file_guard_params_init(&params);
    params.on_event = on_event;
    params.on_event_user = r;
    params.poll_period_ms = 5;
    params.log = log;
    params.log_user = log_user;
    return wm_file_guard_create(files, count, &params, &r->guard);
}

static wm_status guard_one(int fd, const char* path, recorder* r) {
    wm_guarded_file file;
    file.fd = fd;
    file.path = path;
    return guard_files(&file, 1, r, NULL, NULL);
}

static wm_file_lease_state lease_of(const wm_file_guard* guard, uint32_t file) {
    wm_file_guard_file_status st;
    st.struct_size = sizeof st;
    st.lease = WM_FILE_LEASE_NONE;
    return wm_file_guard_get_file(guard, file, &st) == WM_OK ? st.lease : (wm_file_lease_state)-1;
}

/* A writer arrives: the guard behind `r` hears lease_breaking while the writer is still blocked
 * in open, its callback keeps it blocked for hold_ms and releases, and only then the writer's
 * open returns and truncates the file. */
static void writer_waits_for_the_callback(recorder* r, const char* path) {
    int done = -1;
    char c = 0, event;
    double heard;
    const pid_t pid = c_fork_truncating_writer(path, &done);
    REQUIRE(pid > 0);
    event = next_event(r, wait_ms);
    heard = c_now_ms();
    CHECK_MSG(event == 'B', "the first event after the writer is '%c', not 'B' (lease_breaking "
              "with the handle known)", event);
    CHECK_MSG(!c_readable(done, 0), "the writer's open returned before the callback released");
    event = next_event(r, wait_ms);
    CHECK_MSG(event == 'R', "after lease_breaking the callback recorded '%c', not 'R'", event);
    CHECK_MSG(c_readable(done, wait_ms), "the writer is still blocked %d ms after the release",
              wait_ms);
    CHECK_MSG(c_now_ms() - heard >= hold_ms - 50, "the writer returned %.0f ms after the event, "
              "before the callback's %d ms hold ended", c_now_ms() - heard, (int)hold_ms);
    CHECK(read(done, &c, 1) == 1 && c == 'o');
    CHECK_EQ(exit_code_within(pid, wait_ms), 0);
    CHECK_EQ(c_size_of(path), 0);
    CHECK_EQ(lease_of(r->guard, 0), WM_FILE_LEASE_RELEASED);
    close(done);
}

/* --- the cases ------------------------------------------------------------------------------ */

/* issue 44 item 4: two guards on F_DUPFD copies of one descriptor (one open file description).
 * Destroying one must leave the other's lease intact: no lease_breaking without a writer, and a
 * writer blocked until the remaining guard's callback releases. */
static void case_two_guards_on_dupfd_copies_destroy_one_the_other_still_blocks_a_writer(void) {
    char path[512];
    recorder first, second;
    int fd, copy;
    char event;
    alarm(watchdog_s);
    REQUIRE(c_temp_file(65536, 4, path));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    REQUIRE(fd >= 0 && copy >= 0);
    REQUIRE(recorder_init(&first, 0) && recorder_init(&second, hold_ms));
    REQUIRE_OK(guard_one(fd, path, &first));
    REQUIRE_OK(guard_one(copy, path, &second));
    CHECK_EQ(lease_of(first.guard, 0), WM_FILE_LEASE_HELD);
    CHECK_EQ(lease_of(second.guard, 0), WM_FILE_LEASE_HELD);
    wm_file_guard_destroy(first.guard);
    event = next_event(&second, quiet_ms);
    CHECK_MSG(event == '-', "the remaining guard reported '%c' with no writer after the other "
              "guard of the same description was destroyed", event);
    CHECK_EQ(lease_of(second.guard, 0), WM_FILE_LEASE_HELD);
    writer_waits_for_the_callback(&second, path);
    while ((event = next_event(&second, 50)) != '-')
        CHECK_MSG(event != 'B' && event != 'T', "lease event '%c' after the release", event);
    wm_file_guard_destroy(second.guard);
    recorder_close(&first);
    recorder_close(&second);
    close(copy);
    close(fd);
}

/* issue 44 item 5: a fork()ed child that destroys the guard it inherited (and exits, closing
 * its copies of every descriptor) must leave the parent's lease held: the parent hears nothing
 * until a writer opens, and that writer waits for the parent's release. */
static void case_a_forked_child_destroying_the_guard_leaves_the_parent_lease_held(void) {
    char path[512];
    recorder r;
    int fd, code;
    pid_t child;
    char event;
    alarm(watchdog_s);
    REQUIRE(c_temp_file(65536, 5, path));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(recorder_init(&r, hold_ms));
    REQUIRE_OK(guard_one(fd, path, &r));
    fflush(stdout);
    fflush(stderr);
    child = fork();
    if (child == 0) {
        wm_file_guard_destroy(r.guard);
        _exit(0);
    }
    REQUIRE(child > 0);
    code = exit_code_within(child, wait_ms);
    CHECK_MSG(code == 0, "the child's wm_file_guard_destroy %s (exit %d)",
              code < 0 ? "hung" : "failed", code);
    event = next_event(&r, quiet_ms);
    CHECK_MSG(event == '-', "the parent's guard reported '%c' with no writer once the child "
              "destroyed its copy", event);
    CHECK_EQ(lease_of(r.guard, 0), WM_FILE_LEASE_HELD);
    writer_waits_for_the_callback(&r, path);
    wm_file_guard_destroy(r.guard);
    recorder_close(&r);
    close(fd);
}

/* The log callback of item 6: at the first warning (files[1] gets no lease: a writer holds it
 * open), a writer arrives on files[0], whose lease is already held, and the callback lingers;
 * a write to files[1] meanwhile wakes the guard's thread through inotify. */
typedef struct slow_log {
    const char* leased_path;
    int other_writer;
    pid_t writer;
    int done;
} slow_log;

static void slow_log_fn(void* user, wm_log_level level, const char* message) {
    slow_log* s = (slow_log*)user;
    (void)message;
    if (level != WM_LOG_WARNING || s->writer != 0) return;
    s->writer = c_fork_truncating_writer(s->leased_path, &s->done);
    sleep_ms(50); /* the writer is blocked on files[0]'s lease by now */
    if (pwrite(s->other_writer, "x", 1, 0) != 1) abort();
    sleep_ms(50);
}

/* One round of item 6; false when it failed (its checks say how). */
static bool break_during_a_slow_create(const char* leased, const char* busy, int round) {
    wm_guarded_file files[2];
    recorder r;
    slow_log s;
    char event, c = 0;
    bool ok = true;
    s.leased_path = leased;
    s.other_writer = open(busy, O_WRONLY | O_CLOEXEC);
    s.writer = 0;
    s.done = -1;
    files[0].fd = open(leased, O_RDONLY | O_CLOEXEC);
    files[0].path = leased;
    files[1].fd = open(busy, O_RDONLY | O_CLOEXEC);
    files[1].path = busy;
    if (s.other_writer < 0 || files[0].fd < 0 || files[1].fd < 0 || !recorder_init(&r, 0) ||
        guard_files(files, 2, &r, slow_log_fn, &s) != WM_OK || s.writer <= 0) {
        CHECK_MSG(false, "round %d: setup failed: %s", round, c_str_(wm_last_error()));
        return false;
    }
    event = next_event(&r, wait_ms);
    if (!(event >= 'A' && event <= 'Z')) {
        CHECK_MSG(false, "round %d: the first event the callback saw is '%c': it came before "
                  "wm_file_guard_create stored the handle", round, event);
        ok = false;
    }
    while (event != '-' && event != 'B' && event != 'b') event = next_event(&r, wait_ms);
    ok &= event == 'B';
    CHECK_MSG(event == 'B', "round %d: lease_breaking for files[0] came as '%c'", round, event);
    if (!c_readable(s.done, ok ? wait_ms : 1000)) {
        CHECK_MSG(false, "round %d: the writer is still blocked %d ms after create returned: "
                  "the callback could not release", round, ok ? (int)wait_ms : 1000);
        ok = false;
    }
    wm_file_guard_destroy(r.guard); /* drops the lease where the callback could not */
    CHECK(read(s.done, &c, 1) == 1 && c == 'o');
    CHECK_EQ(exit_code_within(s.writer, wait_ms), 0);
    recorder_close(&r);
    close(s.done);
    close(files[0].fd);
    close(files[1].fd);
    close(s.other_writer);
    return ok;
}

/* issue 44 item 6: a lease break while create is still running (a slow log callback) must not
 * reach the callback before wm_file_guard_create stored the handle: the first event the callback
 * sees has it, so it can release, and the writer proceeds. Without the fix the event wins the
 * race with create's return in about one round of three (measured 2 of 7): 15 rounds. */
static void case_a_break_during_a_slow_create_reaches_the_callback_with_the_handle(void) {
    char leased[512], busy[512];
    int round;
    alarm(watchdog_s);
    REQUIRE(c_temp_file(65536, 6, leased) && c_temp_file(4096, 7, busy));
    for (round = 0; round < 15; ++round)
        if (!break_during_a_slow_create(leased, busy, round)) break;
}

/* wm_file_guard_create with one descriptor must fail with WM_ERROR_INVALID_ARGUMENT, and the
 * message must name files[0], its path, the descriptor and `why`. */
static void check_refused(int fd, const char* path, const char* why) {
    wm_guarded_file file;
    wm_file_guard* guard = NULL;
    char named[600];
    file.fd = fd;
    file.path = path;
    CHECK_STATUS(wm_file_guard_create(&file, 1, NULL, &guard), WM_ERROR_INVALID_ARGUMENT);
    CHECK(guard == NULL);
    snprintf(named, sizeof named, "files[0] (%s)", path);
    CHECK_CONTAINS(wm_last_error(), named);
    snprintf(named, sizeof named, "fd %d ", fd);
    CHECK_CONTAINS(wm_last_error(), named);
    CHECK_CONTAINS(wm_last_error(), why);
}

/* issue 44 item 10: an O_PATH descriptor has O_RDONLY's access bits but allows no file
 * operation: refused up front, not reported later as an fcntl's EBADF. */
static void case_an_o_path_descriptor_is_an_invalid_argument_naming_the_fd(void) {
    char path[512];
    int fd;
    alarm(watchdog_s);
    REQUIRE(c_temp_file(4096, 10, path));
    fd = open(path, O_PATH | O_CLOEXEC);
    REQUIRE(fd >= 0);
    check_refused(fd, path, "O_PATH");
    close(fd);
}

/* issue 44 items 3 and 10, for the guard: a FIFO (opened O_NONBLOCK, as an engine that probes
 * it would), a directory and a /proc file are refused at once; none hangs (alarm). */
static void case_a_fifo_a_directory_and_a_proc_file_are_refused_without_hanging(void) {
    char fifo[512];
    int fd;
    alarm(watchdog_s);
    snprintf(fifo, sizeof fifo, "%s/wm-c-api-%ld-fifo", c_temp_dir(), (long)getpid());
    REQUIRE(mkfifo(fifo, 0600) == 0);
    fd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    CHECK(fd >= 0);
    if (fd >= 0) check_refused(fd, fifo, "not a regular file");
    close(fd);
    unlink(fifo);

    fd = open(c_temp_dir(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    check_refused(fd, c_temp_dir(), "not a regular file");
    close(fd);

    fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    check_refused(fd, "/proc/self/status", "procfs");
    close(fd);
}

int main(void) {
    C_RUN(case_two_guards_on_dupfd_copies_destroy_one_the_other_still_blocks_a_writer);
    C_RUN(case_a_forked_child_destroying_the_guard_leaves_the_parent_lease_held);
    C_RUN(case_a_break_during_a_slow_create_reaches_the_callback_with_the_handle);
    C_RUN(case_an_o_path_descriptor_is_an_invalid_argument_naming_the_fd);
    C_RUN(case_a_fifo_a_directory_and_a_proc_file_are_refused_without_hanging);
    return c_check_finish();
}
