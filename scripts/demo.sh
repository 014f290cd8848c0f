#!/usr/bin/env bash
# Sets everything up and runs the main job. Usage: demo.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
bash scripts/build.sh build
./build/examples/plan_synthetic
