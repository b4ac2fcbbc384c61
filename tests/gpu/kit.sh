#!/bin/bash
# The companion of tests/gpu/run.sh: everything the GPU proof needs, gathered on a machine with
# the package mirror (this one, Debian 12), so the GPU host needs nothing from outside and gets
# nothing installed.
#
#   kit.sh OUT      build the kit into OUT (made afresh; about 72 MiB, 28 MiB packed), print OUT's manifest
#
# OUT holds:
#   bin/nspawn-lifecycle-helper     the product's static release binary (cargo build --release)
#   bin/nspawn-lifecycle-helper-fp  the same with crash points (--features failpoints), whose
#                                   hidden `rewire-root` runs post-start's own plan and executor
#                                   against a machine rootfs on disk (no systemd on the GPU host)
#   bin/cdi_inject                  examples/cdi_inject.rs: the official CDI library applying a
#                                   spec to an OCI config, as a CDI-aware runtime does (static)
#   bin/nvidia-ctk, bin/nvidia-cdi-hook   NVIDIA's own tools (tests/lib/nvidia-tools.sh)
#   bin/runc + lib/                 Debian 12's runc with Debian 12's glibc and libseccomp, relinked
#                                   (patchelf) to the loader at $KIT_LINK/lib, the fixed path
#                                   run.sh links the kit to while it runs (an ELF interpreter must
#                                   be absolute), so runc needs no library of the GPU host
#   image/                          a container image with no driver: Debian 12's glibc, ldconfig,
#                                   tests/gpu/cuda-probe (built here with gcc)
#   runc-template.json              `runc spec`'s default config
#   MANIFEST                        what each piece is (versions, checksums)
#
# Also checks, with no GPU, what can be checked here: the PTX kernel of cuda-probe.c compiles for
# the GPUs the proof targets (sm_80 A100, sm_90 H100/H200/GH200, sm_100 B200/GB200 where the
# assembler knows it) with NVIDIA's ptxas from Debian's non-free nvidia-cuda-toolkit, fetched
# through a private apt configuration (the machine's sources are never touched) and cached in
# /var/tmp/nspawn-lifecycle-gpu-kit (GPU_KIT_CACHE).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${GPU_KIT_CACHE:-/var/tmp/nspawn-lifecycle-gpu-kit}
GLIBC_LIBS=(ld-linux-x86-64.so.2 libc.so.6 libdl.so.2 libm.so.6 libpthread.so.0 librt.so.1)

