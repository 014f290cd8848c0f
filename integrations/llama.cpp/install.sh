#!/usr/bin/env bash
# Builds and installs libweightmap and a llama.cpp that reads its weights in place through it
# (the pinned llama.cpp with this series' patches, -DLLAMA_WEIGHTMAP=ON), for one GPU backend.
#
# Usage: integrations/llama.cpp/install.sh --backend vulkan|cuda|hip [--prefix DIR] [--jobs N]
#                                          [--cuda-arch LIST] [--hip-arch LIST] [--check]
#   --backend    vulkan: AMD/Intel APUs (RADV, ANV), any Vulkan 1.2 device; cuda: GB10 (DGX
#                Spark), Jetson Orin, GH200; hip: Strix Halo and other ROCm APUs
#   --prefix     where it all goes (default: ./weightmap-llama): bin/ holds llama-server,
#                llama-cli, llama-completion, llama-bench and wm-doctor; lib/ libweightmap;
#                src/ the sources and build trees (kept: a second run rebuilds only what changed)
#   --cuda-arch  CMAKE_CUDA_ARCHITECTURES (GB10 121, Orin 87, GH200 90); default: the GPU's own
#                (nvidia-smi), needed where no GPU is visible
#   --hip-arch   GPU_TARGETS (Strix Halo gfx1151); default: amdgpu-arch's answer
#   --check      check the prerequisites, install libweightmap and configure llama.cpp for the
#                backend (its toolkit found and accepted by CMake); build no llama.cpp binary
# Prerequisites are checked first; every missing one is named with the package that provides it,
# and the script exits 2. Prints at the end (parsed by tooling):
#   llama.cpp install backend=<name> ok=<yes|no> seconds=<n> binaries=<n>
# (--check: ok=yes binaries=0 when every step up to building llama.cpp passed).
# Env: CCACHE_DIR is honoured (ccache is used when installed); WEIGHTMAP_INSTALL_CMAKE_ARGS is
# appended to llama.cpp's configure line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
backend="" prefix=$PWD/weightmap-llama jobs=$(nproc) cuda_arch="" hip_arch="" check_only=0
start=$SECONDS
binaries=(llama-server llama-cli llama-completion llama-bench)

usage() { sed -n '5,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
summary() { # OK BINARIES
  echo "llama.cpp install backend=${backend:-none} ok=$1 seconds=$((SECONDS - start)) binaries=$2"
}
die() { # [CODE] MESSAGE: the message, the summary line, exit CODE (default 1)
  local code=1
  [[ $1 =~ ^[0-9]+$ ]] && { code=$1; shift; }
  echo "install.sh: $*" >&2; summary no 0; exit "$code"
}

while (($#)); do
  case $1 in
    --backend) backend=${2:-}; shift 2 ;;
    --prefix) prefix=${2:-}; shift 2 ;;
    --jobs) jobs=${2:-}; shift 2 ;;
    --cuda-arch) cuda_arch=${2:-}; shift 2 ;;
    --hip-arch) hip_arch=${2:-}; shift 2 ;;
    --check) check_only=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
case $backend in vulkan|cuda|hip) ;; *) echo "install.sh: --backend vulkan|cuda|hip is required" >&2; usage ;; esac
mkdir -p "$prefix" && prefix=$(cd "$prefix" && pwd)

source "$here/install-prereqs.sh"
missing=()
check_common
"check_$backend"
if ((${#missing[@]})); then
  echo "install.sh: missing prerequisites for --backend $backend:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  die 2 "install them and run again"
fi
echo "install.sh: prerequisites for --backend $backend present"

# --- libweightmap ---------------------------------------------------------------------------
src=$prefix/src
mkdir -p "$src"
libwm_build=$src/libweightmap-build
declare -A importer_option=([vulkan]=vulkan [cuda]=cuda [hip]=hsa)
meson_args=(--prefix "$prefix" --buildtype release -Dtests=false --wrap-mode nodownload
            "-D${importer_option[$backend]}=enabled" "${hsa_meson_args[@]}")
if [[ ! -f $libwm_build/build.ninja ]]; then
  meson setup "$libwm_build" "$root" "${meson_args[@]}" > "$src/libweightmap-setup.log" 2>&1 ||
    { tail -n 20 "$src/libweightmap-setup.log" >&2; die "libweightmap: meson setup failed"; }
fi
meson install -C "$libwm_build" --quiet > "$src/libweightmap-build.log" 2>&1 ||
  { tail -n 30 "$src/libweightmap-build.log" >&2; die "libweightmap: build or install failed"; }
echo "install.sh: libweightmap installed in $prefix"
pc=$(find "$prefix" -name weightmap.pc -path '*pkgconfig*' -not -path "$src/*" 2> /dev/null | head -n 1)
[[ -f $pc ]] || die "no weightmap.pc under $prefix after installing libweightmap"
export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}

# --- llama.cpp --------------------------------------------------------------------------------
# src and build side by side: ccache's relative paths then match run.sh's tree (CI shares one cache).
llama=$src/llama.cpp
bash "$here/fetch.sh" "$llama/src" > "$src/llama-fetch.log" 2>&1 ||
  { tail -n 20 "$src/llama-fetch.log" >&2; die "fetching llama.cpp failed (see $src/llama-fetch.log)"; }
launcher=()
if command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$llama} CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
declare -A backend_flag=([vulkan]=-DGGML_VULKAN=ON [cuda]=-DGGML_CUDA=ON [hip]=-DGGML_HIP=ON)
# Tools and the server without their web UI (no npm build, no download); no tests or examples.
# shellcheck disable=SC2086
cmake -S "$llama/src" -B "$llama/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "${backend_flag[$backend]}" -DLLAMA_WEIGHTMAP=ON "${backend_cmake_args[@]}" "${launcher[@]}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF ${WEIGHTMAP_INSTALL_CMAKE_ARGS:-} > "$src/llama-configure.log" 2>&1 ||
  { tail -n 30 "$src/llama-configure.log" >&2; die "llama.cpp: configure failed (see $src/llama-configure.log)"; }
if ((check_only)); then
  echo "install.sh: --check: prerequisites present, libweightmap installed, llama.cpp configures for $backend; no llama.cpp binary built"
  summary yes 0
  exit 0
fi
cmake --build "$llama/build" -j "$jobs" --target "${binaries[@]}" > "$src/llama-build.log" 2>&1 ||
  { tail -n 30 "$src/llama-build.log" >&2; die "llama.cpp: build failed (see $src/llama-build.log)"; }

# --- bin/ -------------------------------------------------------------------------------------
mkdir -p "$prefix/bin"
n=0
for b in "${binaries[@]}"; do
  [[ -x $llama/build/bin/$b ]] || continue
  ln -sf "$llama/build/bin/$b" "$prefix/bin/$b"
  n=$((n + 1))
done
ldd "$prefix/bin/llama-server" | grep -q "$prefix/.*libweightmap" ||
  die "llama-server does not load libweightmap from $prefix"
cat <<EOF
install.sh: done. In $prefix/bin: ${binaries[*]} wm-doctor
  Before a load, what will be read in place and why not:
    $prefix/bin/wm-doctor MODEL.gguf
  Serve (every layer on the GPU, as llama.cpp does by default), with libllama's log in a file:
    $prefix/bin/llama-server -m MODEL.gguf -lv 4 --log-file server.log
  Whether the weights were imported:
    grep 'weightmap: device' server.log
EOF
summary yes "$n"
