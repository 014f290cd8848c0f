#!/usr/bin/env bash
# llama.cpp loads its weights through libweightmap, on lavapipe, in both arms.
#
# Gets llama.cpp (fetch.sh: node-llama-cpp's bundle, pinned and checked, our patches applied),
# builds it against the *installed* libweightmap (pkg-config, from a `meson install --destdir`
# of LIBWM_BUILD), generates random-weight models with llama.cpp's own test-llama-archs, and runs
# greedy generation on lavapipe for each case twice: the import arm (default) and the copy arm
# (WEIGHTMAP_IMPORT=0, every weight copied into a device buffer as upstream does). Prints a
# table and one summary line per case, and exits non-zero when the arms' tokens differ, when the
# import arm copies more than 1 % of the device bytes, or when a corrupt model crashes it.
#
# Then the scheduler (patch 0007, GGML_WEIGHTMAP_SPLIT_SYNC): generation with CPU + Vulkan splits
# once under the split-ordering helper and once under the upstream rule (WEIGHTMAP_SPLIT_SYNC=
# upstream), the split descriptions traced and replayed in libweightmap's simulator
# (bench_split_sync --replay); non-zero exit when the rules' tokens differ, or the helper's
# replay shows a hazard or syncs more than upstream.
#
# Usage: integrations/llama.cpp/run.sh [LIBWM_BUILD [OUT]]
#        defaults: LIBWM_BUILD=build (configured and built here when missing), OUT=build-llama
# Env:   JOBS (default nproc), N_PREDICT (default 32). Everything is written under OUT, the Mesa
#        shader cache included (nothing is cached outside the build directory).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
libwm_build=$(realpath -m "${1:-$root/build}")
out=$(realpath -m "${2:-$root/build-llama}")
n_predict=${N_PREDICT:-32}
mkdir -p "$out/logs" "$out/models" "$out/run"

# --- libweightmap, installed into a private prefix --------------------------------------------
if [[ ! -f $libwm_build/build.ninja ]]; then
  meson setup "$libwm_build" "$root" --buildtype=release -Dvulkan=enabled -Dhsa=enabled \
    --wrap-mode=nodownload > "$out/logs/libwm-setup.log"
fi
ninja -C "$libwm_build" > "$out/logs/libwm-build.log"
dest=$out/weightmap-prefix
rm -rf "$dest"
meson install -C "$libwm_build" --destdir "$dest" --quiet --no-rebuild
pc=$(find "$dest" -name weightmap.pc | head -n 1)
[[ -n $pc ]] || { echo "run.sh: no weightmap.pc under $dest" >&2; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$dest
export LD_LIBRARY_PATH=$(dirname "$(dirname "$pc")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} # .../lib/<triplet>

# --- llama.cpp ----------------------------------------------------------------------------------
bash "$here/fetch.sh" "$out/src" > "$out/logs/fetch.log" 2>&1 ||
  { tail -n 20 "$out/logs/fetch.log" >&2; exit 1; }
CMAKE_EXTRA_ARGS="-DLLAMA_WEIGHTMAP=ON -DGGML_WEIGHTMAP_SPLIT_SYNC=ON" TARGETS="llama-completion test-llama-archs" \
  bash "$here/build.sh" "$out/src" "$out/build" > "$out/logs/llama-build.log" 2>&1 ||
  { tail -n 30 "$out/logs/llama-build.log" >&2; exit 1; }
bin=$out/build/bin
# The library llama-completion runs with must be the one just installed.
ldd "$bin/llama-completion" | grep -q "$dest.*libweightmap" ||
  { echo "run.sh: llama-completion does not load libweightmap from $dest" >&2; exit 1; }

# --- models: llama.cpp's own generator --------------------------------------------------------
# stdev 1.0: the generator's default 0.1 makes greedy output one repeated token, which would
# hide wrong weights.
"$bin/test-llama-archs" -a llama -s 42 -d 1.0 -o "$out/models" > "$out/logs/models.log" 2>&1
mkdir -p "$out/models/big"
LLAMA_ARCHS_N_EMBD=1024 LLAMA_ARCHS_N_HEAD=8 LLAMA_ARCHS_N_FF=2816 LLAMA_ARCHS_N_LAYER=6 \
  "$bin/test-llama-archs" -a llama -s 42 -d 1.0 -o "$out/models/big" >> "$out/logs/models.log" 2>&1

# --- generation on lavapipe -------------------------------------------------------------------
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} # ggml skips CPU-type devices otherwise
export MESA_SHADER_CACHE_DIR=$out/mesa-shader-cache
# -v: llama.cpp's own INFO lines (the weightmap totals) reach stderr; -fit off: no second,
# allocation-free load pass; -lm mmap: the mapping is what libweightmap imports
common=(-p "hello world" -n "$n_predict" --temp 0 -s 42 -no-cnv -t 2 --no-display-prompt -fit off -lm mmap -v)

# field NAME of the weightmap log line in FILE (a number)
wm_field() {
  local line
  line=$(grep -m1 'weightmap: device' "$2") || { echo nan; return; }
  case $1 in
    device) sed -E 's/.*weightmap: device ([0-9.]+) MiB.*/\1/' <<< "$line" ;;
    imported) sed -E 's/.*imported ([0-9.]+) MiB.*/\1/' <<< "$line" ;;
    imports) sed -E 's/.* in ([0-9]+) imports.*/\1/' <<< "$line" ;;
    pinned) sed -E 's/.*pinned ([0-9.]+) MiB.*/\1/' <<< "$line" ;;
    fallback) sed -E 's/.*fallback ([0-9.]+) MiB.*/\1/' <<< "$line" ;;
    rss) sed -E 's/.*rss_anon_delta (-?[0-9.]+) MiB.*/\1/' <<< "$line" ;;
  esac
}
load_seconds() { sed -nE 's/.*load time = +([0-9.]+) ms.*/\1/p' "$1" | tail -n 1 | awk '{printf "%.3f", $1 / 1000}'; }

