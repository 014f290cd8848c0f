#!/usr/bin/env bash
# llama.cpp through libweightmap on a real NVIDIA GPU, in one run of at most 8 minutes (device
# time is scarce; the machine has no network): builds the series' test build with CUDA and the
# pristine upstream (or takes them prebuilt), generates a ~1 GiB dense F32 model with llama.cpp's
# own test-llama-archs, and runs greedy generation in three arms, alternated, medians of three:
#   import    the test build, LLAMA_WEIGHTMAP_TEST_ALLOW_DISCRETE=1: the glue imports on the
#             discrete card (libweightmap's CUDA importer with allow_discrete, policy "always")
#   copy      the test build, LLAMA_WEIGHTMAP_IMPORT=0
#   upstream  the pristine tree (the series' first four patches; see UPSTREAM below)
# and, where NVIDIA's Vulkan ICD and glslc exist and time is left, the Vulkan test build with its
# devices typed as integrated GPUs (patch 0009), import against copy. One line per case:
#   llama.cpp device case=<name> backend=<cuda|vulkan> tokens_identical=<yes|no>
#     imported_fraction=<f> tg_ratio_vs_copy=<f> load_ratio_vs_upstream=<f>
# then a table of the raw medians (load s, pp t/s, tg t/s, peak RSS MiB per arm).
#
# Usage: scripts/device-llama-cuda.sh             on the GPU machine
#        scripts/device-llama-cuda.sh --dry-run   here, no GPU: everything but the GPU calls, on the
#          llama stage's builds (build-llama: run.sh first) and its small dense model, lavapipe
#          in place of the GPU; FORCE_ZERO_IMPORT=1 must make it fail (the < 90 % gate)
#        scripts/device-llama-cuda.sh --prepare   here, before: builds libweightmap's prefix and
#          writes llama.cpp's trees into build-device/llama-carry (~13 MiB: no git needed there),
#          the one path to carry to the machine
# Env:   PREBUILT=DIR  binaries instead of building: DIR/testing (llama-completion,
#          test-llama-archs, llama-bench optional, their lib*.so*), DIR/upstream (the same for the
#          pristine tree), DIR/weightmap-prefix (a `meson install --destdir`), DIR/vulkan optional;
#          a run that builds leaves this layout in WORK/bins
#        MODEL (default: generated), REPS (3), BUDGET_S (465: the run stops cleanly by then),
#        FORCE_ZERO_IMPORT=1 (the import arm imports nothing: the run must fail, naming why),
#        CUDA_FA=ON (compile ggml's CUDA FlashAttention kernels; OFF by default: its 84 sources
#        compile to empty kernels, and -fa auto runs without them), JOBS (nproc),
#        UPSTREAM=full (build the pristine tree with CUDA too; default: its libllama, common and llama-completion on the series' ggml libraries,
#        which the series changes only by additions: one CUDA build instead of two), WORK
#        (scratch: default build-device/llama-work), OUT (results: two files; default build-device)
# The source: the carried trees (--prepare) where build-llama/src or git is missing, else
#   build-llama/src (fetch.sh's clone), else fetch.sh from its npm tarball cache; nothing is
#   downloaded.
# Exit:  (1 also when a forced import arm imports < 90 % of its device bytes, or when the
#        correctness gate fails: llama-perplexity's KL divergence of the import arm's logits
#        against the copy arm's, at -ub 128 and -ub 32, mean > 1e-6 or same top token < 99 %.)
#        77 with one line when no GPU is usable (no nvidia-smi, nvidia-smi failing or listing no
#        GPU, no /dev/nvidia0, no libcuda.so.1 whose cuInit succeeds) or when there is neither a
#        PREBUILT tree nor nvcc (nor cmake and ninja to use it); 1 when a step fails, the budget
#        runs out, or an arm's tokens differ; 0 otherwise.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
self=$root/scripts/device-llama-cuda.sh
here=$root/integrations/llama.cpp
carry=$root/build-device/llama-carry
tgz_rel=cache/npm-node-llama-cpp-3.22.1/node-llama-cpp-3.22.1.tgz

# ---- output, time ---------------------------------------------------------------------------
say() { printf '%s\n' "$*" | tee -a "$summary" >&3; } # fd 3: the console, whatever a caller redirected
skip() { say "SKIP: $*"; exit 77; }
die() { say "FAILED: $*"; exit 1; }
left() { echo $((deadline - SECONDS)); }
stage() { # NAME: closes the previous stage, prints its time
  if [[ -n ${stage_name:-} ]]; then say "stage $stage_name: $((SECONDS - stage_start)) s (elapsed $SECONDS s)"; fi
  stage_name=$1 stage_start=$SECONDS
}
# limited CAP CMD...: CMD under `timeout`, in the background (so that a signal reaches the trap at
# once), for CAP seconds or until the budget's end, whichever comes first. The budget's end aborts
# the run; the stage's own cap returns 124 to the caller.
limited() {
  local cap=$1 until_end rc=0; shift
  until_end=$(($(left) - 8))
  ((until_end > 5)) || abort "no time left for $stage_name"
  ((cap < until_end)) || cap=$until_end
  timeout -k 5 "$cap" "$@" &
  child=$!
  wait "$child" || rc=$?
  child=
  if ((rc == 124 || rc == 137)) && ((cap == until_end)); then abort "$stage_name ran into the budget"; fi
  return "$rc"
}
abort() { say "ABORT after $SECONDS s: $* (BUDGET_S=$budget); children stopped, partial results kept"; exit 1; }
# shellcheck disable=SC2317 # the traps' functions
on_signal() { abort "interrupted"; }
# shellcheck disable=SC2317
finish() { # the EXIT trap: stop what is still running, leave the logs under OUT
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n ${child:-} ]]; then kill -TERM "$child" 2> /dev/null || true; wait "$child" 2> /dev/null || true; fi
  if [[ -n ${stage_name:-} && $rc != 77 ]]; then stage end; fi
  if [[ -d $work/logs ]]; then tar -czf "$res/device-llama-logs.tar.gz" -C "$work" logs 2> /dev/null || true; fi
  exit "$rc"
}

