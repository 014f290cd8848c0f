#!/usr/bin/env bash
# llama.cpp loads its weights through libweightmap, on lavapipe: real sizes, quantized weights,
# several architectures, llama.cpp's default flags, and never worse than upstream.
#
# Gets llama.cpp (fetch.sh: node-llama-cpp's bundle, pinned and checked, our patches applied) and
# builds it four times, sharing one compiler cache: a pristine upstream (the pinned commit with
# 0001-0004, build fixes only), and the series without LLAMA_WEIGHTMAP (stock), with it and its
# test hooks and ggml-vulkan's (testing: only the cases that need a hook run it), and with it (release), against the
# *installed* libweightmap. Checks the boundaries: no ggml library of any build lists libweightmap
# as NEEDED, the stock libllama neither, and libllama uses only libweightmap's C API (a library
# built to break both rules must fail the check). Generates models with llama.cpp's own
# test-llama-archs (llama-quantize, llama-gguf-split), then runs greedy generation with default
# flags (AUTO load mode, -fit on) for each case: import (default) against copy
# (LLAMA_WEIGHTMAP_IMPORT=0) and, where -fit placed fewer layers in the copy arm, copy with the
# import arm's -ngl (the token comparison); every import refused (test hook) and --no-mmap / -lm dio
# against the pristine upstream build; the driver's own refusal (ggml-vulkan's buffer limit). The
# stock build against the pristine one: load mode, buffer lines, tokens, peak RSS within 1 %.
# Single checks, each a "llama.cpp case=NAME kind=check" line: --check-tensors on a NaN in a
# tensor the run reports imported, the file truncated inside an import after planning, load /
# free / load in one process, llama-bench's own fit after a refusal.
#
# Then the scheduler (patches 0010 and 0011: ggml's sync hook, libllama's helper): generation with
# CPU + Vulkan splits under the split-ordering helper and under the upstream rule, traced and
# replayed in libweightmap's simulator (bench_split_sync --replay), and split_sync_check.cpp on the
# real scheduler. Then llama-server on the big model in each arm, three processes at once (memory
# summed, one exits); a model file overwritten or truncated under a running server in each arm
# (with and without a lease); and bench/llama_ab.sh's speed table.
#
# Usage: integrations/llama.cpp/run.sh [LIBWM_BUILD [OUT]]
#        defaults: LIBWM_BUILD=build (configured and built here when missing), OUT=build-llama
# Env:   JOBS (default nproc), N_PREDICT (default 32), CASES (space-separated case names; default
#        all), SERVER_N_PREDICT (tokens per server request, default 4), BENCH_MODEL, BENCH_REPS
#        (see the bench below). Everything is written under OUT, the Mesa shader cache and the
#        compiler cache (OUT/ccache) included.
# Exit:  non-zero when any case or check fails: arms that generate different tokens, a case that
#        should import imports < 99 % of its device bytes, refused-all above upstream's peak RSS by
#        > 5 %, stock not matching upstream, a boundary broken, the big model not offloaded whole
#        in the import arm, a refused import not falling back alone, --check-tensors passing a
#        corrupt imported tensor, a corrupt or truncated model crashing, a reload leaving a mapping
#        or memory behind, the scheduler checks, servers answering differently, crashing or not
#        shutting down cleanly, three importing servers saving < 98 % of 3x the device bytes of
#        RssAnon or re-reading the model when one exits, or the bench failing or its arms' tokens
#        differing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
libwm_build=$(realpath -m "${1:-$root/build}")
out=$(realpath -m "${2:-$root/build-llama}")
n_predict=${N_PREDICT:-32}
mkdir -p "$out/logs" "$out/models" "$out/run"
source "$here/lib.sh"
# "phase NAME: N s" lines: where the stage's time goes (CI has 60 minutes for everything)
phase_start=$SECONDS
phase() { echo "phase $1: $((SECONDS - phase_start)) s" >> "$out/logs/phase-times.log"; phase_start=$SECONDS; }
: > "$out/logs/phase-times.log"

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

# --- llama.cpp: upstream, stock, testing and release, sharing one compiler cache ---------------
# upstream: the pinned commit with 0001-0004 alone (build fixes for Debian's toolchain and the
# test harness: what a user of upstream builds), in its own worktree. The series: without
# LLAMA_WEIGHTMAP (stock), with it and its test hooks (testing), and with it (the release build
# every case runs unless it needs a hook), from one build directory; switching the options
# rebuilds only the files that define LLAMA_USE_WEIGHTMAP or LLAMA_WEIGHTMAP_TESTING. stock and
# testing are copied out and run with LD_LIBRARY_PATH, which the build's RUNPATH yields to.
# ccache under OUT, the worktrees at the same depth (OUT/src, OUT/pristine/src) and
# CCACHE_BASEDIR=OUT: the upstream tree's objects that the series does not change are cache hits.
bash "$here/fetch.sh" "$out/src" > "$out/logs/fetch.log" 2>&1 ||
  { tail -n 20 "$out/logs/fetch.log" >&2; exit 1; }