die() { echo "kit.sh: $*" >&2; exit 1; }
[ $# = 1 ] || { echo "usage: kit.sh OUT" >&2; exit 2; }
OUT=$1
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
[ "$(uname -m)" = x86_64 ] || die "the kit is built for x86_64 GPU hosts; this is $(uname -m)"

# KIT_LINK: where run.sh links the kit while it runs; the relinked runc's interpreter is under it.
# shellcheck source=lib.sh
. "$HERE/lib.sh"
# shellcheck source=../lib/debian-mirror.sh
. "$HERE/../lib/debian-mirror.sh"
# shellcheck source=../lib/private-apt.sh
. "$HERE/../lib/private-apt.sh"
# shellcheck source=../lib/apt-need.sh
. "$HERE/../lib/apt-need.sh"
# shellcheck source=../lib/nvidia-tools.sh
. "$HERE/../lib/nvidia-tools.sh"

apt_need runc:runc patchelf:patchelf gcc:gcc strip:binutils ldconfig:libc-bin || die "the tools above are needed"

# ptxas (NVIDIA's PTX assembler), cached once: the kernel is checked before any GPU sees it.
ptxas() {
    local root=$CACHE/cuda-toolkit
    if [ ! -x "$root/usr/bin/ptxas" ]; then
        mkdir -p "$CACHE"
        exec 8>"$CACHE.lock"
        flock 8
        if [ ! -x "$root/usr/bin/ptxas" ]; then
            local mirror
            mirror=$(debian_mirror) || true
            [ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources.list.d/debian.sources"
            rm -rf "$CACHE/apt/status" "$CACHE/debs" "$root.tmp"
            private_apt_init "$CACHE/apt" amd64
            echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main non-free" \
                >"$CACHE/apt/etc/sources.list"
            private_apt "$CACHE/apt" update >&2 || die "apt-get update of trixie non-free failed"
            mkdir -p "$CACHE/debs"
            (cd "$CACHE/debs" && private_apt "$CACHE/apt" download nvidia-cuda-toolkit >&2) ||
                die "apt-get download nvidia-cuda-toolkit failed"
            dpkg-deb -x "$CACHE"/debs/nvidia-cuda-toolkit_*.deb "$root.tmp"
            [ -x "$root.tmp/usr/bin/ptxas" ] || die "Debian's nvidia-cuda-toolkit has no usr/bin/ptxas"
            rm -rf "$root" "$CACHE/debs"
            mv "$root.tmp" "$root"
        fi
        exec 8>&-
    fi
    "$root/usr/bin/ptxas" "$@"
}

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/image"
cd "$REPO"
target=$(rustc -vV | sed -n 's/^host: //p')

echo "kit.sh: building the helper and its failpoints build (release), and cdi_inject" >&2
cargo build --locked --release >&2
cargo build --locked --release --features failpoints --target-dir target/failpoints >&2
# cdi_inject is a tool of the test, timed nowhere: the dev profile, whose dependencies `cargo
# test` has built already (the release profile would build ~170 crates again for it), stripped.
cargo build --locked --example cdi_inject >&2
cp "target/$target/release/nspawn-lifecycle-helper" "$OUT/bin/"
cp "target/failpoints/$target/release/nspawn-lifecycle-helper" "$OUT/bin/nspawn-lifecycle-helper-fp"
cp "target/$target/debug/examples/cdi_inject" "$OUT/bin/"
strip "$OUT/bin/cdi_inject"
for b in nspawn-lifecycle-helper nspawn-lifecycle-helper-fp cdi_inject; do
    file "$OUT/bin/$b" | grep -Eq 'static-pie linked|statically linked' || die "$b is not static"
done
for t in nvidia-ctk nvidia-cdi-hook; do
    cp "$(nvidia_tool "$t")" "$OUT/bin/$t" || die "NVIDIA's $t is needed (see above)"
done

# runc and its libraries, from this Debian 12 machine.
cp /usr/sbin/runc "$OUT/bin/runc"
for l in "${GLIBC_LIBS[@]}" libseccomp.so.2; do
    cp -L "/lib/x86_64-linux-gnu/$l" "$OUT/lib/$l"
done
patchelf --set-interpreter "$KIT_LINK/lib/ld-linux-x86-64.so.2" --force-rpath \
    --set-rpath "$KIT_LINK/lib" "$OUT/bin/runc"
# Unresolved libraries would only show on the GPU host: every NEEDED must be in lib/.
for n in $(patchelf --print-needed "$OUT/bin/runc"); do
    [ -e "$OUT/lib/$n" ] || die "runc needs $n, which the kit lacks"
done
runc spec --bundle "$OUT" && mv "$OUT/config.json" "$OUT/runc-template.json"

# The image: glibc, ldconfig, the probe; nothing of NVIDIA.
gcc -O2 -Wall -Wextra -Werror -o "$OUT/image/cuda-probe" "$HERE/cuda-probe.c"
img=$OUT/image
mkdir -p "$img"/{usr/lib/x86_64-linux-gnu,usr/bin,usr/sbin,etc/ld.so.conf.d,proc,sys,dev,tmp,run}
for l in "${GLIBC_LIBS[@]}"; do cp -L "/lib/x86_64-linux-gnu/$l" "$img/usr/lib/x86_64-linux-gnu/$l"; done
cp -L /sbin/ldconfig "$img/usr/sbin/ldconfig"
ln -s usr/lib "$img/lib"
ln -s usr/bin "$img/bin"
ln -s usr/sbin "$img/sbin"
mkdir -p "$img/usr/lib64"
ln -s usr/lib64 "$img/lib64"
ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$img/usr/lib64/ld-linux-x86-64.so.2"
echo /usr/lib/x86_64-linux-gnu >"$img/etc/ld.so.conf.d/x86_64-linux-gnu.conf"
echo 'include /etc/ld.so.conf.d/*.conf' >"$img/etc/ld.so.conf"
cp /etc/os-release "$img/etc/os-release"
echo 'root:x:0:0:root:/root:/bin/sh' >"$img/etc/passwd"
echo 'root:x:0:' >"$img/etc/group"
ldconfig -r "$img"
# The probe runs in the image as built: its loader and libraries resolve there.
chroot "$img" /cuda-probe noop || die "the probe does not run in the image"

# The kernel, assembled for each target the proof may meet (ptxas -arch=sm_XX accepts PTX for
# targets at least as new as the PTX's .target).
sed -n '/^static const char PTX\[\] =/,/;$/p' "$HERE/cuda-probe.c" |
    sed -n 's/^ *"\(.*\)\\n"[;]*$/\1/p' >"$OUT/probe.ptx"
grep -q '^\.entry\|^\.visible \.entry fill' "$OUT/probe.ptx" || die "could not extract the PTX from cuda-probe.c"
archs=()
for a in sm_80 sm_90 sm_100; do
    if msg=$(ptxas -arch="$a" -o "$OUT/probe.$a.cubin" "$OUT/probe.ptx" 2>&1); then
        archs+=("$a")
    elif [ "$a" = sm_100 ] && grep -q "Value 'sm_100' is not defined" <<<"$msg"; then
        echo "kit.sh: this ptxas predates sm_100 (Blackwell): $(ptxas --version | tail -1)" >&2
    else
        die "ptxas rejects the probe's kernel for $a: $msg"
    fi
done
rm -f "$OUT"/probe.*.cubin

{
    echo "helper $("$OUT/bin/nspawn-lifecycle-helper" --version | paste -sd " ")"
    echo "helper-failpoints $("$OUT/bin/nspawn-lifecycle-helper-fp" --version | paste -sd " ")"
    echo "runc $(/usr/sbin/runc --version | head -1) (Debian $(cat /etc/debian_version))"
    echo "glibc $(/lib/x86_64-linux-gnu/libc.so.6 | head -1)"
    echo "nvidia-ctk $("$OUT/bin/nvidia-ctk" --version 2>&1 | head -1)"
    echo "ptxas $(ptxas --version | tail -1): kernel assembled for ${archs[*]}"
    (cd "$OUT" && find bin lib image -type f -print0 | sort -z | xargs -0 sha256sum)
} >"$OUT/MANIFEST"
head -6 "$OUT/MANIFEST"
echo "kit.sh: $(du -sh "$OUT" | cut -f1) in $OUT" >&2
