#!/usr/bin/env bash
# llama.cpp speed and memory, import vs copy vs upstream's iGPU default, repeated and alternated.
#
# Usage: bench/llama_ab.sh MODEL [REPS] [warm|cold]
#   MODEL  a GGUF file; REPS (default 5) repetitions of every arm, alternated (the order rotates
#          each repetition so no arm always runs first after another); warm (default) or cold:
#          cold evicts MODEL from the page cache before every run (dd iflag=nocache count=0,
#          i.e. posix_fadvise DONTNEED on the whole file).
# Env:   OUT (default build-llama: the tree integrations/llama.cpp/run.sh builds), BIN (default
#        OUT/build/bin), EXTRA (flags for every arm, e.g. "-ot exps=CPU"), ARMS (default
#        "import copy upstream"; import-nopopulate may be added), CASE (the summary line's case
#        name; default the model's file name).
# Arms:  import   the default (libweightmap imports what the device can read in place)
#        copy     LLAMA_WEIGHTMAP_IMPORT=0 (upstream's loader; AUTO load mode)
#        upstream LLAMA_WEIGHTMAP_IMPORT=0 -lm none (upstream's default on an iGPU: no mmap,
#                 a read into device memory)
#        import-nopopulate  import without populating first (the first graph faults the imported
#                 pages in; what populate changes): the LLAMA_WEIGHTMAP_TESTING build run.sh
#                 copies to OUT/testing, with its hook LLAMA_WEIGHTMAP_TEST_NO_POPULATE=1
# Prints one row per arm and metric: the median and the spread (min..max) over REPS, and the
# ratio of each arm's median to the import arm's; then the summary line
#   llama.cpp speed case=... cache=... runs=... load_ratio_vs_upstream=... ttft_ratio_vs_upstream=...
#     pp_ratio_vs_copy=... tg_ratio_vs_copy=... tokens_identical=yes|no
# (ratios of medians, import over the other arm). TTFT is load time + prompt evaluation, both as
# llama.cpp reports them; peak RSS includes file pages (the page cache mapped by the process);
# minflt counts the whole run's minor faults. Exits non-zero when a run fails or the arms'
# greedy tokens differ.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
model=${1:?usage: bench/llama_ab.sh MODEL [REPS] [warm|cold]}
reps=${2:-5}
cache=${3:-warm}
out=$(realpath -m "${OUT:-$root/build-llama}")
bin=${BIN:-$out/build/bin}
lib=$(find "$out/weightmap-prefix" -name 'libweightmap.so*' -print -quit 2> /dev/null || true)
[[ -x $bin/llama-completion && -n $lib ]] ||
  { echo "llama_ab.sh: run integrations/llama.cpp/run.sh first (no $bin/llama-completion or libweightmap)" >&2; exit 1; }
export LD_LIBRARY_PATH=$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} MESA_SHADER_CACHE_DIR=$out/mesa-shader-cache
read -r -a extra <<< "${EXTRA:-}"
prompt=$(printf 'hello world %.0s' $(seq 80)) # >= 128 prompt tokens with the generator's tokenizer
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT

arm_env() {
  case $1 in
    import) echo LLAMA_WEIGHTMAP_IMPORT=1 ;;
    import-nopopulate) echo LLAMA_WEIGHTMAP_TEST_NO_POPULATE=1 ;;
    *) echo LLAMA_WEIGHTMAP_IMPORT=0 ;;
  esac
}
arm_flags() { [[ $1 == upstream ]] && echo "-lm none" || true; }
# The binary directory of ARM: the test build for the arm that needs its hook.
arm_bin() { [[ $1 == import-nopopulate ]] && echo "$out/testing" || echo "$bin"; }

