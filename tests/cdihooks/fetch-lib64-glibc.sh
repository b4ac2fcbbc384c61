#!/bin/bash
# A glibc whose loader searches only /lib64, /usr/lib64, /lib and /usr/lib (the RHEL/UBI/Rocky
# layout NVIDIA publishes CUDA images on): Debian's libc6-amd64:i386 package, which is the x86_64
# glibc of the i386 port, installed under /lib64. Fetched with `apt-get download` through a
# PRIVATE apt configuration (the machine's apt sources and dpkg architecture list are never
# touched), cached, and extracted once.
#
#   fetch-lib64-glibc.sh DIR   print DIR-independent cache path of the extracted package tree
#                              (…/root, holding lib64/ld-linux-x86-64.so.2 and lib64/libc.so.6)
#
# Cache: /var/tmp/nspawn-lifecycle-cdihooks (CDIHOOKS_CACHE). Offline once cached.
set -euo pipefail

CACHE=${CDIHOOKS_CACHE:-/var/tmp/nspawn-lifecycle-cdihooks}
PKG=libc6-amd64:i386

die() { echo "fetch-lib64-glibc.sh: $*" >&2; exit 1; }

# shellcheck source=../lib/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/debian-mirror.sh"
# shellcheck source=../lib/private-apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/private-apt.sh"

if [ -e "$CACHE/root/lib64/ld-linux-x86-64.so.2" ]; then
    echo "$CACHE/root"
    exit 0
fi

# Tests run in parallel: on a cold cache two of them fetch at once, and two apt-get runs in one
# private apt directory corrupt its package cache ("Problem renaming … pkgcache.bin"). One fetch
# at a time; whoever waited finds the tree the first one extracted.
mkdir -p "$(dirname "$CACHE")"
exec 9>"$CACHE.lock"
flock 9
if [ -e "$CACHE/root/lib64/ld-linux-x86-64.so.2" ]; then
    echo "$CACHE/root"
    exit 0
fi

mirror=$(debian_mirror) || true
[ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources.list.d/debian.sources"
rm -f "$CACHE/apt/status"
private_apt_init "$CACHE/apt" amd64 i386
mkdir -p "$CACHE/debs"
# The host's release (bookworm): the glibc of the same version as the gcc that builds the probe.
echo "deb [arch=i386 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm main" \
    >"$CACHE/apt/etc/sources.list"
private_apt "$CACHE/apt" update >&2 || die "apt-get update failed"
(cd "$CACHE/debs" && private_apt "$CACHE/apt" download "$PKG" >&2) || die "apt-get download $PKG failed"
deb=$(ls "$CACHE"/debs/libc6-amd64_*_i386.deb | head -1)
rm -rf "$CACHE/root.tmp"
dpkg-deb -x "$deb" "$CACHE/root.tmp"
[ -e "$CACHE/root.tmp/lib64/ld-linux-x86-64.so.2" ] || die "$deb has no lib64/ld-linux-x86-64.so.2"
mv "$CACHE/root.tmp" "$CACHE/root"
echo "$CACHE/root"
