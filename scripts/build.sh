#!/usr/bin/env bash
# Configures (once) and builds a Meson build directory.
# Usage: build.sh DIR [meson options (-X...)] [ninja targets...]
set -euo pipefail
dir=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
options=()
targets=()
for arg in "$@"; do
  if [[ $arg == -* ]]; then options+=("$arg"); else targets+=("$arg"); fi
done
if [[ ! -f "$dir/build.ninja" ]]; then
  meson setup "$dir" --wrap-mode=nodownload "${options[@]}"
fi
ninja -C "$dir" "${targets[@]}"
