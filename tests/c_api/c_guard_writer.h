/* SPDX-License-Identifier: MIT */
/* c_guard_writer.h - what the file guard's C tests share: a writer in another process that
 * breaks a read lease, and waiting on a descriptor with a timeout. Include after c_check.h. */
#ifndef WM_TESTS_C_GUARD_WRITER_H
#define WM_TESTS_C_GUARD_WRITER_H

#include <poll.h>
#include <time.h>

#include "c_check.h"

/* Whether `fd` becomes readable within `timeout_ms` (0: now; -1: ever). */
static inline bool c_readable(int fd, int timeout_ms) {
    struct pollfd p;
    int n;
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    while ((n = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
    }
    return n == 1 && (p.revents & POLLIN) != 0;
}

static inline double c_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* A child that opens `path` O_WRONLY|O_TRUNC (which breaks a read lease and blocks until it is
 * released) and writes 'o' (or 'e' when open failed) to a pipe once open returned; *done is the
 * pipe's read end. */
static inline pid_t c_fork_truncating_writer(const char* path, int* done) {
    int p[2];
    pid_t pid;
    if (pipe(p) != 0) return -1;
    pid = fork();
    if (pid == 0) {
        const int w = open(path, O_WRONLY | O_TRUNC);
        const char c = w >= 0 ? 'o' : 'e';
        _exit(write(p[1], &c, 1) == 1 ? 0 : 1);
    }
    close(p[1]);
    *done = p[0];
    return pid;
}

/* The size of the file at `path`, -1 when it cannot be stat()ed. */
static inline off_t c_size_of(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

#endif
