#!/usr/bin/env bash
# wm-doctor against the load it predicts: for each device of the fake CUDA driver (gb10, orin,
# gh200, h200), the fake HSA runtime (read-only locks accepted, refused) and lavapipe, wm-doctor
# --engine library --json and then wm-load --json (wm::load_model, the same importer, model and
# default policy), one line each, parsed by tooling:
#   wm-doctor model=<file> device=<name> method=<...> import_mib=<n> copy_mib=<n> agrees_with_load=<yes|no>
# agrees: the doctor's device and imported bytes are the load's (scripts/doctor_line.py). A control must disagree:
# the doctor told a tensor alignment the load does not use (every tensor off a 64 KiB boundary
# copied) against the plain load. Bad input must fail with one line naming the file or option.
#   Usage: scripts/doctor-check.sh [BUILD_DIR]   (default: build; meson test runs it)
# Exit: 1 when a line disagrees, the control agrees, or an error case is not reported as one.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
doctor=$build/tools/wm-doctor wm_load=$build/tools/wm-load
cuda=$build/tests/cuda/libfake_cuda_driver.so hsa=$build/tests/hsa/libfake_hsa_runtime.so
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=$work/dense.gguf
"$build/examples/wm-gen-model" --shape dense --layers 4 --size-mib 24 -o "$model" > /dev/null ||
  { echo "doctor-check: wm-gen-model failed" >&2; exit 1; }
status=0

check() { # DEVICE BACKEND [DOCTOR_ARGS...] : ENV... via the caller
  local device=$1 backend=$2 line; shift 2
  "$doctor" --engine library --backend "$backend" --json "$@" "$model" > "$work/$device.doctor" \
    2> "$work/$device.doctor.err" || { echo "doctor-check: wm-doctor failed for $device:" >&2; cat "$work/$device.doctor.err" >&2; status=1; return; }
  "$wm_load" --importer "$backend" --json "$model" > "$work/$device.load" 2> "$work/$device.load.err"
  line=$(python3 "$root/scripts/doctor_line.py" "$work/$device.doctor" "$(basename "$model")" "$device" \
    "wm-load:$work/$device.load")
  echo "$line"
  [[ $line == *" agrees_with_load=yes" ]] || { status=1; cat "$work/$device.load.err" >&2; }
}

for m in gb10 orin gh200 h200; do
  WEIGHTMAP_CUDA_LIBRARY=$cuda WEIGHTMAP_FAKE_CUDA_MODEL=$m check "cuda-$m" cuda
done
WEIGHTMAP_HSA_LIBRARY=$hsa WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY=0 check hsa-read-only hsa
WEIGHTMAP_HSA_LIBRARY=$hsa WEIGHTMAP_FAKE_HSA_REFUSE_READ_ONLY=1 check hsa-refused hsa
check vulkan vulkan

# The control: the doctor planned with a tensor alignment the load does not have.
line=$(WEIGHTMAP_CUDA_LIBRARY=$cuda WEIGHTMAP_FAKE_CUDA_MODEL=gb10 check cuda-gb10-control cuda --tensor-alignment 65536)
echo "control: $line"
[[ $line == *" agrees_with_load=no" ]] ||
  { echo "doctor-check: the control agreed: the comparison cannot fail" >&2; status=1; }

# The lease's "no": as root every lease is possible (CI runs as root), so a user that does not
# own the file asks; the doctor must say no and why (fcntl F_SETLEASE's refusal).
if (($(id -u) == 0)) && command -v setpriv > /dev/null; then
  chmod 755 "$work"
  setpriv --reuid=nobody --regid=nogroup --clear-groups "$doctor" --backend vulkan --json "$model" \
    > "$work/lease.json" 2> "$work/lease.err" || true
  python3 -c 'import json, sys; f = json.load(open(sys.argv[1]))["file"]; sys.exit(0 if not f["lease"] and "F_SETLEASE" in f["lease_reason"] else 1)' \
    "$work/lease.json" 2> /dev/null && echo "wm-doctor lease as nobody: no, with the kernel's reason" ||
    { echo "doctor-check: wm-doctor run as nobody did not say why no lease is possible:" >&2; cat "$work/lease.json" "$work/lease.err" >&2; status=1; }
else
  echo "wm-doctor lease as nobody: not checked (needs root and setpriv)"
fi

# Bad input: exit 1 and one line naming what is wrong.
expect_error() { # PATTERN ARGS...
  local pattern=$1 rc=0 err; shift
  err=$("$doctor" "$@" 2>&1 > /dev/null) || rc=$?
  if ((rc != 1)) || [[ $err != *"$pattern"* ]] || (($(wc -l <<< "$err") != 1)); then
    echo "doctor-check: wm-doctor $* exited $rc with '$err', expected 1 and '$pattern'" >&2
    status=1
  fi
}
expect_error "$work/missing.gguf" "$work/missing.gguf"
expect_error "--backend nope: no such importer" --backend nope "$model"
head -c 100 "$model" > "$work/cut.gguf"
expect_error "$work/cut.gguf" "$work/cut.gguf"
exit $status