n_patches=$(find "$here/patches" -name '*.patch' | wc -l)
pristine=$(git -C "$out/src" rev-parse "HEAD~$((n_patches - 4))")
if [[ $(git -C "$out/pristine/src" rev-parse HEAD 2> /dev/null) != "$pristine" ]]; then
  rm -rf "$out/pristine/src"; git -C "$out/src" worktree prune
  git -C "$out/src" worktree add -f --detach "$out/pristine/src" "$pristine" > /dev/null 2>&1
fi
launcher=()
if command -v ccache > /dev/null; then
  export CCACHE_DIR=$out/ccache CCACHE_BASEDIR=$out CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=4G
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# GGML_RPC: ggml-rpc-server on loopback is a third ggml backend in the scheduler checks.
build_llama() { # SRC BUILD OPTIONS TARGETS
  local start=$SECONDS
  CMAKE_EXTRA_ARGS="${launcher[*]} -DGGML_RPC=ON $3" TARGETS="$4" \
    bash "$here/build.sh" "$1" "$2" >> "$out/logs/llama-build.log" 2>&1 ||
    { tail -n 30 "$out/logs/llama-build.log" >&2; exit 1; }
  echo "build $(basename "$(dirname "$2")")/$(basename "$2") [$3]: $((SECONDS - start)) s" >> "$out/logs/build-times.log"
}
copy_out() { # DIR [PROGRAM...]: the build's llama-completion and libraries, and PROGRAMs
  local dir=$1 p; shift
  rm -rf "$dir" && mkdir -p "$dir" && cp -a "$bin/llama-completion" "$bin"/lib*.so* "$dir/"
  for p; do cp -a "$bin/$p" "$dir/"; done
}
bin=$out/build/bin
upstream_bin=$out/pristine/build/bin
: > "$out/logs/llama-build.log"
: > "$out/logs/build-times.log"
build_llama "$out/pristine/src" "$out/pristine/build" "" llama-completion
build_llama "$out/src" "$out/build" "-DLLAMA_WEIGHTMAP=OFF -DLLAMA_WEIGHTMAP_TESTING=OFF -DGGML_VULKAN_TESTING=OFF" llama-completion
copy_out "$out/stock"
# llama-server for the file-change cases that need the move's test hooks (slow-move, move-fails)
build_llama "$out/src" "$out/build" "-DLLAMA_WEIGHTMAP=ON -DLLAMA_WEIGHTMAP_TESTING=ON -DGGML_VULKAN_TESTING=ON" \
  "llama-completion llama-bench llama-server"
copy_out "$out/testing" llama-bench llama-server
build_llama "$out/src" "$out/build" "-DLLAMA_WEIGHTMAP=ON -DLLAMA_WEIGHTMAP_TESTING=OFF -DGGML_VULKAN_TESTING=OFF" \
  "llama-completion test-llama-archs llama-quantize llama-server ggml-rpc-server llama-gguf-split llama-perplexity"
cat "$out/logs/build-times.log"
# The library llama-completion runs with must be the one just installed
ldd "$bin/llama-completion" | grep -q "$dest.*libweightmap" ||
  { echo "run.sh: llama-completion does not load libweightmap from $dest" >&2; exit 1; }
check_boundaries "$out/stock" "$bin" "$out/testing" || exit 1
phase builds

# --- models: llama.cpp's own generator, and its quantizer -------------------------------------
# stdev 1.0: the generator's default 0.1 makes greedy output one repeated token, which would
# hide wrong weights.
make_models "$bin" "$out/models" > "$out/logs/models.log" 2>&1 ||
  { tail -n 20 "$out/logs/models.log" >&2; exit 1; }
phase models

# --- generation on lavapipe -------------------------------------------------------------------
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0} # ggml skips CPU-type devices otherwise
export MESA_SHADER_CACHE_DIR=$out/mesa-shader-cache
# -v: llama.cpp's own INFO lines (the weightmap totals, the layer count) reach stderr. Nothing
# else: default load mode (AUTO) and -fit on, as a user runs it.
common=(-p "hello world" -n "$n_predict" --temp 0 -s 42 -no-cnv -t 2 --no-display-prompt -v)

status=0
summaries=()
fail() { echo "run.sh: $*" >&2; status=1; }

