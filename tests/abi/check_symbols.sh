#!/usr/bin/env bash
# Fails when the shared library's exported symbols differ from abi/symbols.txt, or when anything
# that is not ours is exported (wm::internal, fmt, the C++ standard library, the test-data
# writers). After an intended ABI change: ABI_UPDATE=1 check_symbols.sh LIB FILE rewrites FILE
# (then bump the soversion if a symbol was removed or changed; README "ABI and versions").
#   check_symbols.sh LIBRARY SYMBOLS_FILE
set -euo pipefail
lib=$1 expected=$2
actual=$(nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }' | c++filt | LC_ALL=C sort -u)
forbidden=$(grep -E 'wm::internal|fmt::|^std::|^(void|bool|int) std::|gguf_writer|safetensors_writer|synthetic' \
              <<< "$actual" || true)
if [[ -n $forbidden ]]; then
  echo "exported but not part of the API:"; echo "$forbidden"; exit 1
fi
if [[ ${ABI_UPDATE:-0} == 1 ]]; then
  printf '%s\n' "$actual" > "$expected"
  echo "wrote $(wc -l < "$expected") symbols to $expected"; exit 0
fi
if ! diff -u "$expected" - <<< "$actual"; then
  echo "the exported symbols changed (- expected, + exported): update $expected with ABI_UPDATE=1"
  exit 1
fi
echo "$(wc -l <<< "$actual") exported symbols match $expected"