# ---- is a GPU usable? -------------------------------------------------------------------------
# cuInit through libcuda.so.1 (python3's ctypes, else a C program); a toolkit package can bring
# libcuda.so.1 to a machine without a GPU, so nvidia-smi must list one too.
cuinit_status() {
  if command -v python3 > /dev/null; then
    python3 -c 'import ctypes, sys
try: lib = ctypes.CDLL("libcuda.so.1")
except OSError as e: print("no libcuda.so.1:", e); sys.exit(1)
r = lib.cuInit(0); print("cuInit returned", r); sys.exit(r != 0)'
  elif command -v cc > /dev/null; then
    printf '#include <dlfcn.h>\n#include <stdio.h>\nint main(void) { void* l = dlopen("libcuda.so.1", RTLD_NOW); if (!l) { printf("no libcuda.so.1: %%s\\n", dlerror()); return 1; }\n int (*init)(unsigned) = (int (*)(unsigned)) dlsym(l, "cuInit"); int r = init ? init(0) : -1; printf("cuInit returned %%d\\n", r); return r != 0; }\n' \
      | cc -x c - -o "$work/cuinit" -ldl && "$work/cuinit"
  else
    echo "cannot test cuInit (neither python3 nor cc)"; return 1
  fi
}
check_gpu() {
  local list reason
  command -v nvidia-smi > /dev/null || skip "no nvidia-smi on this machine"
  list=$(timeout 30 nvidia-smi -L 2>&1) || skip "nvidia-smi -L failed: $(head -n 1 <<< "$list")"
  grep -q '^GPU [0-9]' <<< "$list" || skip "nvidia-smi lists no GPU: $(head -n 1 <<< "$list")"
  [[ -e /dev/nvidia0 ]] || skip "no /dev/nvidia0"
  reason=$(cuinit_status 2>&1) || skip "libcuda.so.1 unusable: $(tail -n 1 <<< "$reason")"
  say "gpu: $(head -n 1 <<< "$list"); $(nvidia-smi --query-gpu=driver_version,memory.total,compute_cap --format=csv,noheader | head -n 1); $reason"
}

# ---- binaries: prebuilt, or build here ---------------------------------------------------------
find_nvcc() {
  if command -v nvcc > /dev/null; then command -v nvcc
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then echo /usr/local/cuda/bin/nvcc
  else return 1; fi
}
# --dry-run: the llama stage's release, test and pristine builds in the PREBUILT layout
dry_run_layout() {
  local l=$root/build-llama d=$work/dry-bins
  [[ -x $l/testing/llama-completion && -x $l/build/bin/test-llama-archs && -x $l/build/bin/llama-perplexity &&
     -x $l/pristine/build/bin/llama-completion && -d $l/weightmap-prefix ]] ||
    skip "dry run: no llama stage builds under $l (run integrations/llama.cpp/run.sh first)"
  rm -rf "$d" && mkdir -p "$d/testing" "$d/upstream"
  cp -a "$l/testing/." "$d/testing/"
  cp -a "$l/build/bin/test-llama-archs" "$l/build/bin/llama-perplexity" "$d/testing/"
  cp -an "$l/build/bin/"lib*.so* "$d/testing/" # the test build's own libraries win
  cp -a "$l/pristine/build/bin/llama-completion" "$l/pristine/build/bin/"lib*.so* "$d/upstream/"
  cp -a "$l/weightmap-prefix" "$d/weightmap-prefix"
  PREBUILT=$d MODEL=${MODEL:-$l/models/llama-dense.gguf}
  dry_env=(GGML_VK_VISIBLE_DEVICES=0 "MESA_SHADER_CACHE_DIR=$l/mesa-shader-cache")
  say "dry run: no GPU; lavapipe in its place, the llama stage's builds ($l)"
}
choose_binaries() {
  if [[ -n ${PREBUILT:-} ]]; then
    [[ -x $PREBUILT/testing/llama-completion && -x $PREBUILT/testing/test-llama-archs ]] ||
      die "PREBUILT=$PREBUILT lacks testing/llama-completion or testing/test-llama-archs"
    bins=$(realpath "$PREBUILT")
    say "binaries: prebuilt, $bins"
    return
  fi
  nvcc=$(find_nvcc) || skip "neither PREBUILT=DIR nor nvcc (PATH, /usr/local/cuda/bin): nothing to run"
  local tool tools=(cmake ninja)
  [[ -s $carry/llama-src.tar.gz ]] || tools+=(git) # the carried trees need no git (--prepare)
  for tool in "${tools[@]}"; do command -v "$tool" > /dev/null || skip "nvcc but no $tool to build with"; done
  bins=$work/bins
  say "binaries: built here with $nvcc ($("$nvcc" --version | grep -m1 -o 'release [0-9.]*, V[0-9.]*')), cmake $(cmake --version | head -n 1 | awk '{print $3}')"
}

