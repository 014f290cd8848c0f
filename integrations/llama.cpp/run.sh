#!/usr/bin/env bash
# llama.cpp loads its weights through libweightmap, on lavapipe: real sizes, quantized weights,
# several architectures, llama.cpp's default flags, and never worse than upstream.
#
# Gets llama.cpp (fetch.sh: node-llama-cpp's bundle, pinned and checked, our patches applied) and
# builds it twice from one build directory: without LLAMA_WEIGHTMAP (the series as a user who
# does not opt in gets it: "stock") and with it, against the *installed* libweightmap. Generates
# models with llama.cpp's own test-llama-archs (and llama-quantize), then runs greedy generation
# with default flags (AUTO load mode, -fit on) for each case in three arms: import (default),
# copy (LLAMA_WEIGHTMAP_IMPORT=0: every weight copied as upstream does) and, where -fit placed
# fewer layers in the copy arm, copy with the import arm's -ngl (the token comparison). Prints a
# table and one summary line per case; see usage below for the exit status.
#
# Then the scheduler (patch 0007, GGML_WEIGHTMAP_SPLIT_SYNC): generation with CPU + Vulkan splits
# under the split-ordering helper and under the upstream rule, traced and replayed in
# libweightmap's simulator (bench_split_sync --replay). Then llama-server on the big model in each
# arm, three processes at once (memory summed, one exits), and bench/llama_ab.sh's speed table.
#
# Usage: integrations/llama.cpp/run.sh [LIBWM_BUILD [OUT]]
#        defaults: LIBWM_BUILD=build (configured and built here when missing), OUT=build-llama
# Env:   JOBS (default nproc), N_PREDICT (default 32), CASES (space-separated case names; default
#        all), SERVER_N_PREDICT (tokens per server request, default 4), BENCH_MODEL, BENCH_REPS
#        (see the bench below). Everything is written under OUT, the Mesa shader cache included.
# Exit:  non-zero when a case's arms generate different tokens, a case that should import imports
#        < 99 % of its device bytes, refused-all or stock peak above upstream's RSS by > 5 %, the
#        big model is not offloaded whole in the import arm, a refused import does not fall back
#        alone, --check-tensors passes a corrupt imported tensor, a corrupt model crashes, the
#        scheduler checks fail, the servers answer differently, crash or do not shut down cleanly,
#        three importing servers save < 98 % of 3x the device bytes of RssAnon or re-read the
#        model when one exits, or the bench fails or its arms' tokens differ.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
libwm_build=$(realpath -m "${1:-$root/build}")
out=$(realpath -m "${2:-$root/build-llama}")
n_predict=${N_PREDICT:-32}
mkdir -p "$out/logs" "$out/models" "$out/run"
source "$here/lib.sh"

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

# --- llama.cpp: stock, then with LLAMA_WEIGHTMAP, from one build directory ---------------------
# Switching LLAMA_WEIGHTMAP rebuilds only the loader's two files (patch 0006 defines
# LLAMA_USE_WEIGHTMAP on them alone) and fit.cpp; the stock binary and its libraries are copied
# out and run with LD_LIBRARY_PATH, which the build's RUNPATH yields to.
bash "$here/fetch.sh" "$out/src" > "$out/logs/fetch.log" 2>&1 ||
  { tail -n 20 "$out/logs/fetch.log" >&2; exit 1; }
# GGML_RPC: ggml-rpc-server on loopback is a third ggml backend in the scheduler checks.
build_llama() { # WEIGHTMAP TARGETS
  CMAKE_EXTRA_ARGS="-DLLAMA_WEIGHTMAP=$1 -DGGML_WEIGHTMAP_SPLIT_SYNC=ON -DGGML_RPC=ON" TARGETS="$2" \
    bash "$here/build.sh" "$out/src" "$out/build" >> "$out/logs/llama-build.log" 2>&1 ||
    { tail -n 30 "$out/logs/llama-build.log" >&2; exit 1; }
}
bin=$out/build/bin
: > "$out/logs/llama-build.log"
build_llama OFF llama-completion
rm -rf "$out/stock" && mkdir -p "$out/stock"
cp -a "$bin/llama-completion" "$bin"/lib*.so* "$out/stock/"
build_llama ON "llama-completion test-llama-archs llama-quantize llama-server ggml-rpc-server"
# The library llama-completion runs with must be the one just installed; stock llama has none
ldd "$bin/llama-completion" | grep -q "$dest.*libweightmap" ||
  { echo "run.sh: llama-completion does not load libweightmap from $dest" >&2; exit 1; }
