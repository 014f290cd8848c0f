#!/usr/bin/env bash
# Compile, without linking or running, the ggml-cuda sources that this series' patches add or
# change, with Debian 12's own toolchains: nvcc 11.8 (nvidia-cuda-toolkit, non-free) and hipcc 5.2
# (main). No GPU, no CUDA driver, nothing installed system-wide for CUDA.
#
# Usage: integrations/llama.cpp/compile-check.sh SRC_DIR OUT_DIR
#   SRC_DIR  a patched llama.cpp tree (fetch.sh's output)
#   OUT_DIR  objects, logs and the compiler cache (OUT_DIR/ccache unless CCACHE_DIR is set)
#
# Prints one line per backend on stdout:
#   llama.cpp compile backend=<cuda|hip> toolkit=<version> files=<n> ok=<yes|no>
# and every stage's time, every skipped file and every compiler error on stderr.
#
# Exit status: 0 every file compiled; 1 a file failed (or bad usage); 77 nothing was checked for a
# reason printed on stderr (a toolchain cannot be obtained, no patch touches ggml-cuda). A failed
# compile outranks a missing toolchain.
#
# Which files: every file under ggml/src/ggml-cuda/ that a patch in patches/ adds or modifies
# (`diff --git` lines; deletions dropped). A .cu compiles as itself, a .cuh through a one-line
# translation unit that includes it (the header must stand alone). nvcc compiles them all; hipcc
# only those whose quoted-include closure reaches neither ggml-cuda/common.cuh nor vendors/hip.h
# (those include hipBLAS, which Debian 12 does not ship).
#
# The CUDA toolkit: apt-get with a private sources list (deb.debian.org bookworm main contrib
# non-free, signed by debian-archive-keyring) and private state, `apt-get download` of
# nvidia-cuda-toolkit, nvidia-cuda-dev (only its usr/include is extracted) and the CCCL headers
# (libcub-dev, libthrust-dev, libcu++-dev), `dpkg -x` into CUDA_TOOLKIT_CACHE (default
# /var/cache/libweightmap/cuda-11.8, or ~/.cache/libweightmap/cuda-11.8 where /var/cache is not
# writable), a relocated nvcc.profile; the .debs are deleted, the extracted tree (~180 MiB) is
# kept and reused. nvcc's host compiler is g++-11 (Debian main; scripts/setup.sh installs it):
# nvcc 11.8 rejects gcc 12, and clang-14 with gcc 12's libstdc++ fails in cudafe++.
#
# Environment: BACKENDS ("cuda hip"), CUDA_ARCH (sm_80), HIP_ARCH (first of "gfx1151 gfx1030"
# that this hipcc accepts), CUDA_HOST_CXX (g++-11), CUDA_TOOLKIT_CACHE, CCACHE_DIR,
# NO_CCACHE=1, KEEP_DEBS=1 (keep the downloaded .debs next to the extracted toolkit).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PATCH_DIR="$HERE/patches"
CUDA_SERIES="11.8"          # the cache key; the candidate version of nvidia-cuda-toolkit must match
DEBIAN_MIRROR="http://deb.debian.org/debian"
DEBIAN_KEYRING="/usr/share/keyrings/debian-archive-keyring.gpg"

log() { echo "compile-check: $*" >&2; }
die() { echo "compile-check: ERROR: $*" >&2; exit 1; }

