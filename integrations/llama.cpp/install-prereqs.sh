# shellcheck shell=bash
# install.sh's prerequisite checks, sourced. Each check_* appends "what: where to get it" to
# missing[] for every prerequisite it does not find, and sets the arguments the found ones need:
# backend_cmake_args (llama.cpp's configure) and hsa_meson_args (libweightmap's).
backend_cmake_args=() hsa_meson_args=()

need_command() { # COMMAND PACKAGE [WHY]
  command -v "$1" > /dev/null || missing+=("$1${3:+ ($3)}: Debian package $2")
}
need_pkg() { # PKG-CONFIG-NAME PACKAGE [MIN-VERSION]
  pkg-config --exists "$1${3:+ >= $3}" 2> /dev/null ||
    missing+=("$1${3:+ >= $3} (pkg-config): Debian package $2")
}
version_at_least() { # HAVE WANT: true when HAVE >= WANT (dotted numbers)
  [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1) == "$2" ]]
}

check_common() {
  need_command g++ g++
  need_command pkg-config pkg-config
  need_command ninja ninja-build
  need_command cmake cmake
  need_command git git "applies the patches"
  need_command python3 python3 "reads the npm package's version"
  if command -v meson > /dev/null; then
    version_at_least "$(meson --version)" 1.0 || missing+=("meson >= 1.0 (have $(meson --version)): Debian 12's meson")
  else
    missing+=("meson >= 1.0: Debian package meson")
  fi
  # fetch.sh needs npm only while node-llama-cpp's tarball is not in its cache
  compgen -G "$root/build-llama/cache/npm-node-llama-cpp-*/*.tgz" > /dev/null ||
    need_command npm npm "fetches llama.cpp's source: node-llama-cpp from npm's registry"
  if command -v pkg-config > /dev/null; then
    need_pkg fmt libfmt-dev 9
    need_pkg nlohmann_json nlohmann-json3-dev
    need_pkg CLI11 libcli11-dev
    need_pkg libxxhash libxxhash-dev
  fi
}

check_vulkan() {
  command -v pkg-config > /dev/null && need_pkg vulkan libvulkan-dev
  need_command glslc glslc "compiles ggml-vulkan's shaders"
  [[ -f /usr/include/spirv/unified1/spirv.hpp ]] ||
    missing+=("spirv/unified1/spirv.hpp: Debian package spirv-headers")
  compgen -G "/usr/share/vulkan/icd.d/*.json" > /dev/null || compgen -G "/etc/vulkan/icd.d/*.json" > /dev/null ||
    echo "install.sh: note: no Vulkan driver is installed (mesa-vulkan-drivers, or the GPU vendor's): it builds, but nothing will run" >&2
}

# The CUDA toolkit: nvcc on PATH or in /usr/local/cuda, and cuBLAS beside it.
check_cuda() {
  local nvcc cuda_root cap
  nvcc=$(command -v nvcc || true)
  [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
  if [[ -z $nvcc ]]; then
    missing+=("nvcc (the CUDA toolkit; GB10's sm_121 needs CUDA 12.9 or later): NVIDIA's cuda-toolkit package, or Debian's nvidia-cuda-toolkit (non-free)")
  else
    backend_cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
    cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
    compgen -G "$cuda_root/include/cublas_v2.h" > /dev/null || compgen -G "$cuda_root/targets/*/include/cublas_v2.h" > /dev/null ||
      [[ -f /usr/include/cublas_v2.h ]] ||
      missing+=("cuBLAS (cublas_v2.h, libcublas.so): NVIDIA's libcublas-dev package, or Debian's nvidia-cuda-toolkit (non-free)")
  fi
  if [[ -n $cuda_arch ]]; then
    backend_cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$cuda_arch")
  elif cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -n 1) && [[ -n $cap ]]; then
    backend_cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="${cap//./}")
  else
    missing+=("a CUDA architecture: no NVIDIA GPU is visible to nvidia-smi; pass --cuda-arch (GB10 121, Jetson Orin 87, GH200 90)")
  fi
}

# ROCm: hipcc 6.1 or later (ggml-hip's CMakeLists refuses older), hipBLAS and rocBLAS, and the HSA
# headers for libweightmap's importer.
check_hip() {
  local hipconfig rocm version arch
  hipconfig=$(command -v hipconfig || true)
  [[ -z $hipconfig && -x /opt/rocm/bin/hipconfig ]] && hipconfig=/opt/rocm/bin/hipconfig
  if [[ -z $hipconfig ]]; then
    missing+=("hipcc and hipconfig (ROCm 6.1 or later): AMD's ROCm repository (rocm-hip-sdk)")
    rocm=/opt/rocm
  else
    rocm=$("$hipconfig" --rocmpath 2> /dev/null || echo /opt/rocm)
    version=$("$hipconfig" --version 2> /dev/null | grep -oE '^[0-9]+\.[0-9]+' || echo 0)
    version_at_least "$version" 6.1 ||
      missing+=("ROCm 6.1 or later (this machine's HIP is $version; ggml-hip requires 6.1): AMD's ROCm repository (rocm-hip-sdk)")
    backend_cmake_args+=(-DCMAKE_HIP_COMPILER="$("$hipconfig" --hipclangpath 2> /dev/null)/clang")
  fi
  local lib
  for lib in hipblas rocblas; do
    compgen -G "$rocm/lib/cmake/$lib/*config.cmake" > /dev/null ||
      compgen -G "/usr/lib/*/cmake/$lib/*config.cmake" > /dev/null ||
      missing+=("$lib (its CMake package; Debian 12 has none): AMD's ROCm repository (${lib}-dev)")
  done
  if [[ ! -f /usr/include/hsa/hsa_ext_amd.h ]]; then
    if [[ -f $rocm/include/hsa/hsa_ext_amd.h ]]; then
      hsa_meson_args=(-Dcpp_args=-I"$rocm/include")
    else
      missing+=("hsa/hsa_ext_amd.h (libweightmap's HSA importer): Debian package libhsa-runtime-dev, or ROCm's hsa-rocr-dev")
    fi
  fi
  if [[ -n $hip_arch ]]; then
    arch=$hip_arch
  else
    arch=$("$rocm/bin/amdgpu-arch" 2> /dev/null | head -n 1 || true)
  fi
  if [[ -n $arch ]]; then
    backend_cmake_args+=(-DGPU_TARGETS="$arch")
  else
    missing+=("a GPU target: no AMD GPU is visible to amdgpu-arch; pass --hip-arch (Strix Halo gfx1151)")
  fi
}