# ---- libweightmap: a carried prefix, else meson here --------------------------------------------
use_prefix() { # DIR: sets the pkg-config and loader paths run.sh sets
  local pc
  pc=$(find "$1" -name weightmap.pc 2> /dev/null | head -n 1)
  [[ -n $pc ]] || return 1
  prefix=$(realpath "$1")
  PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$prefix
  export PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
  wm_libdir=$(dirname "$(dirname "$pc")")
  say "libweightmap: $prefix (pkg-config $(dirname "$pc"))"
}
libweightmap() {
  local d
  for d in "${PREBUILT:+$PREBUILT/weightmap-prefix}" "${WEIGHTMAP_PREFIX:-}" "$carry/weightmap-prefix"; do
    if [[ -n $d ]] && use_prefix "$d"; then return; fi
  done
  [[ -z ${PREBUILT:-} ]] || die "PREBUILT=$PREBUILT has no weightmap-prefix/.../weightmap.pc"
  command -v meson > /dev/null || die "no libweightmap prefix carried and no meson to build one (run $0 --prepare where Debian's packages are, carry build-device/llama-carry)"
  build_libweightmap "$work/libwm" "$work/weightmap-prefix" > "$work/logs/libweightmap.log" 2>&1 ||
    die "libweightmap did not build here (a missing fmt?): $work/logs/libweightmap.log; run $0 --prepare elsewhere and carry build-device/llama-carry"
  use_prefix "$work/weightmap-prefix"
}
build_libweightmap() { # BUILD DESTDIR
  [[ -f $1/build.ninja ]] || meson setup "$1" "$root" --buildtype=release -Dcuda=enabled -Dvulkan=disabled \
    -Dhsa=disabled -Dtests=false --wrap-mode=nodownload
  ninja -C "$1"
  rm -rf "$2"
  meson install -C "$1" --destdir "$2" --quiet --no-rebuild
}
# CMake's FindPkgConfig where the machine has no pkg-config: this script answers for weightmap.pc
pkg_config_tool() {
  if command -v pkg-config > /dev/null; then return; fi
  mkdir -p "$work/tools"
  printf '#!/bin/sh\nexec bash "%s" --pkg-config "$@"\n' "$self" > "$work/tools/pkg-config"
  chmod +x "$work/tools/pkg-config"
  pkgconfig_arg=(-DPKG_CONFIG_EXECUTABLE="$work/tools/pkg-config")
  say "pkg-config: none on this machine; $work/tools/pkg-config reads weightmap.pc"
}
pc_expand() { # VALUE: ${var} from the .pc file's variables (pc_vars)
  local v=$1 k
  for _ in 1 2 3 4; do for k in "${!pc_vars[@]}"; do v=${v//\$\{$k\}/${pc_vars[$k]}}; done; done
  echo "$v"
}
pkg_config_shim() { # what FindPkgConfig asks: --version, --exists, --modversion, --variable=, --cflags*, --libs*
  local arg query="" mod="" dir pc line key t out=()
  declare -gA pc_vars=()
  for arg; do
    case $arg in
      --version) echo 0.29.2; return 0 ;;
      --print-errors | --short-errors | --exists | --static) ;;
      --*) query=$arg ;;
      *) mod=${arg%%[<>=]*} ;;
    esac
  done
  for dir in ${PKG_CONFIG_PATH//:/ }; do [[ -f $dir/$mod.pc ]] && pc=$dir/$mod.pc; done
  [[ -n ${pc:-} ]] || { echo "Package $mod was not found" >&2; return 1; }
  declare -A fields=()
  while IFS= read -r line; do
    if [[ $line =~ ^([A-Za-z_][A-Za-z0-9_.]*)=(.*)$ ]]; then pc_vars[${BASH_REMATCH[1]}]=$(pc_expand "${BASH_REMATCH[2]}")
    elif [[ $line =~ ^([A-Za-z.]+):\ *(.*)$ ]]; then fields[${BASH_REMATCH[1]}]=$(pc_expand "${BASH_REMATCH[2]}"); fi
  done < "$pc"
  case $query in
    --modversion) echo "${fields[Version]:-}"; return 0 ;;
    --variable=*) key=${query#--variable=}; line=${pc_vars[$key]:-}; [[ $line != /* ]] || line=${PKG_CONFIG_SYSROOT_DIR:-}$line; echo "$line"; return 0 ;;
    --cflags*) line=${fields[Cflags]:-} ;;
    --libs*) line=${fields[Libs]:-} ;;
    *) return 0 ;;
  esac
  for t in $line; do
    case $t in -I* | -L*) t=${t:0:2}${PKG_CONFIG_SYSROOT_DIR:-}${t:2} ;; esac
    case $query:$t in
      --cflags-only-I:-I* | --libs-only-L:-L* | --libs-only-l:-l* | --cflags:* | --libs:*) out+=("$t") ;;
      --cflags-only-other:-I* | --libs-only-other:-[lL]*) ;;
      --cflags-only-other:* | --libs-only-other:*) out+=("$t") ;;
    esac
  done
  echo "${out[*]}"
}

