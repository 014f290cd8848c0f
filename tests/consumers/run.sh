#!/usr/bin/env bash
# Builds and runs libweightmap's consumers from outside the tree, the ways engines take it:
#   c_pkgconfig       C99 (weightmap.h), `pkg-config --cflags --libs weightmap`, installed prefix
#   cpp17_cmake       C++17, CMake find_package(weightmap 0.7; 0.6 refused) + weightmap::weightmap, same prefix
#   meson_subproject  C++17 Meson project with this tree as subprojects/weightmap
#   minimal           this tree with -Dauto_features=disabled (no optional importer), -Dtests=false:
#                     the backend factories still link and say "built without"
# The prefix is `meson install -C BUILD_DIR --destdir TMP`. Each program checks computed values
# and exits non-zero on a failed check.
# Usage: tests/consumers/run.sh BUILD_DIR     (a configured build of this tree)
# Prints `consumer NAME: PASS|FAIL` for each (with its log on failure), then `N passed, M failed`;
# exits 1 if any failed. CONSUMERS="c_pkgconfig minimal" runs some; KEEP_TMP=1 keeps the
# temporary directory.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/wm-consumers.XXXXXX")
[[ ${KEEP_TMP:-0} == 1 ]] || trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest
# Only what a consumer builds is compiled here, unoptimised: these builds test linking, not speed.
quick=(--wrap-mode=nodownload -Dbuildtype=plain)
passed=0
failed=0

# One option of BUILD_DIR as configured (prefix, libdir).
option() {
  meson introspect "$build" --buildoptions |
    python3 -c "import json, sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'))"
}

install_prefix() {
  meson install -C "$build" --destdir "$dest" --quiet
  [[ -f $dest$libdir/pkgconfig/weightmap.pc && -f $dest$libdir/cmake/weightmap/weightmapConfig.cmake ]]
}

c_pkgconfig() {
  local flags
  export PKG_CONFIG_PATH=$dest$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
  [[ $(pkg-config --variable=pcfiledir weightmap) == "$dest$libdir/pkgconfig" ]]
  flags=$(pkg-config --cflags --libs weightmap)
  echo "pkg-config: $flags"
  # shellcheck disable=SC2086 # the flags are words
  gcc -std=c99 -pedantic -Wall -Wextra -Werror "$here/c_pkgconfig/consumer.c" $flags \
    -o "$tmp/c_consumer"
  LD_LIBRARY_PATH=$dest$libdir "$tmp/c_consumer"
}

cpp17_cmake() {
  cmake -S "$here/cpp17_cmake" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$dest$prefix"
  # The package found must be the one just installed, not one elsewhere on the system.
  grep -qx "weightmap_DIR:PATH=$dest$libdir/cmake/weightmap" "$tmp/cmake-build/CMakeCache.txt"
  cmake --build "$tmp/cmake-build"
  LD_LIBRARY_PATH=$dest$libdir "$tmp/cmake-build/cmake_consumer"
}

meson_subproject() {
  local project=$tmp/meson-project
  mkdir -p "$project/subprojects"
  cp "$here/meson_subproject/meson.build" "$here/cpp/consumer.cpp" "$project/"
  # A symlink to this tree: Meson 1.0 accepts it, and nothing is copied.
  ln -s "$root" "$project/subprojects/weightmap"
  # Forced, so that an installed weightmap.pc cannot stand in for the subproject. consumer.cpp
  # asserts it is compiled as C++17: the subproject's own cpp_std=c++20 must not leak.
  meson setup "$project/build" "$project" "${quick[@]}" --force-fallback-for=weightmap
  meson compile -C "$project/build" meson_consumer
  "$project/build/meson_consumer"
}

exported() { nm -D --defined-only "$1" | awk '$2 != "A" { print $3 }' | LC_ALL=C sort -u; }

minimal() {
  local dir=$tmp/minimal-build
  # auto_features: every importer's feature option at once, however many there are.
  meson setup "$dir" "$root" "${quick[@]}" -Dauto_features=disabled -Dtests=false
  meson compile -C "$dir" weightmap
  # The stubs keep the ABI: the same exported symbols as BUILD_DIR's library with its backends.
  exported "$build/libweightmap.so" > "$tmp/full.symbols"
  exported "$dir/libweightmap.so" > "$tmp/minimal.symbols"
  [[ -s $tmp/full.symbols ]]
  diff "$tmp/full.symbols" "$tmp/minimal.symbols"
  g++ -std=c++17 -Wall -Wextra -Wpedantic -Werror -I"$root/include" -I"$dir/include" \
    "$here/minimal/stubs.cpp" -L"$dir" -lweightmap -Wl,-rpath,"$dir" -o "$tmp/stubs"
  "$tmp/stubs"
}

# Runs the function NAME in a subshell with `set -e`, logging to $tmp/NAME.log, and sets
# `status`; prints the log's tail on failure. Called as a plain command, never under `if` or
# `||`: bash ignores `set -e` in everything such a condition calls, subshells included.
run_logged() {
  set +e
  (set -e; "$1") > "$tmp/$1.log" 2>&1
  status=$?
  set -e
  if ((status != 0)); then tail -n 40 "$tmp/$1.log" | sed 's/^/  | /'; fi
}

report() {
  run_logged "$1"
  if ((status == 0)); then
    echo "consumer $1: PASS"
    passed=$((passed + 1))
  else
    echo "consumer $1: FAIL"
    failed=$((failed + 1))
  fi
}

prefix=$(option prefix 2> /dev/null || true)
libdir=$(option libdir 2> /dev/null || true)
[[ $libdir == /* ]] || libdir=$prefix/$libdir
installed=
for name in ${CONSUMERS:-c_pkgconfig cpp17_cmake meson_subproject minimal}; do
  case $name in
    c_pkgconfig | cpp17_cmake)
      if [[ -z $installed ]]; then
        run_logged install_prefix
        installed=$((status == 0 ? 1 : 0))
      fi
      if ((installed == 0)); then
        echo "meson install -C $build failed: no installed prefix to consume"
        echo "consumer $name: FAIL"
        failed=$((failed + 1))
        continue
      fi ;;
    meson_subproject | minimal) ;;
    *) echo "unknown consumer '$name'" >&2; exit 2 ;;
  esac
  report "$name"
done

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
