/* SPDX-License-Identifier: MIT */
/* export.h - WM_API marks what libweightmap exports; everything else is hidden.
 *
 * The library is built with -fvisibility=hidden (Meson gnu_symbol_visibility 'inlineshidden'), so
 * only declarations marked WM_API are part of the ABI; abi/symbols.txt lists them and a test fails
 * when the exported set changes without that file changing. C and C++ headers both use it. */
#ifndef WEIGHTMAP_EXPORT_H
#define WEIGHTMAP_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define WM_API __attribute__((visibility("default")))
#else
#define WM_API
#endif

#endif /* WEIGHTMAP_EXPORT_H */