(($# == 2)) || die "usage: $0 SRC_DIR OUT_DIR"
SRC="$(cd "$1" 2>/dev/null && pwd)" || die "SRC_DIR '$1' does not exist"
[[ -d "$SRC/ggml/src/ggml-cuda" ]] || die "$SRC has no ggml/src/ggml-cuda (not a llama.cpp tree?)"
mkdir -p "$2" || die "cannot create OUT_DIR '$2'"
OUT="$(cd "$2" && pwd)"

# Nothing from a CUDA the environment points at (this machine's /usr/local/cuda is CUDA 13).
unset CUDA_HOME CUDA_PATH CUDA_ROOT CUDAToolkit_ROOT NVCC_PREPEND_FLAGS NVCC_APPEND_FLAGS \
      NVCC_CCBIN CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH LIBRARY_PATH HIP_PATH ROCM_PATH

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
stage_time() { log "time stage=$1 seconds=$(secs "$2" "$(now)")${3:+ $3}"; }

# ---------------------------------------------------------------- the file list
# `diff --git a/X b/Y`: Y is the file the patch leaves (a rename's new name); a block with
# "deleted file mode" leaves nothing.
patched_files() {
    local p
    shopt -s nullglob
    for p in "$PATCH_DIR"/*.patch; do
        awk '
            function flush() { if (path != "" && !deleted) print path }
            /^diff --git / { flush(); path = $4; sub(/^b\//, "", path); deleted = 0; next }
            /^deleted file mode/ { deleted = 1 }
            END { flush() }' "$p"
    done
    shopt -u nullglob
}
mapfile -t FILES < <(patched_files | grep '^ggml/src/ggml-cuda/' | sort -u)
SOURCES=()
for f in "${FILES[@]}"; do
    case "$f" in
        *.cu|*.cuh)
            [[ -f "$SRC/$f" ]] || die "$f: a patch adds or changes it, but $SRC does not have it (SRC_DIR not patched with this series?)"
            SOURCES+=("$f") ;;
        *) log "not compiled: $f (neither .cu nor .cuh)" ;;
    esac
done
if ((${#SOURCES[@]} == 0)); then
    log "SKIP: no patch in $PATCH_DIR adds or changes a .cu/.cuh under ggml/src/ggml-cuda/: nothing to compile"
    exit 77
fi
log "files from the patches: ${SOURCES[*]}"

# ---------------------------------------------------------------- flags (ggml's CMake, Release)
# ggml/src/CMakeLists.txt: GGML_SCHED_MAX_COPIES, _XOPEN_SOURCE, _GNU_SOURCE; a shared backend
# library: GGML_BACKEND_BUILD, GGML_BACKEND_SHARED, GGML_SHARED; llama.cpp turns
# GGML_CUDA_GRAPHS on; ggml-cuda/CMakeLists.txt: -use_fast_math -extended-lambda
# -Xcompiler -Wno-pedantic; ggml-hip/CMakeLists.txt: GGML_USE_HIP, GGML_HIP_GRAPHS,
# GGML_HIP_NO_MMQ_MFMA is not set (GGML_HIP_MMQ_MFMA defaults to ON).
INCLUDES=(-I"$SRC/ggml/include" -I"$SRC/ggml/src" -I"$SRC/ggml/src/ggml-cuda")
DEFINES=(-DGGML_SCHED_MAX_COPIES=4 -D_XOPEN_SOURCE=600 -D_GNU_SOURCE -DGGML_BACKEND_BUILD
         -DGGML_BACKEND_SHARED -DGGML_SHARED -DNDEBUG)
CUDA_ARCH="${CUDA_ARCH:-sm_80}"
CUDA_HOST_CXX="${CUDA_HOST_CXX:-g++-11}"
CUDA_FLAGS=(-std=c++17 -arch="$CUDA_ARCH" -O3 -use_fast_math -extended-lambda
            -Xcompiler "-fPIC -Wno-pedantic" -DGGML_CUDA_USE_GRAPHS)
HIP_FLAGS=(-x hip -std=c++17 -O3 -fPIC -DGGML_USE_HIP -DGGML_HIP_GRAPHS)

# The translation unit for FILE: itself, or a stub that includes the header.
unit_of() {  # FILE BACKEND_OUT
    local f="$1" dir="$2"
    case "$f" in
        *.cu) echo "$SRC/$f" ;;
        *.cuh)
            local stub="$dir/stubs/${f//\//_}.cu"
            mkdir -p "$dir/stubs"
            printf '#include "%s"\n' "$SRC/$f" > "$stub"
            echo "$stub" ;;
    esac
}

# Does FILE's quoted-include closure reach ggml-cuda/common.cuh or ggml-cuda/vendors/hip.h?
# Conservative: #if'd-out includes count too.
declare -A SEEN=()
reaches_hipblas() {  # ABS_PATH
    local file="$1" inc dir cand
    [[ -n "${SEEN[$file]:-}" ]] && return 1
    SEEN[$file]=1
    case "$file" in
        "$SRC/ggml/src/ggml-cuda/common.cuh"|"$SRC/ggml/src/ggml-cuda/vendors/hip.h") return 0 ;;
    esac
    dir="$(dirname "$file")"
    while IFS= read -r inc; do
        for cand in "$dir/$inc" "$SRC/ggml/src/ggml-cuda/$inc" "$SRC/ggml/src/$inc" "$SRC/ggml/include/$inc"; do
            if [[ -f "$cand" ]]; then
                cand="$(realpath -m "$cand")"
                reaches_hipblas "$cand" && return 0
                break
            fi
        done
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
    return 1
}

# ---------------------------------------------------------------- compiling
CCACHE=()
if [[ "${NO_CCACHE:-0}" != 1 ]] && command -v ccache >/dev/null; then
    CCACHE=(ccache)
    export CCACHE_DIR="${CCACHE_DIR:-$OUT/ccache}"
    export CCACHE_BASEDIR="$SRC"
fi

compile_all() {  # BACKEND DIR COMPILER-COMMAND... ; uses UNITS (relative names)
    local backend="$1" dir="$2"; shift 2
    local f unit obj logf t0 rc failed=0 n=0
    for f in "${UNITS[@]}"; do
        unit="$(unit_of "$f" "$dir")"
        obj="$dir/obj/${f//\//_}.o"
        logf="$dir/log/${f//\//_}.log"
        mkdir -p "$dir/obj" "$dir/log"
        t0="$(now)"
        nice "$@" -c "$unit" -o "$obj" > "$logf" 2>&1
        rc=$?
        n=$((n + 1))
        if ((rc == 0)); then
            stage_time "$backend-compile" "$t0" "file=$f result=ok"
        else
            stage_time "$backend-compile" "$t0" "file=$f result=FAILED rc=$rc"
            failed=1
            log "$backend: $f failed; the compiler said (last 40 lines, all of it in $logf):"
            tail -n 40 "$logf" | sed 's/^/    /' >&2
        fi
    done
    COMPILED=$n
    return $failed
}

# ---------------------------------------------------------------- CUDA: Debian's 11.8 toolkit
cuda_cache_dir() {
    if [[ -n "${CUDA_TOOLKIT_CACHE:-}" ]]; then echo "$CUDA_TOOLKIT_CACHE"; return; fi
    local base=/var/cache/libweightmap
    # a complete toolkit there serves everyone; only a download needs it writable
    if [[ -f "$base/cuda-$CUDA_SERIES/.complete" ]]; then echo "$base/cuda-$CUDA_SERIES"; return; fi
    if ! { mkdir -p "$base" 2>/dev/null && [[ -w "$base" ]]; }; then
        base="${XDG_CACHE_HOME:-$HOME/.cache}/libweightmap"
    fi
    echo "$base/cuda-$CUDA_SERIES"
}

# Downloads and extracts the toolkit into $TK (atomically: a temp dir renamed at the end).
# Returns 77 (with the reason logged) where it cannot.
obtain_cuda() {
    local tk="$1" tmp apt t0 t1 bytes v pkgs=() deb
    for tool in apt-get apt-cache dpkg-deb tar flock; do
        command -v "$tool" >/dev/null || { log "cuda: SKIP: '$tool' not found, cannot obtain the toolkit"; return 77; }
    done
    [[ "$(dpkg --print-architecture 2>/dev/null)" == amd64 ]] \
        || { log "cuda: SKIP: Debian's nvidia-cuda-toolkit is used for amd64 only"; return 77; }
    [[ -r "$DEBIAN_KEYRING" ]] || { log "cuda: SKIP: $DEBIAN_KEYRING missing (debian-archive-keyring)"; return 77; }

    tmp="$(mktemp -d "$tk.tmp.XXXXXX")" || { log "cuda: SKIP: cannot create a directory next to $tk"; return 77; }
    apt="$tmp/apt"
    mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$apt/cache"
    echo "deb [signed-by=$DEBIAN_KEYRING] $DEBIAN_MIRROR bookworm main contrib non-free" > "$apt/sources.list"
    local A=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
             -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
             -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
             -o "Dir::Cache::Archives=$apt/archives" -o Debug::NoLocking=1 -o APT::Get::List-Cleanup=0)
    ((EUID == 0)) && A+=(-o APT::Sandbox::User=root)

    t0="$(now)"
    if ! nice apt-get "${A[@]}" -q update > "$tmp/apt-update.log" 2>&1 \
        || grep -q '^\(W\|E\): Failed to fetch\|^Err:' "$tmp/apt-update.log"; then
        log "cuda: SKIP: apt-get update against $DEBIAN_MIRROR failed (no network?):"
        tail -n 5 "$tmp/apt-update.log" | sed 's/^/    /' >&2
        rm -rf "$tmp"; return 77
    fi
    stage_time cuda-apt-update "$t0"

    v="$(apt-cache "${A[@]}" policy nvidia-cuda-toolkit 2>/dev/null | awk '/Candidate:/ {print $2}')"
    case "$v" in
        "$CUDA_SERIES".*) ;;
        *) log "cuda: SKIP: bookworm's nvidia-cuda-toolkit candidate is '${v:-none}', not $CUDA_SERIES.x"; rm -rf "$tmp"; return 77 ;;
    esac
    # nvidia-cuda-dev has the same version as the toolkit; the CCCL headers whatever bookworm has.
    pkgs=("nvidia-cuda-toolkit=$v" "nvidia-cuda-dev=$v" libcub-dev libthrust-dev libcu++-dev)
    t0="$(now)"
    if ! (cd "$apt/archives" && nice apt-get "${A[@]}" -q download "${pkgs[@]}") > "$tmp/apt-download.log" 2>&1; then
        log "cuda: SKIP: apt-get download ${pkgs[*]} failed:"
        tail -n 5 "$tmp/apt-download.log" | sed 's/^/    /' >&2
        rm -rf "$tmp"; return 77
    fi
    bytes="$(cat "$apt/archives"/*.deb | wc -c)"
    stage_time cuda-download "$t0" "bytes=$bytes mib=$((bytes / 1048576)) packages=${#pkgs[@]}"

    t0="$(now)"
    local root="$tmp/root"
    mkdir -p "$root"
    for deb in "$apt/archives"/*.deb; do
        case "$(basename "$deb")" in
            nvidia-cuda-dev_*)   # 774 MB of static libraries; only the headers are needed
                t1="$(now)"
                nice dpkg-deb --fsys-tarfile "$deb" | nice tar -x -C "$root" ./usr/include || { log "cuda: extracting $deb failed"; rm -rf "$tmp"; return 1; }
                stage_time cuda-extract "$t1" "package=nvidia-cuda-dev(usr/include)" ;;
            *)
                t1="$(now)"
                nice dpkg -x "$deb" "$root" || { log "cuda: extracting $deb failed"; rm -rf "$tmp"; return 1; }
                stage_time cuda-extract "$t1" "package=$(basename "$deb" | cut -d_ -f1)" ;;
        esac
    done
    # Debian's nvcc.profile is a link to /etc/nvcc.profile with absolute /usr paths: replace it by
    # one relative to the nvcc binary (_HERE_), the way NVIDIA's own toolkit lays it out.
    local bin="$root/usr/lib/nvidia-cuda-toolkit/bin"
    [[ -x "$bin/nvcc" && -x "$bin/cicc" && -x "$root/usr/bin/ptxas" && -f "$root/usr/include/cuda_runtime.h" ]] \
        || { log "cuda: the extracted packages lack nvcc, cicc, ptxas or cuda_runtime.h"; rm -rf "$tmp"; return 1; }
    rm -f "$bin/nvcc.profile"
    cat > "$bin/nvcc.profile" <<'EOF'
# written by libweightmap's compile-check.sh: Debian's layout, relocated below _HERE_/../../..
TOP                = $(_HERE_)/../../..
NVVMIR_LIBRARY_DIR = $(_HERE_)/../libdevice
PATH              += $(_HERE_):$(TOP)/bin:
INCLUDES          += "-I$(TOP)/include" $(_SPACE_)
LIBRARIES         =+ $(_SPACE_) "-L$(TOP)/lib/x86_64-linux-gnu/stubs"
EOF
    stage_time cuda-extract-all "$t0" "mib=$(du -sm "$root" | cut -f1)"

    for deb in "$apt/archives"/*.deb; do basename "$deb" .deb; done > "$root/PACKAGES"
    if [[ "${KEEP_DEBS:-0}" == 1 ]]; then mv "$apt/archives" "$root/debs"; fi
    rm -rf "$apt"
    rm -rf "$tk"
    mv "$root" "$tk" && rm -rf "$tmp" || { log "cuda: cannot move the toolkit into $tk"; return 1; }
    date -u +%FT%TZ > "$tk/.complete"
    return 0
}

run_cuda() {
    local tk rc t0 version ok
    tk="$(cuda_cache_dir)"
    mkdir -p "$(dirname "$tk")" || { log "cuda: SKIP: cannot create $(dirname "$tk")"; return 77; }
    command -v "$CUDA_HOST_CXX" >/dev/null || {
        log "cuda: SKIP: host compiler '$CUDA_HOST_CXX' not found: nvcc 11.8 needs g++ <= 11 (Debian main: g++-11, which scripts/setup.sh installs)"
        return 77; }
    t0="$(now)"
    if [[ ! -f "$tk/.complete" ]]; then
        # one download at a time; a second run waits for it and then finds it complete
        exec 9> "$tk.lock" || { log "cuda: SKIP: cannot write $tk.lock"; return 77; }
        flock 9
        if [[ ! -f "$tk/.complete" ]]; then
            rm -rf "$tk".tmp.*   # what an interrupted download left
            log "cuda: no toolkit in $tk: downloading Debian 12's nvidia-cuda-toolkit $CUDA_SERIES"
            obtain_cuda "$tk"; rc=$?
            if ((rc != 0)); then exec 9>&-; return "$rc"; fi
        fi
        exec 9>&-
    else
        log "cuda: toolkit cached in $tk ($(paste -sd' ' "$tk/PACKAGES"))"
    fi
    stage_time cuda-toolkit "$t0"
    local nvcc="$tk/usr/lib/nvidia-cuda-toolkit/bin/nvcc"
    version="$("$nvcc" --version 2>/dev/null | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p')"
    [[ -n "$version" ]] || { log "cuda: $nvcc --version failed"; echo "llama.cpp compile backend=cuda toolkit=unknown files=0 ok=no"; return 1; }
    log "cuda: nvcc $version, host compiler $("$CUDA_HOST_CXX" -dumpfullversion) ($CUDA_HOST_CXX), -arch=$CUDA_ARCH${CCACHE:+, ccache in $CCACHE_DIR}"
    UNITS=("${SOURCES[@]}")
    ok=yes
    compile_all cuda "$OUT/cuda" "${CCACHE[@]}" "$nvcc" -ccbin "$CUDA_HOST_CXX" "${CUDA_FLAGS[@]}" \
        "${DEFINES[@]}" "${INCLUDES[@]}" || ok=no
    echo "llama.cpp compile backend=cuda toolkit=$version files=$COMPILED ok=$ok"
    [[ "$ok" == yes ]]
}

# ---------------------------------------------------------------- HIP: Debian's hipcc 5.2
run_hip() {
    local version arch cand probe reason ok f
    command -v hipcc >/dev/null || { log "hip: SKIP: hipcc not found (Debian main: hipcc, which scripts/setup.sh installs)"; return 77; }
    # toolkit=: the Debian package's upstream version where hipcc is Debian's, else HIP's own
    version="$(dpkg-query -W -f='${Version}' hipcc 2>/dev/null | sed 's/^[0-9]*://; s/-[^-]*$//')"
    [[ -n "$version" ]] || version="$(hipcc --version 2>/dev/null | sed -n 's/^HIP version: \([0-9.]*\).*/\1/p')"
    [[ -n "$version" ]] || version=unknown

    UNITS=()
    for f in "${SOURCES[@]}"; do
        SEEN=()
        if reaches_hipblas "$SRC/$f"; then
            log "hip: skipped $f: it includes ggml-cuda/common.cuh (vendors/hip.h includes hipblas/hipblas.h, which Debian 12 does not ship)"
        else
            UNITS+=("$f")
        fi
    done
    if ((${#UNITS[@]} == 0)); then
        log "hip: SKIP: every file includes common.cuh; nothing hipcc can compile without hipBLAS"
        return 77
    fi

    # The newest target first: hipcc 5.2's clang-15 and rocm-device-libs 5.2 may not know it.
    mkdir -p "$OUT/hip"
    probe="$OUT/hip/probe.hip"
    printf '#include <hip/hip_runtime.h>\n__global__ void k(float *p) { p[threadIdx.x] = sqrtf(p[threadIdx.x]); }\n' > "$probe"
    arch=""
    for cand in ${HIP_ARCH:-gfx1151 gfx1030}; do
        if reason="$(nice hipcc -x hip --offload-arch="$cand" -c "$probe" -o "$OUT/hip/probe.o" 2>&1)"; then
            arch="$cand"; break
        fi
        log "hip: target $cand not usable with this hipcc: $(grep -m1 'error' <<< "$reason")"
    done
    [[ -n "$arch" ]] || { log "hip: SKIP: hipcc compiles no kernel for any of ${HIP_ARCH:-gfx1151 gfx1030}"; return 77; }
    log "hip: hipcc $version ($(hipcc --version 2>/dev/null | sed -n 's/^HIP version: //p')), --offload-arch=$arch"

    ok=yes
    compile_all hip "$OUT/hip" hipcc --offload-arch="$arch" "${HIP_FLAGS[@]}" \
        "${DEFINES[@]}" "${INCLUDES[@]}" || ok=no
    echo "llama.cpp compile backend=hip toolkit=$version files=$COMPILED ok=$ok"
    [[ "$ok" == yes ]]
}

# ---------------------------------------------------------------- main
failed=0 skipped=0
T_ALL="$(now)"
for backend in ${BACKENDS:-cuda hip}; do
    case "$backend" in
        cuda) run_cuda ;;
        hip)  run_hip ;;
        *) die "unknown backend '$backend' (BACKENDS takes cuda, hip)" ;;
    esac
    case $? in
        0) ;;
        77) skipped=1 ;;
        *) failed=1 ;;
    esac
done
stage_time total "$T_ALL"
((failed)) && exit 1
((skipped)) && exit 77
exit 0
