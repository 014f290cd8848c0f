#!/usr/bin/env bash
# Compiles every installed public header alone, in every language mode engines use, so a C++20-only
# construct (or a missing include) in a header fails CI: llama.cpp and ggml build as C++17.
#   check_headers.sh SOURCE_INCLUDE BUILD_INCLUDE
# C++ headers (*.hpp): g++ and clang++, -std=c++17 and -std=c++20. C headers (*.h): gcc and clang
# as -std=c99 and -std=c11, and g++ as -std=c++17 (a C++ engine includes the C API too).
# Every mode uses -Wall -Wextra -Wpedantic -Werror. Prints each failure and a matrix count.
set -uo pipefail
src=$1 bld=$2
list=$(mktemp)
trap 'rm -f "$list"' EXIT
headers=$( (cd "$src" && find weightmap -name '*.h' -o -name '*.hpp'
            cd "$bld" && find weightmap -name '*.h' -o -name '*.hpp' 2>/dev/null) | sort -u)
for header in $headers; do
  case $header in
    *.hpp) for cxx in g++ clang++; do for std in c++17 c++20; do
             echo "$cxx $std c++ $header"; done; done ;;
    *.h)   for cc in gcc clang; do for std in c99 c11; do echo "$cc $std c $header"; done; done
           echo "g++ c++17 c++ $header" ;;
  esac
done > "$list"

# One compilation: prints PASS or FAIL with the compiler's output.
compile_one() {
  local out
  # The typedef keeps a macro-only header from being an (ISO-forbidden) empty translation unit.
  if out=$(printf '#include <%s>\ntypedef int wm_header_check;\n' "$4" | "$1" -std="$2" -x "$3" -Wall -Wextra -Wpedantic \
             -Werror -fsyntax-only -I"$SRC" -I"$BLD" - 2>&1); then
    echo "PASS $1 -std=$2 $4"
  else
    printf 'FAIL %s -std=%s %s\n%s\n' "$1" "$2" "$4" "$out"
  fi
}
export -f compile_one
export SRC=$src BLD=$bld
results=$(xargs -P "$(nproc)" -L 1 bash -c 'compile_one "$@"' _ < "$list")
grep -v '^PASS' <<< "$results"
total=$(wc -l < "$list")
failed=$(grep -c '^FAIL' <<< "$results")
echo "headers: $(wc -w <<< "$headers"), compilations: $total, failed: $failed"
[[ $total -gt 0 && $failed -eq 0 ]]