# One run: appends "load_s ttft_s pp_tps tg_tps peak_mib minflt" to runs/ARM.
measure() { # ARM REP
  local arm=$1 log=$runs/$1.$2 flags
  read -r -a flags <<< "$(arm_flags "$arm")"
  [[ $cache == cold ]] && dd if="$model" iflag=nocache count=0 status=none
  env "$(arm_env "$arm")" LD_LIBRARY_PATH="$(arm_bin "$arm"):$LD_LIBRARY_PATH" \
    /usr/bin/time -f '%M %R' -o "$log.rss" "$(arm_bin "$arm")/llama-completion" -m "$model" \
    -p "$prompt" -n 64 --temp 0 -s 42 -no-cnv -t 2 --no-display-prompt "${flags[@]}" "${extra[@]}" \
    > "$log.out" 2> "$log.err" < /dev/null || { echo "llama_ab.sh: $arm failed; see $log.err" >&2; exit 1; }
  awk -v rss="$(tail -n 1 "$log.rss" | cut -d' ' -f1)" -v minflt="$(tail -n 1 "$log.rss" | cut -d' ' -f2)" '
    /load time =/ { load = $(NF - 1) }
    /prompt eval time =/ { for (i = 1; i < NF; i++) if ($(i + 1) == "ms") { pp_ms = $i; break }
                           match($0, /[0-9.]+ tokens per second/); pp = substr($0, RSTART, RLENGTH) + 0
                           for (i = 1; i < NF; i++) if ($i == "/") n_prompt = $(i + 1) }
    / eval time =/ && !/prompt/ { match($0, /[0-9.]+ tokens per second/); tg = substr($0, RSTART, RLENGTH) + 0 }
    END { if (n_prompt < 128) { print "prompt of " n_prompt " tokens < 128" > "/dev/stderr"; exit 1 }
          printf "%.3f %.3f %.2f %.2f %d %d\n", load / 1000, (load + pp_ms) / 1000, pp, tg, rss / 1024, minflt }' \
    "$log.err" >> "$runs/$arm"
}

read -r -a arms <<< "${ARMS:-import copy upstream}"
[[ ${arms[0]} == import ]] || { echo "llama_ab.sh: ARMS must start with import (the ratios' base)" >&2; exit 1; }
# one unmeasured run: lavapipe compiles each new kernel once into the shader cache (a prompt
# batch needs others than the token loop), which would land in whichever arm runs first
measure import warm-up && : > "$runs/import"
for ((r = 0; r < reps; r++)); do
  for ((j = 0; j < ${#arms[@]}; j++)); do measure "${arms[(r + j) % ${#arms[@]}]}" "$r"; done
done

# median and spread of column C of runs/ARM
stat() { sort -g -k "$2,$2" "$runs/$1" | awk -v c="$2" '{ v[NR] = $c } END {
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%s %s %s", m, v[1], v[NR] }'; }
echo "llama_ab: $(basename "$model"), $reps alternated repetitions per arm, $cache cache, flags: ${EXTRA:-none}"
printf '%-12s %-9s %10s %21s %14s\n' metric arm median 'spread (min..max)' 'ratio to import'
metrics=(load_s ttft_s pp_tps tg_tps peak_rss_mib minflt)
for c in 1 2 3 4 5 6; do
  read -r base _ _ <<< "$(stat import "$c")"
  for arm in "${arms[@]}"; do
    read -r med lo hi <<< "$(stat "$arm" "$c")"
    printf '%-12s %-9s %10s %21s %14s\n' "${metrics[c - 1]}" "$arm" "$med" "$lo..$hi" \
      "$(awk -v a="$med" -v b="$base" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')"
  done
done

# ratio of the import arm's median of column C to ARM's
ratio() { awk -v a="$(stat import "$2" | cut -d' ' -f1)" -v b="$(stat "$1" "$2" | cut -d' ' -f1)" \
  'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }'; }
same=yes
for f in "$runs"/*.out; do cmp -s "$f" "$runs/import.0.out" || same=no; done
[[ -s $runs/import.0.out ]] || same=no
echo "llama.cpp speed case=${CASE:-$(basename "$model" .gguf)} cache=$cache runs=$reps load_ratio_vs_upstream=$(ratio upstream 1) ttft_ratio_vs_upstream=$(ratio upstream 2) pp_ratio_vs_copy=$(ratio copy 3) tg_ratio_vs_copy=$(ratio copy 4) tokens_identical=$same"
[[ $same == yes ]] || { echo "llama_ab.sh: the arms generated different tokens" >&2; exit 1; }
