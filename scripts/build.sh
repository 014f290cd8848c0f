#!/usr/bin/env bash
# Configures (once) and builds a Meson build directory. Usage: build.sh DIR [meson options...]
set -euo pipefail
dir=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [[ ! -f "$dir/build.ninja" ]]; then
  meson setup "$dir" --wrap-mode=nodownload "$@"
fi
ninja -C "$dir"