# (ggml-base links it for the scheduler, patch 0007, which is its own option)
! readelf -d "$out/stock/libllama.so" | grep NEEDED | grep -q libweightmap ||
  { echo "run.sh: the stock libllama links libweightmap" >&2; exit 1; }

# --- models: llama.cpp's own generator, and its quantizer -------------------------------------
# stdev 1.0: the generator's default 0.1 makes greedy output one repeated token, which would
# hide wrong weights.
make_models "$bin" "$out/models" > "$out/logs/models.log" 2>&1 ||
  { tail -n 20 "$out/logs/models.log" >&2; exit 1; }

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
# stock: the build without LLAMA_WEIGHTMAP)
m=$out/models
all_cases=(
  "dense|$m/llama-dense.gguf||import"
  "moe-experts-on-cpu|$m/llama-moe.gguf|-ot exps=CPU|import"
  "dense-big|$m/big/llama-dense.gguf||import"
  "moe-big-experts-on-cpu|$m/big/llama-moe.gguf|-ot exps=CPU|import"
  "dense-q4_k|$m/q4/llama-dense-q4_k_m.gguf||import"
  "moe-q4_0-experts-on-cpu|$m/q4/llama-moe-q4_0.gguf|-ot exps=CPU|import"
  "qwen3moe-experts-on-cpu|$m/arch/qwen3moe-moe.gguf|-ot exps=CPU|import"
  "gemma3|$m/arch/gemma3-dense.gguf||import"
  "refused-all|$m/mid/llama-dense.gguf||refused"
  "stock|$m/mid/llama-dense.gguf||stock"
)
selected=" ${CASES:-${all_cases[*]%%|*}} "
print_header
for c in "${all_cases[@]}"; do
  IFS='|' read -r name model extra kind <<< "$c"
  [[ $selected == *" $name "* ]] || continue
  run_case "$name" "$model" "$extra" "$kind"
done

check_refused_run_alone "$m/big/llama-dense.gguf"
check_tensor_alignment "$m/q4/llama-dense-q4_k_m.gguf" "$out/run/dense-q4_k.import"
check_tensors_validated "$m/llama-dense.gguf"
check_truncated_model "$m/llama-dense.gguf"
check_writable_mapping "$m/llama-dense.gguf"
check_mlock_locks_imports "$m/llama-dense.gguf"
run_split_sync "$m"
run_servers "$m/big/llama-dense.gguf"

# --- speed: bench/llama_ab.sh, import vs copy vs upstream's iGPU default -----------------------
# BENCH_REPS (default 2 here; the bench's own default is 5) alternated repetitions of each arm on
# BENCH_MODEL (default the small dense model, so that CI stays short), warm and cold cache.
for cache in warm cold; do
  OUT=$out bash "$root/bench/llama_ab.sh" "${BENCH_MODEL:-$m/llama-dense.gguf}" "${BENCH_REPS:-2}" "$cache" \
    > "$out/logs/bench-$cache.log" 2>&1 || fail "bench/llama_ab.sh ($cache) failed; see $out/logs/bench-$cache.log"
  echo; grep -v '^llama.cpp speed' "$out/logs/bench-$cache.log" || true
  summaries+=("$(grep -m1 '^llama.cpp speed' "$out/logs/bench-$cache.log" || echo "llama.cpp speed cache=$cache missing")")
done

echo
printf '%s\n' "${summaries[@]}"
exit "$status"