# ---- llama.cpp's source: the series (fetch.sh's clone), the pristine tree a worktree of it ------------------------
llama_source() {
  local src=$root/build-llama/src
  if [[ ! -d $src/.git || -z $(command -v git) ]] && [[ -s $carry/llama-src.tar.gz ]]; then
    carried_source
    return
  fi
  if [[ ! -d $src/.git ]]; then
    src=$work/src
    if [[ ! -s $root/build-llama/$tgz_rel && -s $carry/$tgz_rel ]]; then
      mkdir -p "$(dirname "$root/build-llama/$tgz_rel")" && cp "$carry/$tgz_rel" "$root/build-llama/$tgz_rel"
    fi
    [[ -s $root/build-llama/$tgz_rel ]] ||
      die "no llama.cpp source: carry build-llama/src (fetch.sh's clone) or the npm tarball build-llama/$tgz_rel (or build-device/llama-carry: $0 --prepare)"
    limited 120 bash "$here/fetch.sh" "$src" > "$work/logs/fetch.log" 2>&1 ||
      die "fetch.sh from the cache failed: $(tail -n 1 "$work/logs/fetch.log")"
  fi
  local n_patches series pristine
  n_patches=$(find "$here/patches" -name '*.patch' | wc -l)
  series=$(git -C "$src" rev-parse HEAD)
  pristine=$(git -C "$src" rev-parse "HEAD~$((n_patches - 4))")
  series_tree=$src # built out of tree, never changed
  worktree "$src" "$work/pristine" "$pristine"
  say "llama.cpp: series $series ($n_patches patches), pristine $pristine (0001-0004), from $src"
}
# The trees --prepare carried, without git: the series' tree, and the pristine one made from it
# by the pristine versions of the files the series changes, without the files it adds.
carried_source() {
  local f
  series_tree=$work/src
  rm -rf "$series_tree" "$work/pristine" && mkdir -p "$series_tree"
  tar -xzf "$carry/llama-src.tar.gz" -C "$series_tree" || die "cannot extract $carry/llama-src.tar.gz"
  cp -a "$series_tree" "$work/pristine"
  tar -xzf "$carry/llama-pristine-overlay.tar.gz" -C "$work/pristine" || die "cannot extract the pristine overlay"
  while IFS= read -r f; do rm -f "$work/pristine/$f"; done < "$carry/llama-series-added.txt"
  say "llama.cpp: carried trees, no git: $(cat "$carry/llama-commits.txt")"
}
# --prepare: what carried_source needs, from fetch.sh's clone: ~12 MiB without the vocab models
carry_source() { # SRC
  local pristine n_patches
  n_patches=$(find "$here/patches" -name '*.patch' | wc -l)
  pristine=$(git -C "$1" rev-parse "HEAD~$((n_patches - 4))")
  git -C "$1" archive --format=tar HEAD -- . ':!models/*.gguf' ':!docs' | gzip -6 > "$carry/llama-src.tar.gz"
  git -C "$1" diff --name-only --diff-filter=MD "$pristine" HEAD > "$work/pristine-files.txt"
  # shellcheck disable=SC2046 # one path a line, none with spaces in llama.cpp's tree
  git -C "$1" archive --format=tar "$pristine" -- $(cat "$work/pristine-files.txt") | gzip -6 > "$carry/llama-pristine-overlay.tar.gz"
  git -C "$1" diff --name-only --diff-filter=A "$pristine" HEAD > "$carry/llama-series-added.txt"
  echo "series $(git -C "$1" rev-parse HEAD) ($n_patches patches), pristine $pristine (0001-0004)" > "$carry/llama-commits.txt"
}
worktree() { # SRC DIR COMMIT
  [[ $(git -C "$2" rev-parse HEAD 2> /dev/null) != "$3" ]] || return 0
  rm -rf "$2" && git -C "$1" worktree prune
  git -C "$1" worktree add -f --detach "$2" "$3" > /dev/null 2>&1 || die "git worktree add $2 $3 failed"
}

