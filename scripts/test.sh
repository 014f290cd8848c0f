#!/usr/bin/env bash
# Sets everything up and runs every test: the README's test command, and what .ci/run calls.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
# Warnings are errors in CI builds.
bash scripts/build.sh build-ci --werror -Dvulkan=enabled -Dhsa=enabled
meson test -C build-ci --print-errorlogs