# One unmeasured run compiles lavapipe's shaders into the cache (18.9 s on a fresh machine,
# which would otherwise land in the first case's load time).
"$bin/llama-completion" -m "$out/models/llama-dense.gguf" "${common[@]}" -ngl 99 -n 1 \
  > "$out/logs/warm-up.out" 2> "$out/logs/warm-up.err" < /dev/null || true

status=0
summaries=()
# case name | model | extra flags
cases=(
  "dense|$out/models/llama-dense.gguf|-ngl 99"
  "moe-experts-on-cpu|$out/models/llama-moe.gguf|-ngl 99 -ot exps=CPU"
  "dense-big|$out/models/big/llama-dense.gguf|-ngl 99"
  "moe-big-experts-on-cpu|$out/models/big/llama-moe.gguf|-ngl 99 -ot exps=CPU"
)
printf '%-24s %-6s %10s %10s %7s %10s %10s %10s %8s\n' case arm device_MiB import_MiB imports pinned_MiB fallback rss_anon load_s
for c in "${cases[@]}"; do
  IFS='|' read -r name model extra <<< "$c"
  for arm in import copy; do
    log=$out/run/$name.$arm
    env_arm=()
    [[ $arm == copy ]] && env_arm=(WEIGHTMAP_IMPORT=0)
    # shellcheck disable=SC2086
    if ! env "${env_arm[@]}" "$bin/llama-completion" -m "$model" "${common[@]}" $extra \
        > "$log.out" 2> "$log.err" < /dev/null; then
      echo "run.sh: $name ($arm arm) failed; see $log.err" >&2
      tail -n 5 "$log.err" >&2
      status=1
    fi
    printf '%-24s %-6s %10s %10s %7s %10s %10s %10s %8s\n' "$name" "$arm" "$(wm_field device "$log.err")" \
      "$(wm_field imported "$log.err")" "$(wm_field imports "$log.err")" "$(wm_field pinned "$log.err")" \
      "$(wm_field fallback "$log.err")" "$(wm_field rss "$log.err")" "$(load_seconds "$log.err")"
  done
  i=$out/run/$name.import
  k=$out/run/$name.copy
  same=no
  cmp -s "$i.out" "$k.out" && [[ -s $i.out ]] && same=yes
  device=$(wm_field device "$i.err")
  fraction=$(awk -v a="$(wm_field imported "$i.err")" -v d="$device" 'BEGIN { printf "%.4f", (d > 0 ? a / d : 0) }')
  summaries+=("llama.cpp case=$name tokens_identical=$same device_mib=$device imported_fraction=$fraction import_rss_anon_delta_mib=$(wm_field rss "$i.err") copy_rss_anon_delta_mib=$(wm_field rss "$k.err") load_s_import=$(load_seconds "$i.err") load_s_copy=$(load_seconds "$k.err")")
  [[ $same == yes ]] || { echo "run.sh: $name: the arms generated different tokens" >&2; status=1; }
  awk -v f="$fraction" 'BEGIN { exit !(f >= 0.99) }' ||
    { echo "run.sh: $name: the import arm copies more than 1 % of the device bytes" >&2; status=1; }
done

# --- an importer refusal falls back with a log line; the tokens stay the same ------------------
refused=$out/run/moe-refused.import
LLAMA_WEIGHTMAP_TEST_REFUSE_IMPORT=2 "$bin/llama-completion" -m "$out/models/llama-moe.gguf" \
  "${common[@]}" -ngl 99 -ot exps=CPU > "$refused.out" 2> "$refused.err" < /dev/null || status=1
