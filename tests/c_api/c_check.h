/* SPDX-License-Identifier: MIT */
/* c_check.h - the C API tests' harness: checks, cases, SKIP, temporary pattern files.
 *
 * C99 on purpose (no Catch2: it is C++). Include it first: it asks for POSIX.1-2008.
 *
 *   static void case_something(void) { CHECK(x == 1); REQUIRE_OK(wm_...); ... }
 *   int main(void) { C_RUN(case_something); return c_check_finish(); }
 *
 * CHECK prints file:line and the expression and counts a failure; REQUIRE also ends the case
 * (it returns from the case function). Every case runs in a forked child (a crash or a sanitizer
 * abort fails that case and the others still run; C_CHECK_NO_FORK=1 runs them in-process, for a
 * debugger). C_SKIP(reason) ends a case as skipped. The program exits 1 if any case failed, 77
 * (SKIP) if every case skipped, else 0. */
#ifndef WM_TESTS_C_CHECK_H
#define WM_TESTS_C_CHECK_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "weightmap/weightmap.h"

/* --- checks ---------------------------------------------------------------------------------- */

static int c_check_failures_;     /* in the current case */
static const char* c_check_skip_; /* set by C_SKIP */

static inline void c_check_fail_(const char* file, int line, const char* what,
                                 const char* detail) {
    fprintf(stderr, "%s:%d: FAILED: %s%s%s\n", file, line, what, detail[0] ? "\n    " : "",
            detail);
    ++c_check_failures_;
}

/* Non-NULL view of a string for messages. */
static inline const char* c_str_(const char* s) { return s != NULL ? s : "(null)"; }

#define CHECK(cond)                                                                           \
    do {                                                                                      \
        if (!(cond)) c_check_fail_(__FILE__, __LINE__, #cond, "");                            \
    } while (0)

#define REQUIRE(cond)                                                                         \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            c_check_fail_(__FILE__, __LINE__, #cond, "(REQUIRE: case stopped)");              \
            return;                                                                           \
        }                                                                                     \
    } while (0)

/* A check with a printf-formatted explanation. */
#define CHECK_MSG(cond, ...)                                                                  \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            char c_msg_[1024];                                                                \
            snprintf(c_msg_, sizeof c_msg_, __VA_ARGS__);                                     \
            c_check_fail_(__FILE__, __LINE__, #cond, c_msg_);                                 \
        }                                                                                     \
    } while (0)

static inline bool c_status_is_(const char* file, int line, const char* what, wm_status got,
                                wm_status want) {
    if (got == want) return true;
    char detail[1200];
    snprintf(detail, sizeof detail, "status %s, expected %s; wm_last_error(): \"%s\"",
             wm_status_name(got), wm_status_name(want), c_str_(wm_last_error()));
    c_check_fail_(file, line, what, detail);
    return false;
}

