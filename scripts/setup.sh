#!/usr/bin/env bash
# Installs everything libweightmap builds and tests with, from Debian 12's packages only.
# Idempotent: skips apt entirely when every package is already installed. Run as root.
set -euo pipefail

packages=(
  g++ pkg-config meson ninja-build git         # toolchain (Meson 1.0, Ninja)
  cmake                                        # weightmapConfig.cmake and its consumer test
  libfmt-dev catch2                            # fmt 9, Catch2 2.13
  libxxhash-dev                                # XXH3: the file guard's hashes of sampled pages
  nlohmann-json3-dev libcli11-dev              # JSON output/safetensors header, CLI parsing
  libvulkan-dev libvulkan1 mesa-vulkan-drivers # Vulkan headers, loader, lavapipe for tests
  libhsa-runtime-dev                           # HSA headers + the real runtime for the smoke test
  clang libclang-rt-14-dev llvm                # libFuzzer and sanitizer runtimes
  util-linux mount                             # unshare/mount for read-only-mount tests
  glslc spirv-headers                          # llama.cpp's Vulkan shaders (integrations/llama.cpp)
  time                                         # peak RSS of each llama.cpp run (/usr/bin/time -f %M)
  ccache                                       # llama.cpp: the upstream and series trees share objects
  g++-11 hipcc                                 # llama.cpp compile-check.sh: nvcc 11.8's host compiler, HIP 5.2
)
# npm fetches llama.cpp's source (node-llama-cpp's bundle); Debian's package when npm is absent
# (a NodeSource nodejs already carries its own npm, and conflicts with Debian's).
command -v npm > /dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