refusal=$(grep -m1 'falling back to a device copy' "$refused.err" || true)
if [[ -z $refusal ]] || ! cmp -s "$refused.out" "$out/run/moe-experts-on-cpu.copy.out"; then
  echo "run.sh: a refused import did not fall back cleanly (log: ${refusal:-none})" >&2
  status=1
fi
echo "refused import: ${refusal#*llama_weightmap: }"
echo "  then: $(grep -m1 'weightmap: device' "$refused.err" | sed 's/.*weightmap: //')"

# --- a corrupt model fails cleanly in both arms (an error, never a signal) --------------------
bad=$out/models/truncated.gguf
head -c 100000 "$out/models/llama-dense.gguf" > "$bad"
for arm in import copy; do
  env_arm=()
  [[ $arm == copy ]] && env_arm=(WEIGHTMAP_IMPORT=0)
  rc=0
  env "${env_arm[@]}" "$bin/llama-completion" -m "$bad" "${common[@]}" -ngl 99 \
    > "$out/run/truncated.$arm.out" 2> "$out/run/truncated.$arm.err" < /dev/null || rc=$?
  if ((rc == 0 || rc >= 128)); then
    echo "run.sh: a truncated model ended with status $rc in the $arm arm (expected an error)" >&2
    status=1
  fi
  echo "corrupt model ($arm arm): exit $rc, $(grep -m1 -iE 'error|failed' "$out/run/truncated.$arm.err" || echo 'no message')"
done

# --- the scheduler's split ordering: helper vs upstream, traced and replayed ------------------
replay_bin=$libwm_build/bench/bench_split_sync
# field NAME=value of a line
field() { sed -nE "s/.*[ ]$1=([0-9]+).*/\1/p" <<< "$2"; }
printf '\n%-20s %-9s %7s %7s %6s %6s %15s %15s\n' case rule graphs splits syncs drains replay_hazards replay_syncs
for c in "dense-partial|$out/models/llama-dense.gguf|-ngl 1" \
         "moe-experts-on-cpu|$out/models/llama-moe.gguf|-ngl 99 -ot exps=CPU"; do
  IFS='|' read -r name model extra <<< "$c"
  declare -A syncs=() hazards=()
  for rule in helper upstream; do
    log=$out/run/split-$name.$rule
    rm -f "$log.trace"
    # shellcheck disable=SC2086
    WEIGHTMAP_SPLIT_SYNC=$rule WEIGHTMAP_SPLIT_SYNC_STATS=1 WEIGHTMAP_SPLIT_SYNC_TRACE=$log.trace \
      "$bin/llama-completion" -m "$model" "${common[@]}" $extra > "$log.out" 2> "$log.err" < /dev/null ||
      { echo "run.sh: split-sync $name ($rule) failed; see $log.err" >&2; status=1; }
    stats=$(grep -m1 '^split_sync: rule=' "$log.err" || true)
    "$replay_bin" --replay "$log.trace" > "$log.replay" 2>&1 || true
    replayed=$(grep "^replay rule=$rule " "$log.replay" || true)
    syncs[$rule]=$(field "syncs_$rule" "$stats")
    hazards[$rule]=$(field hazards "$replayed")
    printf '%-20s %-9s %7s %7s %6s %6s %15s %15s\n' "$name" "$rule" "$(field graphs "$stats")" \
      "$(field splits "$stats")" "${syncs[$rule]:-?}" "$(field drains "$stats")" "${hazards[$rule]:-?}" \
      "$(field syncs "$replayed")"
  done
  same=no
  cmp -s "$out/run/split-$name.helper.out" "$out/run/split-$name.upstream.out" &&
    [[ -s $out/run/split-$name.helper.out ]] && same=yes
  splits=$(field splits "$(grep -m1 '^split_sync: rule=' "$out/run/split-$name.helper.err" || true)")
  summaries+=("split_sync case=$name splits=${splits:-?} syncs_upstream=${syncs[upstream]:-?} syncs_helper=${syncs[helper]:-?} tokens_identical=$same replay_hazards_upstream=${hazards[upstream]:-?} replay_hazards_helper=${hazards[helper]:-?}")
  [[ $same == yes ]] || { echo "run.sh: split-sync $name: the rules generated different tokens" >&2; status=1; }
  [[ ${hazards[helper]:-x} == 0 ]] || { echo "run.sh: split-sync $name: the helper's replay shows hazards" >&2; status=1; }
  [[ -n ${syncs[helper]:-} && -n ${syncs[upstream]:-} ]] && ((syncs[helper] <= syncs[upstream])) ||
    { echo "run.sh: split-sync $name: the helper synced more than upstream" >&2; status=1; }
  unset syncs hazards
done

echo
printf '%s\n' "${summaries[@]}"
exit "$status"