# ---- builds --------------------------------------------------------------------------------------
# build.sh's configure line without its Vulkan (and its glslc check); OPTIONS after the targets.
cmake_build() { # NAME SRC BUILD CAP "TARGETS" OPTIONS...
  local name=$1 src=$2 build=$3 cap=$4 targets=$5 start=$SECONDS rc=0; shift 5
  local -a launch=()
  if command -v ccache > /dev/null; then
    export CCACHE_DIR=$work/ccache CCACHE_BASEDIR=$work CCACHE_NOHASHDIR=1
    launch=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  {
    limited 120 cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CCACHE=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "${launch[@]}" \
      "${pkgconfig_arg[@]}" "$@" && echo "configured in $((SECONDS - start)) s"
  } > "$work/logs/build-$name.log" 2>&1 || rc=$?
  # shellcheck disable=SC2086 # TARGETS is a list
  if ((rc == 0)); then limited "$cap" cmake --build "$build" -j "${JOBS:-$(nproc)}" --target $targets >> "$work/logs/build-$name.log" 2>&1 || rc=$?; fi
  say "build $name [$targets]: $((SECONDS - start)) s, exit $rc"
  ((rc == 0)) || tail -n 15 "$work/logs/build-$name.log" | tee -a "$summary"
  return "$rc"
}
copy_bins() { # BUILD_BIN DEST [LIB_SOURCE]: programs and libraries; LIB_SOURCE's ggml libraries win
  rm -rf "$2" && mkdir -p "$2"
  local p
  for p in llama-completion llama-bench test-llama-archs; do [[ ! -x $1/$p ]] || cp -a "$1/$p" "$2/"; done
  cp -a "$1"/lib*.so* "$2/"
  if [[ -n ${3:-} ]]; then rm -f "$2"/libggml*.so*; cp -a "$3"/libggml*.so* "$2/"; fi
}
cuda_options() {
  local cap
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
  cuda_opts=(-DGGML_CUDA=ON -DGGML_VULKAN=OFF -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="${cap:-native}"
             -DGGML_CUDA_FA="${CUDA_FA:-OFF}" -DGGML_CUDA_NCCL=OFF)
}
build_series() {
  cmake_build series-cuda "$series_tree" "$work/build-series" 400 "llama-completion test-llama-archs llama-bench" \
    "${cuda_opts[@]}" -DLLAMA_WEIGHTMAP=ON -DLLAMA_WEIGHTMAP_TESTING=ON || die "the series' CUDA test build failed"
  copy_bins "$work/build-series/bin" "$bins/testing"
}
# UPSTREAM=full: the pristine tree with CUDA; else without (libllama, common and llama-completion
# alone are pristine code) on the series' ggml libraries, which add to ggml and change nothing a
# pristine libllama calls: one CUDA build instead of two.
build_upstream() {
  local cap=$(($(left) - runs_reserve))
  if ((cap < 60)); then say "upstream: not built ($(left) s left, the runs need $runs_reserve s): no upstream arm"; return; fi
  if [[ ${UPSTREAM:-mixed} == full ]]; then
    cmake_build pristine-cuda "$work/pristine" "$work/build-pristine" "$cap" "llama-completion llama-bench" "${cuda_opts[@]}" ||
      { say "upstream: no upstream arm (the pristine build did not finish)"; return; }
    copy_bins "$work/build-pristine/bin" "$bins/upstream"
  else
    cmake_build pristine-llama "$work/pristine" "$work/build-pristine" "$cap" "llama-completion llama-bench" -DGGML_CUDA=OFF -DGGML_VULKAN=OFF ||
      { say "upstream: no upstream arm (the pristine build did not finish)"; return; }
    copy_bins "$work/build-pristine/bin" "$bins/upstream" "$bins/testing"
    say "upstream: pristine llama-completion, libllama and common on the series' ggml libraries (UPSTREAM=full builds both with CUDA)"
  fi
}
build_all() {
  cuda_options
  stage build-series; build_series
  stage build-upstream; build_upstream
}

# ---- the model -----------------------------------------------------------------------------------
# run.sh's 'mid' model: 10 layers of 1536 x 4096, F32, 1.05 GiB (lib.sh make_models)
make_model() {
  if [[ -n ${MODEL:-} ]]; then model=$MODEL; say "model: $model (given)"; return; fi
  model=$work/models/llama-dense.gguf
  mkdir -p "$work/models"
  if [[ ! -s $model ]]; then
    limited 120 env LD_LIBRARY_PATH="$bins/testing:$wm_libdir" LLAMA_ARCHS_ONLY=dense LLAMA_ARCHS_N_EMBD=1536 \
      LLAMA_ARCHS_N_HEAD=12 LLAMA_ARCHS_N_FF=4096 LLAMA_ARCHS_N_LAYER=10 "$bins/testing/test-llama-archs" -a llama -s 42 -d 1.0 \
      -o "$work/models" > "$work/logs/model.log" 2>&1 || die "test-llama-archs failed: $work/logs/model.log"
  fi
  say "model: $model, $(($(stat -c %s "$model") / 1048576)) MiB, dense F32"
}

