#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and runs each for a
# bounded time over its checked-in corpus (tests/fuzz/corpus/<name>/, read-only; new inputs go to
# build-fuzz/fuzz-corpus/<name>/). Fails on the first crash, leak, UB report or timeout, and
# leaves the input in build-fuzz/fuzz-artifacts/.
# Usage: scripts/fuzz.sh [SECONDS per target, default 60]     (FUZZ_BUILD_DIR overrides build-fuzz)
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${FUZZ_BUILD_DIR:-build-fuzz}
targets=(fuzz_gguf fuzz_safetensors fuzz_split_sync fuzz_planner)

if [[ ! -f "$build/build.ninja" ]]; then
  CC=clang CXX=clang++ meson setup "$build" --wrap-mode=nodownload \
    -Dfuzz=enabled -Dtests=false -Dvulkan=disabled -Dhsa=disabled
fi
ninja -C "$build" -j 2 "${targets[@]/#/tests/fuzz/}"

mkdir -p "$build/fuzz-artifacts"
for target in "${targets[@]}"; do
  name=${target#fuzz_}
  work="$build/fuzz-corpus/$name"
  mkdir -p "$work"
  dirs=("$work")
  [[ -d "tests/fuzz/corpus/$name" ]] && dirs+=("tests/fuzz/corpus/$name")
  log="$build/$target.log"
  echo "== $target: ${seconds}s over ${dirs[*]}"
  if ! "$build/tests/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$target-" "${dirs[@]}" \
       > "$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz.sh: $target FAILED; the input is in $build/fuzz-artifacts/, the log in $log" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^Done [0-9]+ runs" "$log" || true
done
echo "fuzz.sh: no crash in ${#targets[@]} targets x ${seconds}s"
