#!/usr/bin/env bash
# Fetch a pinned llama.cpp source tree without network access to any git host.
#
# node-llama-cpp (npm) ships the llama.cpp source it builds against as a git
# bundle holding one squashed commit. We take that bundle from a pinned npm
# release, verify the package version, the tarball hash and the bundle's
# commit id, clone it, check out the commit and apply our patches with `git am`.
#
# Usage: integrations/llama.cpp/fetch.sh [DEST]     (default: build-llama/src)
#
# Idempotent: re-running with the same pins and patches does nothing. If DEST
# has local changes the script refuses to touch it unless FORCE=1 is set.
# Installs nothing: needs git, tar, sha256sum on PATH; npm only when the tarball is not in the
# cache yet (build-llama/cache: a machine without network works from a carried tarball), and node
# or python3 to read the package's version.
set -euo pipefail

NPM_PKG="node-llama-cpp"
NPM_VERSION="3.22.1"
# sha256 of the tarball; it matches the registry's dist.integrity
# sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==
NPM_TGZ_SHA256="a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f"
LLAMA_COMMIT="de3ff815ea7d559ee917f063901b8986f038abc6"
BUNDLE_PATH="package/llama/gitRelease.bundle"
BRANCH="libweightmap"
AUTHOR_NAME="libweightmap"
AUTHOR_EMAIL="dev@libweightmap.invalid"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PATCH_DIR="$HERE/patches"
CACHE="$ROOT/build-llama/cache/npm-$NPM_PKG-$NPM_VERSION"

DEST="${1:-$ROOT/build-llama/src}"
case "$DEST" in /*) ;; *) DEST="$PWD/$DEST" ;; esac

die() { echo "fetch.sh: ERROR: $*" >&2; exit 1; }
log() { echo "fetch.sh: $*" >&2; }

for tool in git tar sha256sum; do
    command -v "$tool" >/dev/null || die "'$tool' not found on PATH"
done

# Deterministic identity for the commits that `git am` creates, so that the
# patched HEAD has the same id on every machine.
GIT=(git -c user.name="$AUTHOR_NAME" -c user.email="$AUTHOR_EMAIL"
         -c advice.detachedHead=false -c init.defaultBranch=main)

# ---------------------------------------------------------------- npm pack
mkdir -p "$CACHE"
TGZ="$CACHE/$NPM_PKG-$NPM_VERSION.tgz"
if [[ ! -s "$TGZ" ]]; then
    command -v npm >/dev/null || die "'npm' not found on PATH, and no $TGZ to work from"
    log "npm pack $NPM_PKG@$NPM_VERSION -> $CACHE"
    # npm's own cache too stays in the build directory
    (cd "$CACHE" && npm_config_cache="$CACHE/npm-cache" npm pack --silent "$NPM_PKG@$NPM_VERSION" >/dev/null)
    [[ -s "$TGZ" ]] || die "npm pack did not produce $TGZ"
fi
got_sha="$(sha256sum "$TGZ" | cut -d' ' -f1)"
if [[ "$got_sha" != "$NPM_TGZ_SHA256" ]]; then
    die "sha256 of $TGZ: expected $NPM_TGZ_SHA256, got $got_sha (delete it to re-download)"
fi

EXTRACT="$CACHE/extract"
if [[ ! -f "$EXTRACT/.done" ]]; then
    rm -rf "$EXTRACT"; mkdir -p "$EXTRACT"
    tar -xzf "$TGZ" -C "$EXTRACT" package/package.json "$BUNDLE_PATH"
    touch "$EXTRACT/.done"
fi

if command -v node >/dev/null; then
    got_version="$(node -p 'require(process.argv[1]).version' "$EXTRACT/package/package.json")"
elif command -v python3 >/dev/null; then
    got_version="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$EXTRACT/package/package.json")"
else
    die "neither node nor python3 on PATH to read the package's version"
fi
[[ "$got_version" == "$NPM_VERSION" ]] \
    || die "package version: expected $NPM_VERSION, got '${got_version}'"

BUNDLE="$EXTRACT/$BUNDLE_PATH"
[[ -s "$BUNDLE" ]] || die "bundle missing: $BUNDLE"
git bundle verify -q "$BUNDLE" >/dev/null 2>&1 || die "git bundle verify failed for $BUNDLE"
got_commit="$(git bundle list-heads "$BUNDLE" | awk '$2=="HEAD"{print $1}')"
[[ "$got_commit" == "$LLAMA_COMMIT" ]] \
    || die "bundle HEAD commit: expected $LLAMA_COMMIT, got '${got_commit}'"

# ---------------------------------------------------------------- patches
shopt -s nullglob
PATCHES=("$PATCH_DIR"/*.patch)
shopt -u nullglob
stamp_of() {
    { echo "$LLAMA_COMMIT"; for p in "${PATCHES[@]}"; do sha256sum "$p"; done; } \
        | sha256sum | cut -d' ' -f1
}
WANT_STAMP="$(stamp_of)"

# ---------------------------------------------------------------- clone
if [[ -d "$DEST/.git" ]]; then
    STAMP_FILE="$DEST/.git/libweightmap-fetch.stamp"
    if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$WANT_STAMP" ]] \
       && [[ -z "$(git -C "$DEST" status --porcelain --untracked-files=no)" ]]; then
        log "up to date: $DEST at $(git -C "$DEST" rev-parse HEAD) (base $LLAMA_COMMIT, ${#PATCHES[@]} patch(es))"
        exit 0
    fi
    if [[ -n "$(git -C "$DEST" status --porcelain --untracked-files=no)" && "${FORCE:-0}" != 1 ]]; then
        die "$DEST has local changes; commit/discard them or re-run with FORCE=1 to reset it"
    fi
    "${GIT[@]}" -C "$DEST" am --abort >/dev/null 2>&1 || true
    "${GIT[@]}" -C "$DEST" fetch -q "$BUNDLE" HEAD
else
    [[ ! -e "$DEST" || -z "$(ls -A "$DEST")" ]] || die "$DEST exists and is not a git clone"
    log "cloning $BUNDLE -> $DEST"
    mkdir -p "$(dirname "$DEST")"
    "${GIT[@]}" clone -q --no-checkout "$BUNDLE" "$DEST"
fi

git -C "$DEST" cat-file -e "$LLAMA_COMMIT^{commit}" 2>/dev/null \
    || die "commit $LLAMA_COMMIT not found in $DEST after fetching the bundle"
"${GIT[@]}" -C "$DEST" checkout -q -f -B "$BRANCH" "$LLAMA_COMMIT"
[[ "$(git -C "$DEST" rev-parse HEAD)" == "$LLAMA_COMMIT" ]] \
    || die "checkout: expected HEAD $LLAMA_COMMIT, got $(git -C "$DEST" rev-parse HEAD)"

if ((${#PATCHES[@]})); then
    log "applying ${#PATCHES[@]} patch(es) from $PATCH_DIR"
    "${GIT[@]}" -C "$DEST" am -q --committer-date-is-author-date "${PATCHES[@]}" \
        || die "git am failed; see $DEST (git -C $DEST am --abort to reset)"
fi

echo "$WANT_STAMP" > "$DEST/.git/libweightmap-fetch.stamp"
log "ready: $DEST at $(git -C "$DEST" rev-parse HEAD) (base $LLAMA_COMMIT, ${#PATCHES[@]} patch(es))"