#define CHECK_STATUS(expr, want) ((void)c_status_is_(__FILE__, __LINE__, #expr, (expr), (want)))
#define CHECK_OK(expr) CHECK_STATUS(expr, WM_OK)
#define REQUIRE_STATUS(expr, want)                                                            \
    do {                                                                                      \
        if (!c_status_is_(__FILE__, __LINE__, #expr, (expr), (want))) return;                 \
    } while (0)
#define REQUIRE_OK(expr) REQUIRE_STATUS(expr, WM_OK)

static inline bool c_eq_u64_(const char* file, int line, const char* what, uint64_t a,
                             uint64_t b) {
    if (a == b) return true;
    char detail[256];
    snprintf(detail, sizeof detail, "%" PRIu64 " (%#" PRIx64 ") != %" PRIu64 " (%#" PRIx64 ")",
             a, a, b, b);
    c_check_fail_(file, line, what, detail);
    return false;
}
#define CHECK_EQ(a, b) ((void)c_eq_u64_(__FILE__, __LINE__, #a " == " #b, (uint64_t)(a), (uint64_t)(b)))
#define REQUIRE_EQ(a, b)                                                                      \
    do {                                                                                      \
        if (!c_eq_u64_(__FILE__, __LINE__, #a " == " #b, (uint64_t)(a), (uint64_t)(b)))      \
            return;                                                                           \
    } while (0)

static inline void c_str_eq_(const char* file, int line, const char* what, const char* a,
                             const char* b) {
    if (a != NULL && b != NULL && strcmp(a, b) == 0) return;
    char detail[1200];
    snprintf(detail, sizeof detail, "\"%s\" != \"%s\"", c_str_(a), c_str_(b));
    c_check_fail_(file, line, what, detail);
}
#define CHECK_STR_EQ(a, b) c_str_eq_(__FILE__, __LINE__, #a " == " #b, (a), (b))

static inline bool c_contains_(const char* hay, const char* needle) {
    return hay != NULL && needle != NULL && strstr(hay, needle) != NULL;
}
static inline void c_str_contains_(const char* file, int line, const char* what,
                                   const char* hay, const char* needle) {
    if (c_contains_(hay, needle)) return;
    char detail[1400];
    snprintf(detail, sizeof detail, "\"%s\" does not contain \"%s\"", c_str_(hay),
             c_str_(needle));
    c_check_fail_(file, line, what, detail);
}
#define CHECK_CONTAINS(hay, needle)                                                           \
    c_str_contains_(__FILE__, __LINE__, #hay " contains " #needle, (hay), (needle))

/* A call that must fail with WM_ERROR_INVALID_ARGUMENT and leave a message naming `function`. */
#define CHECK_INVALID(expr, function)                                                         \
    do {                                                                                      \
        if (c_status_is_(__FILE__, __LINE__, #expr, (expr), WM_ERROR_INVALID_ARGUMENT))       \
            c_str_contains_(__FILE__, __LINE__, "wm_last_error() after " #expr " names " #function, \
                            wm_last_error(), function);                                      \
    } while (0)

#define C_SKIP(reason)                                                                        \
    do {                                                                                      \
        c_check_skip_ = (reason);                                                             \
        return;                                                                               \
    } while (0)

/* --- temporary files ------------------------------------------------------------------------- */

#define C_MAX_TEMP 16
static char c_temp_paths_[C_MAX_TEMP][512];
static int c_temp_count_;

static inline void c_temp_cleanup_(void) {
    for (int i = 0; i < c_temp_count_; ++i) {
        chmod(c_temp_paths_[i], 0600);
        unlink(c_temp_paths_[i]);
    }
    c_temp_count_ = 0;
}

/* Byte `offset` of a pattern file: a position hash that repeats neither every 256 bytes nor
 * every MiB (offset * 2^64/phi, top byte), xor a per-file seed so files cannot be mixed up. */
static inline uint8_t c_pattern_byte(uint8_t seed, uint64_t offset) {
    return (uint8_t)(((offset * UINT64_C(0x9E3779B97F4A7C15)) >> 56) ^ seed);
}

/* The first index where `bytes` differ from the pattern file's bytes from `file_offset` on, or
 * UINT64_MAX when they all match. */
static inline uint64_t c_pattern_mismatch(const void* bytes, uint64_t size, uint8_t seed,
                                          uint64_t file_offset) {
    const uint8_t* p = (const uint8_t*)bytes;
    for (uint64_t i = 0; i < size; ++i)
        if (p[i] != c_pattern_byte(seed, file_offset + i)) return i;
    return UINT64_MAX;
}
#define CHECK_PATTERN(bytes, size, seed, file_offset)                                         \
    CHECK_MSG(c_pattern_mismatch((bytes), (size), (seed), (file_offset)) == UINT64_MAX,       \
              "first mismatch at +%" PRIu64 " of %" PRIu64 " bytes (file offset %" PRIu64 ")", \
              c_pattern_mismatch((bytes), (size), (seed), (file_offset)), (uint64_t)(size),   \
              (uint64_t)(file_offset))

/* Creates a file of `size` pattern bytes under $TMPDIR (default /tmp), removed at the end of
 * the case. Writes its path to `path` (512 bytes). Returns false (after a message) on failure. */
static inline const char* c_temp_dir(void) {
    const char* dir = getenv("TMPDIR");
    return dir == NULL || dir[0] == '\0' ? "/tmp" : dir;
}

/* Removes what a case process `pid` that died early left in c_temp_dir(). */
static inline void c_temp_remove_leftovers(long pid) {
    char prefix[64], path[1024];
    snprintf(prefix, sizeof prefix, "wm-c-api-%ld-", pid);
    DIR* dir = opendir(c_temp_dir());
    if (dir == NULL) return;
    for (struct dirent* e = readdir(dir); e != NULL; e = readdir(dir)) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", c_temp_dir(), e->d_name);
        unlink(path);
    }
    closedir(dir);
}

static inline bool c_temp_file(uint64_t size, uint8_t seed, char* path) {
    const char* dir = c_temp_dir();
    if (c_temp_count_ == C_MAX_TEMP) return false;
    snprintf(path, 512, "%s/wm-c-api-%ld-XXXXXX", dir, (long)getpid());
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "mkstemp(%s): %s\n", path, strerror(errno));
        return false;
    }
    snprintf(c_temp_paths_[c_temp_count_++], 512, "%s", path);
    static uint8_t chunk[1 << 16];
    for (uint64_t done = 0; done < size;) {
        const uint64_t n = size - done < sizeof chunk ? size - done : sizeof chunk;
        for (uint64_t i = 0; i < n; ++i) chunk[i] = c_pattern_byte(seed, done + i);
        const ssize_t w = write(fd, chunk, (size_t)n);
        if (w <= 0) {
            fprintf(stderr, "write(%s): %s\n", path, strerror(errno));
            close(fd);
            return false;
        }
        done += (uint64_t)w;
    }
    close(fd);
    return true;
}

static inline uint64_t c_page_size(void) { return (uint64_t)sysconf(_SC_PAGESIZE); }
static inline uint64_t c_align_down(uint64_t x, uint64_t a) { return x - x % a; }
static inline uint64_t c_align_up(uint64_t x, uint64_t a) { return c_align_down(x + a - 1, a); }

/* --- cases ----------------------------------------------------------------------------------- */

typedef void (*c_case_fn)(void);
static int c_cases_failed_, c_cases_passed_, c_cases_skipped_;

static inline int c_case_result_(void) {
    if (c_check_failures_ != 0) return 1;
    return c_check_skip_ != NULL ? 77 : 0;
}

static inline void c_run_case_(const char* name, c_case_fn fn) {
    fflush(stdout);
    fflush(stderr);
    const char* no_fork = getenv("C_CHECK_NO_FORK");
    int result;
    if (no_fork != NULL && no_fork[0] == '1') {
        c_check_failures_ = 0;
        c_check_skip_ = NULL;
        fn();
        c_temp_cleanup_();
        result = c_case_result_();
        if (result == 77) printf("SKIP %s: %s\n", name, c_check_skip_);
    } else {
        const pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "fork: %s\n", strerror(errno));
            ++c_cases_failed_;
            return;
        }
        if (pid == 0) {
            c_check_failures_ = 0;
            c_check_skip_ = NULL;
            fn();
            c_temp_cleanup_();
            result = c_case_result_();
            if (result == 77) printf("SKIP %s: %s\n", name, c_check_skip_);
            fflush(stdout);
            fflush(stderr);
            exit(result); /* exit, not _exit: LeakSanitizer checks the case at exit */
        }
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        c_temp_remove_leftovers((long)pid);
        if (WIFSIGNALED(status)) {
            fprintf(stderr, "case %s: killed by signal %d (%s)\n", name, WTERMSIG(status),
                    strsignal(WTERMSIG(status)));
            result = 1;
        } else {
            result = WEXITSTATUS(status);
        }
    }
    if (result == 0) {
        ++c_cases_passed_;
        printf("ok   %s\n", name);
    } else if (result == 77) {
        ++c_cases_skipped_;
    } else {
        ++c_cases_failed_;
        printf("FAIL %s (exit %d)\n", name, result);
    }
    fflush(stdout);
}
#define C_RUN(fn) c_run_case_(#fn, fn)

static inline int c_check_finish(void) {
    printf("%d passed, %d failed, %d skipped\n", c_cases_passed_, c_cases_failed_,
           c_cases_skipped_);
    if (c_cases_failed_ != 0) return 1;
    return c_cases_passed_ == 0 && c_cases_skipped_ != 0 ? 77 : 0;
}

/* Runs `body` in a forked child and returns its wait status (for death tests). */
static inline int c_in_child(int (*body)(void* arg), void* arg) {
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) _exit(body(arg));
    int status = 0;
    if (pid < 0) return -1;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
}

#endif /* WM_TESTS_C_CHECK_H */
