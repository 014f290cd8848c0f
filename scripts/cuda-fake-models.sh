#!/usr/bin/env bash
# Loads one generated model through the CUDA importer on the fake driver once per device model
# (tests/cuda/fake_cuda_driver.cpp; docs/cuda.md has the table and its sources) and prints one
# line each, parsed by tooling:
#   cuda model=<name> method=<direct|register|copy|unavailable> registrations=<n> imported_bytes=<n> copied_bytes=<n> verified=<yes|no>
# method=copy: the importer is available but the policy copies (GH200: HBM of its own).
# Each line is wm-load --importer cuda under the default import policy. Exits non-zero unless
# every model's method is the one the table gives and every loaded device byte was verified
# through the fake device; the discrete cards must also register (and verify) under
# --import-policy always (reported on stderr only).
#   Usage: scripts/cuda-fake-models.sh [BUILD_DIR]   (default: build; meson test runs it)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
wm_load=$build/tools/wm-load
export WEIGHTMAP_CUDA_LIBRARY=$build/tests/cuda/libfake_cuda_driver.so
unset WEIGHTMAP_CUDA_ALLOW_DISCRETE
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/examples/wm-gen-model" --shape dense --layers 4 --size-mib 24 -o "$work/dense.gguf" \
  > /dev/null || { echo "cuda-fake-models: wm-gen-model failed" >&2; exit 1; }

# The method each model must get under the default policy (docs/cuda.md).
declare -A expected=([orin]=register [gh200]=copy [gb10]=direct [h200]=unavailable
                     [b300]=unavailable [tegra-x1]=unavailable)
# One summary from wm-load's JSON (an empty file: it refused to load).
summarize() { # MODEL JSON_FILE
  python3 - "$1" "$2" <<'PY'
import json, sys
model, path = sys.argv[1], sys.argv[2]
text = open(path).read().strip()
if not text:
    print(f"cuda model={model} method=unavailable registrations=0 imported_bytes=0 "
          f"copied_bytes=0 verified=no")
    sys.exit()
r = json.loads(text)
ok = r["tensors_mismatched"] == 0 and r["tensors_verified"] > 0
method = r['cuda_method'] if r['imported_bytes'] > 0 else "copy"
print(f"cuda model={model} method={method} registrations={r['registrations']} "
      f"imported_bytes={r['imported_bytes']} copied_bytes={r['copied_bytes']} "
      f"verified={'yes' if ok else 'no'}")
PY
}

status=0
for model in orin gh200 gb10 h200 b300 tegra-x1; do
  WEIGHTMAP_FAKE_CUDA_MODEL=$model "$wm_load" --importer cuda --json "$work/dense.gguf" \
    > "$work/$model.json" 2> "$work/$model.err"
  line=$(summarize "$model" "$work/$model.json")
  echo "$line"
  [[ $line == *" method=${expected[$model]} "* ]] || { status=1; cat "$work/$model.err" >&2; }
  if [[ ${expected[$model]} != unavailable && $line != *" verified=yes" ]]; then status=1; fi
done
declare -A always=([h200]=register [b300]=register [gh200]=direct)
for model in h200 b300 gh200; do
  WEIGHTMAP_FAKE_CUDA_MODEL=$model "$wm_load" --importer cuda --import-policy always --json \
    "$work/dense.gguf" > "$work/$model-always.json" 2> "$work/$model-always.err"
  line=$(summarize "$model" "$work/$model-always.json")
  echo "under --import-policy always: $line" >&2
  [[ $line == *" method=${always[$model]} "*" verified=yes" ]] || { status=1; cat "$work/$model-always.err" >&2; }
done
exit $status
