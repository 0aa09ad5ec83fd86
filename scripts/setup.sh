#!/usr/bin/env bash
# setup.sh - owns getting from a bare Debian 12 machine to a built tree:
#   1. installs the Debian packages the build and tests need (only the missing ones);
#   2. fetches the pinned llama.cpp release (a git bundle inside an npm package)
#      and checks it against the recorded sha512 integrity;
#   3. clones it into build/llama.cpp (build-owned, re-cloned whenever the pin
#      or a patch changes, never patched in place twice) and applies
#      patches/llama.cpp/*.patch, each checked with `git apply --check` first;
#   4. configures and builds libguanaco, its tools and the patched llama.cpp.
# Both README commands and .ci/run start here. Downloads are cached in .cache/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="$ROOT/.cache"
LLAMA_SRC="$ROOT/build/llama.cpp"
BUILD="$ROOT/build/cmake"
# shellcheck source=../patches/llama.cpp/PIN
source "$ROOT/patches/llama.cpp/PIN"

say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

install_packages() {
    local wanted=(gcc g++ make cmake ninja-build pkg-config git openssl ca-certificates
                  liburing-dev libjansson-dev gnuplot-nox fio util-linux time curl npm
                  clang libclang-rt-dev) # clang and libFuzzer: the tests/fuzz harnesses
    local missing=()
    for package in "${wanted[@]}"; do
        if [ "$package" = npm ] && command -v npm >/dev/null; then continue; fi
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing Debian packages (${missing[*]}); run as root or install them"
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

fetch_release() {
    local tarball="$CACHE/npm/${LLAMA_NPM_PACKAGE/@/-}.tgz"
    mkdir -p "$CACHE/npm"
    if [ ! -f "$tarball" ]; then
        say "fetching $LLAMA_NPM_PACKAGE"
        (cd "$CACHE/npm" && npm pack "$LLAMA_NPM_PACKAGE" --silent >/dev/null) || die "npm pack $LLAMA_NPM_PACKAGE failed"
    fi
    local integrity
    integrity="sha512-$(openssl dgst -sha512 -binary "$tarball" | openssl base64 -A)"
    if [ "$integrity" != "$LLAMA_NPM_INTEGRITY" ]; then
        rm -f "$tarball"
        die "$LLAMA_NPM_PACKAGE integrity mismatch: got $integrity, expected $LLAMA_NPM_INTEGRITY (tarball deleted)"
    fi
    BUNDLE="$CACHE/llama.cpp-$LLAMA_COMMIT.bundle"
    if [ ! -f "$BUNDLE" ]; then
        tar -xzf "$tarball" -C "$CACHE" package/llama/gitRelease.bundle
        mv "$CACHE/package/llama/gitRelease.bundle" "$BUNDLE"
        rm -rf "$CACHE/package"
    fi
}

# A fingerprint of everything the patched tree depends on.
patched_tree_stamp() {
    { echo "$LLAMA_COMMIT"; cat "$ROOT"/patches/llama.cpp/*.patch; } | sha256sum | cut -d' ' -f1
}

prepare_source() {
    local stamp_file="$LLAMA_SRC/.guanaco-stamp" stamp
    stamp=$(patched_tree_stamp)
    if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
        return 0
    fi
    say "cloning llama.cpp $LLAMA_COMMIT into build/llama.cpp"
    rm -rf "$LLAMA_SRC"
    mkdir -p "$(dirname "$LLAMA_SRC")"
    git clone -q "$BUNDLE" "$LLAMA_SRC" 2>/dev/null || die "cannot clone $BUNDLE"
    git -C "$LLAMA_SRC" -c advice.detachedHead=false checkout -q "$LLAMA_COMMIT" || die "bundle lacks commit $LLAMA_COMMIT"
    for patch in "$ROOT"/patches/llama.cpp/*.patch; do
        if ! git -C "$LLAMA_SRC" apply --check "$patch" 2>/tmp/guanaco-apply.$$; then
            cat /tmp/guanaco-apply.$$ >&2; rm -f /tmp/guanaco-apply.$$
            die "patch $(basename "$patch") does not apply to llama.cpp $LLAMA_COMMIT"
        fi
        git -C "$LLAMA_SRC" apply "$patch" || die "patch $(basename "$patch") failed to apply"
        say "applied $(basename "$patch")"
    done
    rm -f /tmp/guanaco-apply.$$
    echo "$stamp" > "$stamp_file"
}

build() {
    local launcher=()
    if command -v ccache >/dev/null; then
        launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    fi
    if [ ! -f "$BUILD/build.ninja" ]; then
        cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >"$ROOT/build/cmake-configure.log" 2>&1 \
            || { tail -30 "$ROOT/build/cmake-configure.log" >&2; die "cmake configure failed (build/cmake-configure.log)"; }
    fi
    say "building (log: build/build.log)"
    local start=$SECONDS
    if ! cmake --build "$BUILD" --target guanaco-all >"$ROOT/build/build.log" 2>&1; then
        grep -E 'error|Error' "$ROOT/build/build.log" | head -30 >&2
        die "build failed (build/build.log)"
    fi
    say "built in $((SECONDS - start)) s: $BUILD/bin"
}

install_packages
fetch_release
prepare_source
[ "${1:-}" = "--source-only" ] && exit 0
build
