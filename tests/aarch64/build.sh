#!/bin/bash
# The static release binary for aarch64 (GB200/GB300 hosts: NVIDIA Grace CPUs), cross-compiled
# on an x86_64 Debian 12 machine with nothing fetched outside the package registries.
#
#   tests/aarch64/build.sh [CARGO BUILD ARGS...]   build; prints the binary's path on stdout
#                                                  (e.g. --features failpoints)
#   tests/aarch64/build.sh qemu                    prints the path of a qemu-aarch64 that runs it
#   tests/aarch64/build.sh deps                    installs and fetches what the two need, only
#
# What it takes, each installed or cached once (downloads under /var/tmp/nspawn-lifecycle-aarch64,
# AARCH64_CACHE):
# - the pinned compiler (rust-toolchain.toml) and the standard library's source of the very same
#   version, Debian's `rust-src` (trixie-backports, architecture all, through a private apt
#   configuration: the machine's sources are never touched), built with -Zbuild-std (a stable
#   compiler needs RUSTC_BOOTSTRAP=1 for it: set for that one cargo command only). rustup has no
#   aarch64 standard library to download here; the source is linked into the toolchain's sysroot
#   (lib/rustlib/src/rust), where cargo looks for it, unless one is there already;
# - Debian 12's gcc-aarch64-linux-gnu and libc6-dev-arm64-cross: the linker and the static glibc;
# - a user-mode emulator that implements openat2 (every rooted read needs it; Debian 12's qemu
#   7.2 answers ENOSYS): Debian trixie's qemu-user, a static-pie binary that runs on Debian 12,
#   unpacked into the cache, never installed.
# The binary: target/aarch64/aarch64-unknown-linux-gnu/release/nspawn-lifecycle-helper (its own
# target directory: the x86_64 build's artifacts stay as they are), statically linked by
# .cargo/config.toml's rustflags, which apply to every Linux GNU target.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${AARCH64_CACHE:-/var/tmp/nspawn-lifecycle-aarch64}
TARGET=aarch64-unknown-linux-gnu
log() { echo "tests/aarch64/build.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# shellcheck source=../lib/debian-mirror.sh
. tests/lib/debian-mirror.sh
# shellcheck source=../lib/private-apt.sh
. tests/lib/private-apt.sh

rust_version() { rustc --version | awk '{print $2}'; }

cross_gcc() {
    command -v aarch64-linux-gnu-gcc >/dev/null && [ -e /usr/aarch64-linux-gnu/lib/libc.a ] && return
    log "installing gcc-aarch64-linux-gnu libc6-dev-arm64-cross (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null
}

# The standard library's source for this compiler, linked into its sysroot.
std_source() {
    local ver sysroot src have pkg
    ver=$(rust_version)
    sysroot=$(rustc --print sysroot)
    src=$sysroot/lib/rustlib/src/rust
    if [ -e "$src/library/Cargo.lock" ]; then return; fi
    have=$CACHE/rust-src-$ver/usr/lib/rustlib/src/rust
    if [ ! -e "$have/library/Cargo.lock" ]; then
        log "fetching Debian's rust-src $ver (trixie-backports)"
        private_apt_download "$CACHE/apt-backports" trixie-backports "$CACHE/debs-backports" rust-src >/dev/null \
            || die "apt-get of trixie-backports failed"
        pkg=$(APT_CONFIG=$CACHE/apt-backports/apt.conf apt-cache madison rust-src \
            | awk -v v="$ver" '$3 ~ "^"v"[+]" {print $3; exit}')
        [ -n "$pkg" ] || die "trixie-backports has no rust-src $ver (rustc is $ver): $(APT_CONFIG=$CACHE/apt-backports/apt.conf apt-cache madison rust-src | awk '{print $3}' | tr '\n' ' ')"
        rm -f "$CACHE/debs-backports"/rust-src_*.deb
        (cd "$CACHE/debs-backports" && private_apt "$CACHE/apt-backports" download "rust-src=$pkg" >&2) \
            || die "downloading rust-src=$pkg failed"
        rm -rf "$CACHE/rust-src-$ver.new"
        dpkg-deb -x "$CACHE/debs-backports"/rust-src_*.deb "$CACHE/rust-src-$ver.new"
        rm -rf "$CACHE/rust-src-$ver"
        mv "$CACHE/rust-src-$ver.new" "$CACHE/rust-src-$ver"
    fi
    [ -e "$have/library/Cargo.lock" ] || die "$have has no library/Cargo.lock"
    mkdir -p "${src%/*}"
    [ -L "$src" ] && rm -f "$src"
    ln -s "$have" "$src"
    log "standard library source: $src -> $have"
}

qemu() {
    local q=$CACHE/qemu/usr/bin/qemu-aarch64
    if [ ! -x "$q" ]; then
        log "fetching trixie's qemu-user (unpacked into $CACHE/qemu, not installed)"
        private_apt_download "$CACHE/apt-trixie" trixie "$CACHE/debs-trixie" qemu-user >/dev/null \
            || die "apt-get of trixie's qemu-user failed"
        rm -rf "$CACHE/qemu.new"
        dpkg-deb -x "$CACHE/debs-trixie"/qemu-user_*.deb "$CACHE/qemu.new"
        rm -rf "$CACHE/qemu"
        mv "$CACHE/qemu.new" "$CACHE/qemu"
    fi
    "$q" --version >/dev/null || die "$q does not run here"
    printf '%s\n' "$q"
}

mkdir -p "$CACHE"
case ${1:-} in
    qemu) qemu; exit 0;;
    deps) cross_gcc; std_source; qemu >/dev/null; exit 0;;
esac
cross_gcc
std_source
dir=target/aarch64
for a in "$@"; do case $a in --target-dir*) die "the target directory is $dir";; esac; done
RUSTC_BOOTSTRAP=1 CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    cargo build --locked --release --target "$TARGET" -Zbuild-std=std,panic_abort \
    --target-dir "$dir" "$@" >&2
bin=$PWD/$dir/$TARGET/release/nspawn-lifecycle-helper
file "$bin" | grep -q 'ARM aarch64' || die "$bin is not an aarch64 binary: $(file "$bin")"
file "$bin" | grep -Eq 'static-pie linked|statically linked' || die "$bin is not static: $(file "$bin")"
printf '%s\n' "$bin"