# ---- runs ----------------------------------------------------------------------------------------
arm_dir() { case $1 in import | copy) echo "$bins/testing" ;; upstream) echo "$bins/upstream" ;; vk-*) echo "$bins/vulkan" ;; esac; }
arm_env() { # ARM: its environment, one assignment a line
  echo "LD_LIBRARY_PATH=$(arm_dir "$1"):$wm_libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ((${#dry_env[@]} == 0)) || printf '%s\n' "${dry_env[@]}"
  case $1 in
    import) echo LLAMA_WEIGHTMAP_TEST_ALLOW_DISCRETE=1; [[ ${FORCE_ZERO_IMPORT:-0} != 1 ]] || echo LLAMA_WEIGHTMAP_IMPORT=0 ;;
    copy) echo LLAMA_WEIGHTMAP_IMPORT=0 ;;
    vk-import) printf '%s\n' GGML_VK_TEST_REPORT_IGPU=1 "${vk_env[@]}" ;;
    vk-copy) printf '%s\n' GGML_VK_TEST_REPORT_IGPU=1 LLAMA_WEIGHTMAP_IMPORT=0 "${vk_env[@]}" ;;
  esac
}
# the command that records a peak RSS in KiB into FILE: GNU time's %M, else python3's getrusage
rss_prefix() { # FILE
  if [[ -x /usr/bin/time ]]; then rss=(/usr/bin/time -f %M -o "$1"); return; fi
  rss=(python3 -c 'import resource, subprocess, sys
r = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(r)' "$1")
}
run_arm() { # KIND(completion|bench) ARM LOG [EXTRA...]: LOG.out, LOG.err, LOG.maxrss
  local kind=$1 arm=$2 log=$3 rc=0; shift 3
  local -a envs cmd rss
  mapfile -t envs < <(arm_env "$arm")
  if [[ $kind == completion ]]; then
    cmd=("$(arm_dir "$arm")/llama-completion" -m "$model" -p "hello world" -n 32 --temp 0 -s 42 -no-cnv
         --no-display-prompt -ngl 99 -v "$@")
  else
    cmd=("$(arm_dir "$arm")/llama-bench" -m "$model" -p 128 -n 32 -r 1 -ngl 99 -o jsonl "$@")
  fi
  rss_prefix "$log.maxrss"
  limited 120 "${rss[@]}" env "${envs[@]}" "${cmd[@]}" > "$log.out" 2> "$log.err" < /dev/null || rc=$?
  if ((rc != 0)); then say "run $(basename "$log") failed (exit $rc): $(tail -n 1 "$log.err")"; status=1; fi
}
# REPS rounds, the arms' order rotated each round (a b c, b c a, c a b): KIND ARM...
run_rounds() {
  local kind=$1 rep i n; shift
  local -a arms=("$@")
  n=${#arms[@]}
  for ((rep = 1; rep <= reps; rep++)); do
    for ((i = 0; i < n; i++)); do
      local arm=${arms[$(((i + rep - 1) % n))]}
      run_arm "$kind" "$arm" "$work/logs/run/$kind.$arm.$rep"
    done
  done
}

# ---- numbers -------------------------------------------------------------------------------------
median() { printf '%s\n' "$@" | { grep -E '^[0-9.]+$' || true; } | sort -g |
  awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b + 0 == 0) print "nan"; else printf "%.4f\n", a / b }'; }
tg_completion() { sed -nE 's/.*print: +eval time = .*per token, +([0-9.]+) tokens per second.*/\1/p' "$1" | tail -n 1; }
pp_completion() { sed -nE 's/.*prompt eval time = .*per token, +([0-9.]+) tokens per second.*/\1/p' "$1" | tail -n 1; }
bench_ts() { # JSONL N_PROMPT N_GEN: llama-bench's avg_ts for that test
  awk -v p="$2" -v g="$3" 'index($0, "\"n_prompt\": " p ",") && index($0, "\"n_gen\": " g ",") {
    if (match($0, /"avg_ts": [0-9.e+]+/)) print substr($0, RSTART + 10, RLENGTH - 10) }' "$1" | tail -n 1
}
arm_median() { # KIND ARM WHAT(load|tg|pp|rss|fraction)
  local f v=()
  for f in "$work/logs/run/$1.$2".*.err; do
    [[ -e $f ]] || continue
    local b=${f%.err}
    case $1:$3 in
      completion:load) v+=("$(load_seconds "$f")") ;;
      completion:tg) v+=("$(tg_completion "$f")") ;;
      completion:pp) v+=("$(pp_completion "$f")") ;;
      completion:rss) v+=("$(peak_mib "$b.maxrss")") ;;
      completion:fraction) v+=("$(ratio "$(wm_field imported "$f")" "$(wm_field device "$f")")") ;;
      bench:pp) v+=("$(bench_ts "$b.out" 128 0)") ;;
      bench:tg) v+=("$(bench_ts "$b.out" 0 32)") ;;
    esac
  done
  median "${v[@]}"
}
# yes when every completion of the arms printed the same non-empty text
same_text() { # ARM...
  local arm f first=
  for arm; do
    for f in "$work/logs/run/completion.$arm".*.out; do
      [[ -s $f ]] || { echo no; return; }
      first=${first:-$f}
      cmp -s "$first" "$f" || { echo no; return; }
    done
  done
  [[ -n $first ]] && echo yes || echo no
}
have_arm() { compgen -G "$work/logs/run/completion.$1.*.err" > /dev/null; }
case_line() { # NAME BACKEND ARM COPY_ARM UPSTREAM_ARM(or -)
  local same fraction tg load_up=nan
  local -a compared=("$3" "$4")
  if [[ $5 != - ]] && have_arm "$5"; then compared+=("$5"); fi
  same=$(same_text "${compared[@]}")
  fraction=$(arm_median completion "$3" fraction)
  [[ $fraction == nan && $3 != *import ]] && fraction=0.0000
  tg=$(ratio "$(tg_of "$3")" "$(tg_of "$4")")
  if [[ $5 != - ]] && have_arm "$5"; then load_up=$(ratio "$(arm_median completion "$3" load)" "$(arm_median completion "$5" load)"); fi
  say "llama.cpp device case=$1 backend=$2 tokens_identical=$same imported_fraction=$fraction tg_ratio_vs_copy=$tg load_ratio_vs_upstream=$load_up"
  [[ $same == yes ]] || { say "case $1: the arms' tokens differ"; status=1; }
  # an import arm that imported (almost) nothing would pass on tokens alone: it ran the copy
  # (numeric: awk compares "nan" with 0.90 as strings, and "nan" >= "0.90")
  if [[ $3 == *import ]] && ! awk -v f="$fraction" 'BEGIN { exit !(f ~ /^[0-9.]+$/ && f + 0 >= 0.90) }'; then
    say "case $1: the import arm imported $fraction of its device bytes (< 0.90): nothing was measured"; status=1
  fi
}
rate_of() { # tg|pp ARM: llama-bench's median where it ran, else llama-completion's eval lines'
  local rate=nan
  if [[ $bench_ran == yes ]]; then rate=$(arm_median bench "$2" "$1"); fi
  [[ $rate != nan ]] || rate=$(arm_median completion "$2" "$1")
  echo "$rate"
}
tg_of() { rate_of tg "$1"; }
pp_of() { rate_of pp "$1"; }
table() { # ARM...
  local arm
  say ""
  say "$(printf '%-10s %8s %10s %10s %14s %9s' arm load_s pp_t/s tg_t/s peak_rss_mib imported)"
  for arm; do
    have_arm "$arm" || continue
    say "$(printf '%-10s %8s %10s %10s %14s %9s' "$arm" "$(arm_median completion "$arm" load)" "$(pp_of "$arm")" \
      "$(tg_of "$arm")" "$(arm_median completion "$arm" rss)" "$(arm_median completion "$arm" fraction | sed 's/^nan$/-/')")"
  done
  say "(medians of $reps alternated runs; pp and tg from llama-bench -p 128 -n 32 where it ran ($bench_ran), else from llama-completion's prompt eval and eval lines)"
}

