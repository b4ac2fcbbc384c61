#!/bin/bash
# The OCI runtimes the adversarial CDI-hook suite runs, from both Debian releases the project
# meets: bookworm's runc and crun (the machine's own apt, as tests/cdi_runtime.rs installs them)
# and trixie's, fetched with `apt-get download` through a PRIVATE apt configuration (the
# machine's sources are never touched), extracted with the trixie libraries they need, and
# relinked with patchelf to trixie's own loader and libraries under the cache, so they run on
# this bookworm machine without replacing anything of it.
#
#   fetch-runtimes.sh        print one line per runtime: NAME VERSION PATH
#
# Cache: /var/tmp/nspawn-lifecycle-runtimes (RUNTIMES_CACHE). Offline once cached.
set -euo pipefail

CACHE=${RUNTIMES_CACHE:-/var/tmp/nspawn-lifecycle-runtimes}
# What trixie's runc and crun link (ldd of each, on trixie), pinned by name; the versions are
# whatever the mirror's trixie has, printed and checked below.
PKGS=(runc crun libc6 libseccomp2 libyajl2 libcap2 libsystemd0 libgcrypt20 libgpg-error0
    liblz4-1 liblzma5 libzstd1)

die() { echo "fetch-runtimes.sh: $*" >&2; exit 1; }

# shellcheck source=../lib/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/debian-mirror.sh"
# shellcheck source=../lib/private-apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/private-apt.sh"
# shellcheck source=../lib/apt-need.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/apt-need.sh"

apt_need runc:runc crun:crun patchelf:patchelf || die "the tools above are needed"

T=$CACHE/trixie
if [ ! -x "$T/bin/runc" ] || [ ! -x "$T/bin/crun" ]; then
    mkdir -p "$CACHE"
    exec 9>"$CACHE.lock"
    flock 9
fi
if [ ! -x "$T/bin/runc" ] || [ ! -x "$T/bin/crun" ]; then
    rm -rf "$T"
    private_apt_download "$CACHE/apt" trixie "$CACHE/debs" "${PKGS[@]}" || die "fetching trixie's runtimes failed"
    root=$CACHE/root.tmp
    rm -rf "$root"
    for deb in "$CACHE"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done
    lib=$T/lib
    mkdir -p "$lib" "$T/bin"
    cp -a "$root"/usr/lib/x86_64-linux-gnu/. "$lib/"
    [ -e "$lib/ld-linux-x86-64.so.2" ] || die "trixie's libc6 has no ld-linux-x86-64.so.2"
    for b in runc crun; do
        src=$(ls "$root"/usr/sbin/$b "$root"/usr/bin/$b 2>/dev/null | head -1 || true)
        [ -n "$src" ] || die "trixie's $b package has no $b binary"
        cp "$src" "$T/bin/$b"
        # RPATH (not RUNPATH): it also applies to the libraries' own dependencies.
        patchelf --set-interpreter "$lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib" "$T/bin/$b"
    done
    rm -rf "$root"
fi

version() { "$1" --version 2>/dev/null | sed -n '1s/.* version //p'; }
for b in /usr/sbin/runc /usr/bin/crun "$T/bin/runc" "$T/bin/crun"; do
    [ -x "$b" ] || die "$b is missing"
    v=$(version "$b")
    [ -n "$v" ] || die "$b --version prints no version: $("$b" --version 2>&1 | head -3)"
    case $b in
        "$T"/*) rel=trixie ;;
        *) rel=bookworm ;;
    esac
    echo "$(basename "$b")-$rel $v $b"
done
