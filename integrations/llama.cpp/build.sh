#!/usr/bin/env bash
# Configure and build the few llama.cpp targets libweightmap's integration
# work needs, with the Vulkan backend, in Release mode.
#
# Usage: integrations/llama.cpp/build.sh [SRC [BUILD]]
#        defaults: SRC=build-llama/src (made by fetch.sh), BUILD=build-llama/build
# Env:   JOBS (default: nproc), TARGETS (space-separated, overrides the list
#        below), CMAKE_EXTRA_ARGS (appended to the configure line).
#
# Needs (Debian 12): cmake, ninja-build (optional), g++, glslc, spirv-headers,
# libvulkan-dev; mesa-vulkan-drivers to run on lavapipe. Installs nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SRC="${1:-$ROOT/build-llama/src}"
BUILD="${2:-$ROOT/build-llama/build}"
JOBS="${JOBS:-$(nproc)}"

# llama-simple      examples/simple: minimal greedy generation via the C API
# llama-completion  tools/completion: full CLI (-ngl, -ot, --cpu-moe, --no-mmap, samplers)
# test-llama-archs  tests: writes random-weight GGUF models with a tiny tokenizer
# llama-gguf        examples/gguf: dumps a GGUF's KV pairs and tensor list
# llama-server      tools/server: the OpenAI-compatible HTTP server (no web UI, no HTTPS)
TARGETS="${TARGETS:-llama-simple llama-completion test-llama-archs llama-gguf llama-server}"

die() { echo "build.sh: ERROR: $*" >&2; exit 1; }
[[ -f "$SRC/CMakeLists.txt" ]] || die "no llama.cpp source at $SRC (run fetch.sh first)"
for tool in cmake glslc; do
    command -v "$tool" >/dev/null || die "'$tool' not found on PATH"
done

GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi

# Tools, examples and tests stay ON at configure time only so that the
# targets above exist (and so that tests/ finds the mtmd target it links);
# nothing but TARGETS is built. The server is built without its web UI (no
# npm build, no download: an empty asset table); the app and HTTPS are off.
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_VULKAN=ON \
    -DGGML_CCACHE=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    ${CMAKE_EXTRA_ARGS:-}

start=$(date +%s)
# shellcheck disable=SC2086
cmake --build "$BUILD" --config Release -j "$JOBS" --target $TARGETS
end=$(date +%s)
echo "build.sh: built [$TARGETS] in $((end - start)) s with -j $JOBS; binaries in $BUILD/bin"
