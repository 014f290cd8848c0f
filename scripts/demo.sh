#!/usr/bin/env bash
# Sets everything up and runs the main job: generate a MoE-shaped GGUF model (experts on the CPU,
# as llama.cpp's --cpu-moe places them), show its plan with wm-plan, then load it twice with
# wm-load through the embedded default importer (lavapipe Vulkan where Mesa is installed, else the
# CPU) -- once importing, once copying (--copy, the control arm) -- and print both side by side.
# Setup and build print one line each; their output goes to DEMO_DIR/setup.log and build.log,
# shown only when they fail.
#   DEMO_SIZE_MIB (default 320), DEMO_DIR (default build/demo)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source scripts/quiet.sh

size=${DEMO_SIZE_MIB:-320}
dir=${DEMO_DIR:-build/demo}
run_quietly "installing dependencies (scripts/setup.sh)" "$dir/setup.log" bash scripts/setup.sh
run_quietly "building (scripts/build.sh build)" "$dir/build.log" bash scripts/build.sh build
mkdir -p "$dir"
model=$dir/demo-moe.gguf
./build/examples/wm-gen-model --shape moe --layers 12 --experts 16 --size-mib "$size" -o "$model"

echo
echo "=== wm-plan --cpu-moe (what would be imported; reads headers only) ==="
./build/tools/wm-plan --cpu-moe "$model" | tail -n 4
echo
echo "=== wm-load: import arm, then --copy control arm (each verifies every device tensor) ==="
./build/tools/wm-load --cpu-moe --json "$model" > "$dir/import.json"
./build/tools/wm-load --cpu-moe --copy --json "$model" > "$dir/copy.json"
./build/examples/wm-ab-table "$dir/import.json" "$dir/copy.json"
