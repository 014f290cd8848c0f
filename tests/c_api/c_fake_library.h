/* SPDX-License-Identifier: MIT */
/* c_fake_library.h - a fake runtime's control functions, looked up in the very instance an
 * importer dlopens (dlopen of the same path returns it). Include after c_check.h, which sets
 * _POSIX_C_SOURCE. */
#ifndef WM_TESTS_C_FAKE_LIBRARY_H
#define WM_TESTS_C_FAKE_LIBRARY_H

#include <dlfcn.h>
#include <stddef.h>

/* `name` in the fake at `path`, or NULL. The library is kept open: its state outlives every
 * importer that loads and unloads it. */
static inline void* c_fake_symbol(const char* path, const char* name) {
    void* fake = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    return fake != NULL ? dlsym(fake, name) : NULL;
}

#endif /* WM_TESTS_C_FAKE_LIBRARY_H */