# ---- the CUDA runs -------------------------------------------------------------------------------
cuda_runs() {
  local -a arms=(import copy)
  [[ -x $bins/upstream/llama-completion ]] && arms+=(upstream)
  mkdir -p "$work/logs/run"
  run_arm completion copy "$work/logs/run/warm-up" -n 1 # the page cache, the driver
  local per=$((SECONDS - stage_start + 2))
  run_rounds completion "${arms[@]}"
  bench_ran=no
  local arm ok=yes
  for arm in "${arms[@]}"; do [[ -x $(arm_dir "$arm")/llama-bench ]] || ok=no; done
  if [[ $ok == yes ]] && (($(left) > per * 2 * reps * ${#arms[@]} + vk_reserve)); then
    stage cuda-bench
    run_rounds bench "${arms[@]}" && bench_ran=yes
  else
    say "llama-bench: not run (built in every arm: $ok; $(left) s left)"
  fi
  stage cuda-report
  local probe
  probe=$(grep -m1 -E 'llama_weightmap: .*: ' "$work/logs/run/completion.import.1.err" || true)
  say "cuda glue: ${probe:-no llama_weightmap line}"
  say "cuda import: $(grep -m1 -E 'weightmap: (device|disabled)' "$work/logs/run/completion.import.1.err" | sed -E 's/^[0-9.]+ [A-Z] //' || echo 'no weightmap line')"
  case_line import-discrete cuda import copy upstream
  case_line copy cuda copy copy upstream
  table "${arms[@]}"
}

# ---- the correctness gate: the import arm's logits against the copy arm's --------------------------
# llama-perplexity's KL divergence (as llama.cpp#28211 measured in-place reads), at two ubatch
# sizes: wrong in-place reads (llama.cpp#26543's ~0.3 NMSE on gfx1151) fail it where equal tokens
# on 32 greedy steps might not. One `llama.cpp correctness` line per size (run.sh's fields).
perplexity_run() { # ARM LOG UBATCH BASE [FLAGS...]
  local arm=$1 log=$2 ub=$3 base=$4; shift 4
  local -a envs
  mapfile -t envs < <(arm_env "$arm")
  limited 180 env "${envs[@]}" "$bins/testing/llama-perplexity" -m "$model" -f "$gate_text" -c 128 -b 128 -ub "$ub" \
    --chunks 4 -ngl 99 -v --kl-divergence-base "$base" "$@" > "$log.out" 2> "$log.err" < /dev/null
}
correctness_gate() {
  local ub log mean max top pass
  [[ -x $bins/testing/llama-perplexity ]] || { say "correctness: not run: no llama-perplexity in $bins/testing"; status=1; return; }
  gate_text=$root/README.md
  for ub in 128 32; do
    log=$work/logs/run/kld-ub$ub
    perplexity_run copy "$log.copy" "$ub" "$log.base" || { say "correctness: the copy arm's llama-perplexity failed: $log.copy.err"; status=1; continue; }
    perplexity_run import "$log.import" "$ub" "$log.base" --kl-divergence ||
      { say "correctness: the import arm's llama-perplexity failed: $log.import.err"; status=1; continue; }
    mean=$(kld_field mean "$log.import.out") max=$(kld_field max "$log.import.out") top=$(kld_field top "$log.import.out")
    pass=no
    # logits equal to the copy's prove nothing when the import arm imported nothing
    awk -v m="${mean:-1}" -v t="${top:-0}" -v i="$(wm_field imported "$log.import.err")" \
      'BEGIN { exit !(m ~ /^[0-9.e+-]+$/ && m + 0 <= 1e-6 && t + 0 >= 99 && i + 0 > 0) }' && pass=yes
    say "llama.cpp correctness case=kld-ub$ub model=$(basename "$model") kld_mean=${mean:-nan} kld_max=${max:-nan} same_top_p=${top:-nan} pass=$pass"
    if [[ $pass != yes ]]; then
      status=1
      if awk -v i="$(wm_field imported "$log.import.err")" 'BEGIN { exit !(i + 0 > 0) }'; then
        say "correctness: the import arm's logits differ from the copy arm's at -ub $ub"
      else
        say "correctness: the import arm imported nothing at -ub $ub: equal logits prove nothing"
      fi
    fi
  done
}

# ---- Vulkan, where NVIDIA's ICD and glslc are ----------------------------------------------------
vulkan_icd() {
  local f
  for f in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
           /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do
    [[ -f $f ]] && { echo "$f"; return; }
  done
  return 1
}
vulkan_stage() {
  local icd
  icd=$(vulkan_icd) || { say "vulkan: skipped: no NVIDIA Vulkan ICD (nvidia_icd.json in /usr/share/vulkan/icd.d, /etc/vulkan/icd.d, /usr/local/nvidia/share/vulkan/icd.d)"; return; }
  command -v glslc > /dev/null || { say "vulkan: skipped: no glslc (ggml-vulkan's shaders)"; return; }
  [[ -z ${PREBUILT:-} || -x $bins/vulkan/llama-completion ]] || { say "vulkan: skipped: PREBUILT has no vulkan/"; return; }
  if [[ ! -x $bins/vulkan/llama-completion ]]; then
    (($(left) > vk_reserve)) || { say "vulkan: skipped: $(left) s left, a build and its runs need $vk_reserve"; return; }
    cmake_build vulkan "$series_tree" "$work/build-vulkan" $(($(left) - 60)) llama-completion -DGGML_CUDA=OFF \
      -DGGML_VULKAN=ON -DGGML_VULKAN_TESTING=ON -DLLAMA_WEIGHTMAP=ON -DLLAMA_WEIGHTMAP_TESTING=ON ||
      { say "vulkan: skipped: the build did not finish ($work/logs/build-vulkan.log)"; return; }
    copy_bins "$work/build-vulkan/bin" "$bins/vulkan"
  fi
  vk_env=(VK_DRIVER_FILES="$icd" VK_ICD_FILENAMES="$icd")
  stage vulkan-runs
  run_rounds completion vk-import vk-copy
  local probe
  probe=$(grep -m1 -E 'llama_weightmap: .*: .*(read a page of the model file through an import|refused)' "$work/logs/run/completion.vk-import.1.err" || true)
  say "vulkan glue: ${probe:-no probe line (the device was not typed as host memory?)}"
  case_line import-igpu-typed vulkan vk-import vk-copy -
  table vk-import vk-copy
}

# ---- --prepare, on a machine with Debian's packages and network ----------------------------------
prepare() {
  work=$root/build-device/llama-work
  mkdir -p "$carry" "$work/logs"
  build_libweightmap "$root/build-device/libwm" "$carry/weightmap-prefix" > "$work/logs/libweightmap.log" 2>&1 ||
    { tail -n 20 "$work/logs/libweightmap.log"; exit 1; }
  bundle_needed_libs "$carry/weightmap-prefix"
  bash "$here/fetch.sh" "$work/src" > "$work/logs/fetch.log" 2>&1 || { tail -n 20 "$work/logs/fetch.log"; exit 1; }
  carry_source "$work/src"
  rm -rf "$carry/cache" # the npm tarball: the carried trees replace it, and need no git there
  echo "carry: build-device/llama-carry ($(du -sm "$carry" | cut -f1) MiB): libweightmap's prefix and llama.cpp's trees (no git needed there)"
}
# the shared libraries libweightmap.so needs that a bare CUDA image lacks (fmt), beside it
bundle_needed_libs() { # PREFIX
  local so lib
  so=$(find "$1" -name 'libweightmap.so.*.*' | head -n 1)
  for lib in $(ldd "$so" | awk '/=> \// { print $3 }' | grep -v -E '/lib(c|m|gcc_s|stdc\+\+|pthread|dl|rt)\.so'); do
    cp -L "$lib" "$(dirname "$so")/"
    echo "bundled $(basename "$lib")"
  done
}

main() {
  local dry=no
  case ${1:-} in
    --pkg-config) shift; pkg_config_shim "$@"; exit ;;
    --prepare) prepare; exit ;;
    --dry-run) dry=yes ;;
    "") ;;
    *) echo "usage: $0 [--dry-run | --prepare]" >&2; exit 1 ;;
  esac
  budget=${BUDGET_S:-465} deadline=$((SECONDS + ${BUDGET_S:-465})) reps=${REPS:-3}
  res=${OUT:-$root/build-device}
  work=$(realpath -m "${WORK:-$root/build-device/llama-work}")
  mkdir -p "$res" "$work/logs"
  rm -rf "$work/logs"/*
  summary=$res/device-llama-cuda.txt
  exec 3>&1
  : > "$summary"
  status=0 child='' stage_name='' pkgconfig_arg=() vk_env=() dry_env=() bench_ran=no
  runs_reserve=$((90 + 25 * reps)) vk_reserve=0
  trap finish EXIT
  trap on_signal INT TERM
  # shellcheck source=integrations/llama.cpp/lib.sh
  source "$here/lib.sh" # wm_field, load_seconds, peak_mib: run.sh's parsers
  stage checks
  if [[ $dry == yes ]]; then dry_run_layout; else check_gpu; fi
  choose_binaries
  libweightmap
  if [[ -z ${PREBUILT:-} ]]; then
    pkg_config_tool
    stage source; llama_source
    build_all
  fi
  stage model; make_model
  vk_reserve=$( { vulkan_icd > /dev/null && command -v glslc > /dev/null; } && echo 240 || echo 0)
  stage cuda-runs; cuda_runs
  stage correctness; correctness_gate
  stage vulkan; vulkan_stage
  stage end; stage_name=
  say "device-llama-cuda: exit $status after $SECONDS s; logs in $res/device-llama-logs.tar.gz"
  exit "$status"
}
main "$@"
