#!/usr/bin/env bash
# The CUDA importer on a real NVIDIA GPU, in one short run (device time is scarce): the real-driver
# smoke test, wm-load through the registry's "cuda" on a generated dense model (default plan and
# --import-policy always, every device tensor verified through the device), and
# bench_cuda_register: cuMemHostRegister of a 1 GiB file-backed read-only mapping, every byte read
# back through the device, register time per GiB, RssAnon growth, and host-to-device copies from
# the registered mapping against the same pages pageable, as a ratio, then the device's read
# bandwidth (cuMemcpyDtoD) out of the import - per method the device supports: the importer's,
# and direct where the device reads pageable memory - against device memory, as a ratio; and
# bench_cuda_fallback_copy: device copies out of the mapping vs from a pread into anonymous
# staging, cold and warm (issue 26). Prints one summary block.
#   Usage: scripts/device-cuda.sh [BUILD_DIR]   (default build-device; built here when it lacks
#          the programs, which needs meson; a build carried to the machine is used as it is)
#   DEVICE_CUDA_MIB: bench size (default 1024). WORK: scratch folder (default $BUILD_DIR/device).
# Exits 77 when no NVIDIA driver is loaded; otherwise non-zero when any step failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${1:-build-device}
size=${DEVICE_CUDA_MIB:-1024}
work=${WORK:-$build/device}
programs=(tests/cuda/test_cuda_real_driver bench/bench_cuda_register
          bench/bench_cuda_fallback_copy tools/wm-load examples/wm-gen-model)

if ! { ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [[ -e /dev/nvidiactl ]]; }; then
  echo "SKIP: no NVIDIA driver (libcuda.so.1) on this machine"
  exit 77
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader
missing=0
for p in "${programs[@]}"; do [[ -x $build/$p ]] || missing=1; done
if ((missing)); then
  bash scripts/build.sh "$build" -Dcuda=enabled -Dvulkan=disabled -Dhsa=disabled \
    "${programs[@]}" || exit 1
fi
mkdir -p "$work"
status=0
summary=()
step() { # NAME COMMAND...: runs it, logs to $work/NAME.log, records the outcome
  local name=$1; shift
  local start=$SECONDS rc=0
  echo "=== $name ==="
  "$@" 2>&1 | tee "$work/$name.log" || rc=${PIPESTATUS[0]}
  summary+=("$name: exit $rc, $((SECONDS - start)) s")
  ((rc == 0)) || status=1
}

step smoke "$build/tests/cuda/test_cuda_real_driver"
"$build/examples/wm-gen-model" --shape dense --layers 8 --size-mib 256 -o "$work/dense.gguf" \
  > /dev/null || status=1
# A discrete card is unavailable to the registry's "cuda" by design; the opt-in measures it.
export WEIGHTMAP_CUDA_ALLOW_DISCRETE=1
step wm-load-default "$build/tools/wm-load" --importer cuda --json "$work/dense.gguf"
step wm-load-always "$build/tools/wm-load" --importer cuda --import-policy always --json \
  "$work/dense.gguf"
step bench env TMPDIR="$work" "$build/bench/bench_cuda_register" "$size"
step fallback-copy env TMPDIR="$work" "$build/bench/bench_cuda_fallback_copy" "$size"

echo "=== summary ==="
printf '%s\n' "${summary[@]}"
for f in wm-load-default wm-load-always; do
  grep -o '"\(device_memory\|cuda_method\|registrations\|imports\|imported_bytes\|copied_bytes\|tensors_verified\|tensors_mismatched\)": *[^,}]*' \
    "$work/$f.log" | tr '\n' ' ' | sed "s/^/$f: /"
  echo
done
grep '^cuda_register ' "$work/bench.log" || status=1
grep '^cuda_read ' "$work/bench.log" || status=1
grep '^cuda_fallback_copy ' "$work/fallback-copy.log" || status=1
exit $status