# case | model | extra flags | kind (import: must import >= 99 %; refused: every import refused;
# fit-refused: every import refused after -fit counted it; two-devices: Vulkan imports, the CPU of
# a ggml-rpc-server on loopback copies)
m=$out/models
rpc=127.0.0.1:${RPC_PORT:-50917}
all_cases=(
  "dense|$m/llama-dense.gguf||import"
  "moe-experts-on-cpu|$m/llama-moe.gguf|-ot exps=CPU|import"
  "dense-big|$m/big/llama-dense.gguf||import"
  "moe-big-experts-on-cpu|$m/big/llama-moe.gguf|-ot exps=CPU|import"
  "dense-q4_k|$m/q4/llama-dense-q4_k_m.gguf||import"
  "moe-q4_0-experts-on-cpu|$m/q4/llama-moe-q4_0.gguf|-ot exps=CPU|import"
  "qwen3moe-experts-on-cpu|$m/arch/qwen3moe-moe.gguf|-ot exps=CPU|import"
  "gemma3|$m/arch/gemma3-dense.gguf||import"
  "dense-shards|$m/shards/llama-dense-00001-of-00003.gguf||import"
  "refused-all|$m/mid/llama-dense.gguf||refused"
  "refused-real|$m/llama-dense.gguf||refused-real"
  "igpu-moe-experts-on-cpu|$m/llama-moe.gguf|-ot exps=CPU|igpu"
  "no-mmap|$m/llama-dense.gguf|-lm none|aside"
  "dio|$m/llama-dense.gguf|-lm dio|aside"
  "fit-refused|$m/big/llama-dense.gguf|-n 8|fit-refused"
  "two-devices-rpc|$m/llama-dense.gguf|--rpc $rpc -ts 1,3|two-devices"
)
selected=" ${CASES:-${all_cases[*]%%|*}} "
start_rpc_server "$rpc"
print_header
for c in "${all_cases[@]}"; do
  IFS='|' read -r name model extra kind <<< "$c"
  [[ $selected == *" $name "* ]] || continue
  run_case "$name" "$model" "$extra" "$kind"
done
stop_rpc_server

phase weight-cases
# the series without any option is upstream: same decisions, buffers, tokens and peak RSS
run_stock_case stock-dense-mid "$m/mid/llama-dense.gguf" ""
# partial offload: the CPU's layers stay in the mapping (llama-moe with -ot exps=CPU gave stock
# 7 MiB below upstream's 746, too near 1 %; -ot ffn=CPU crashes lavapipe in both builds)
run_stock_case stock-dense-mid-ngl5 "$m/mid/llama-dense.gguf" "-ngl 5"
check_boundaries_control

check_refused_run_alone "$m/big/llama-dense.gguf"
check_tensor_alignment "$m/q4/llama-dense-q4_k_m.gguf" "$out/run/dense-q4_k.import"
check_tensors_validated "$m/llama-dense.gguf" "$out/run/dense.import"
check_truncated_model "$m/llama-dense.gguf"
check_truncated_after_planning "$m/llama-dense.gguf"
check_reload "$m/llama-dense.gguf"
check_bench_refit "$m/big/llama-dense.gguf"
check_fit_pins_once "$m/big/llama-dense.gguf"
check_correctness "$m/llama-dense.gguf" "$m/q4/llama-dense-q4_k_m.gguf"
check_mlock_locks_imports "$m/llama-dense.gguf"
phase stock-and-checks
run_compile_check
run_device_glue
phase device-glue
run_doctor
phase doctor
run_split_sync "$m"
phase split-sync
run_servers "$m/big/llama-dense.gguf"
check_dirty_control "$m/llama-dense.gguf"
phase servers
run_file_changes
phase file-change
run_install
phase install

# --- speed: bench/llama_ab.sh, import vs copy vs upstream's iGPU default -----------------------
# BENCH_REPS (default 2 here; the bench's own default is 5) alternated repetitions of each arm on
# BENCH_MODEL (default the small dense model, so that CI stays short), warm and cold cache.
for cache in warm cold; do
  OUT=$out bash "$root/bench/llama_ab.sh" "${BENCH_MODEL:-$m/llama-dense.gguf}" "${BENCH_REPS:-2}" "$cache" \
    > "$out/logs/bench-$cache.log" 2>&1 || fail "bench/llama_ab.sh ($cache) failed; see $out/logs/bench-$cache.log"
  echo; grep -v '^llama.cpp speed' "$out/logs/bench-$cache.log" || true
  summaries+=("$(grep -m1 '^llama.cpp speed' "$out/logs/bench-$cache.log" || echo "llama.cpp speed cache=$cache missing")")
done

phase bench

# --- the device script's dry run: its whole flow on these builds, lavapipe for the GPU; with the
# import forced to nothing it must fail (the < 90 % gate, the correctness gate's import check)
for forced in 0 1; do
  rc=0
  FORCE_ZERO_IMPORT=$forced WORK=$out/run/device-dry OUT=$out/run/device-dry REPS=1 \
    bash "$root/scripts/device-llama-cuda.sh" --dry-run > "$out/logs/device-dry-$forced.log" 2>&1 || rc=$?
  summaries+=("llama.cpp device-dry-run forced_zero_import=$( ((forced)) && echo yes || echo no) exit=$rc")
  (( (forced == 0 && rc == 0) || (forced == 1 && rc == 1) )) ||
    fail "device-llama-cuda.sh --dry-run (FORCE_ZERO_IMPORT=$forced) exited $rc; see $out/logs/device-dry-$forced.log"
done
phase device-dry-run
echo
cat "$out/logs/phase-times.log"
echo
printf '%s\n' "${summaries[@]}"
exit "$status"
