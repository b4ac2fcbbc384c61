#!/bin/bash
# A real NVIDIA driver's userspace files, for tests: Debian trixie's non-free
# nvidia-graphics-drivers packages (plus the few other packages a Debian driver install pulls in
# that ship driver files: egl-gbm, egl-wayland, nvidia-persistenced, glx-alternative-nvidia),
# fetched with `apt-get download` through a PRIVATE apt configuration and laid out as a host would
# have them after either install method.
#
#   fetch.sh fetch                  download the pinned .debs into the cache (no-op once cached)
#   fetch.sh cached                 exit 0 if every pinned .deb is cached, else name the missing
#                                   ones and exit 1 (never downloads)
#   fetch.sh install run|deb ROOT   lay the driver into ROOT (created if absent; may be an existing
#                                   host tree such as the e2e harness's fake host), fetching first
#   fetch.sh uninstall run|deb ROOT remove every file and link `install` made there (directories
#                                   and merged-/usr links stay), then rebuild ROOT's ld.so.cache
#   fetch.sh build DIR              DIR/run and DIR/deb: both layouts, each a fresh tree
#   fetch.sh version                print the driver version (what discovery must report)
#   fetch.sh list-debs              print the cached .deb paths
#
# Layouts:
#   run  NVIDIA's .run installer: every library flat in /usr/lib/x86_64-linux-gnu with its SONAME
#        link (vdpau/ and gbm/ subdirectories as the installer makes them), binaries in /usr/bin,
#        firmware in /lib/firmware/nvidia/<ver>/, X driver in /usr/lib/xorg/modules, config files in
#        /usr/share and /etc. Not merged-/usr (a real /lib directory), unless ROOT already is.
#   deb  exactly what dpkg lays down (the packages' data, dpkg-deb -x), then what their maintainer
#        scripts would set up (see install_deb): /etc/alternatives links from the multiarch
#        directory into /usr/lib/x86_64-linux-gnu/nvidia/current/, merged /usr as on trixie.
# Both get an /etc/ld.so.cache built by `ldconfig -r ROOT` (the installer runs ldconfig; dpkg's
# ldconfig trigger does the same), over libc6's /etc/ld.so.conf.d/x86_64-linux-gnu.conf.
#
# Cache: /var/tmp/nspawn-lifecycle-nvidia-debs (NVIDIA_DEBS_CACHE): the .debs, the private apt
# state, and each package extracted once (install hard-links from there when on one filesystem;
# the cached files are read-only, never edit files of an installed tree in place).
# Offline once every pinned .deb is cached: apt is not even started then.
# Mirror: the machine's Debian mirror as read from /etc/apt/sources.list.d/debian.sources (or
# NVIDIA_DEBS_MIRROR); the machine's apt sources are never touched.
set -euo pipefail

CACHE=${NVIDIA_DEBS_CACHE:-/var/tmp/nspawn-lifecycle-nvidia-debs}
MODE=install
SUITE=trixie
DRIVER_VERSION=550.163.01
DEB_VERSION=$DRIVER_VERSION-2
TRIPLET=x86_64-linux-gnu

# package=version, pinned: a new upload to trixie must not silently change what the tests see.
# Userspace only (no kernel module sources, no nvidia-settings/X tools, no empty metapackages).
PACKAGES=(
    "libcuda1=$DEB_VERSION" "libcudadebugger1=$DEB_VERSION" "libnvidia-ml1=$DEB_VERSION"
    "libnvidia-ptxjitcompiler1=$DEB_VERSION" "libnvidia-nvvm4=$DEB_VERSION"
    "libnvidia-api1=$DEB_VERSION" "libnvidia-cfg1=$DEB_VERSION" "libnvidia-allocator1=$DEB_VERSION"
    "libnvidia-gpucomp=$DEB_VERSION" "libnvidia-pkcs11-openssl3=$DEB_VERSION"
    "libnvidia-encode1=$DEB_VERSION" "libnvcuvid1=$DEB_VERSION" "libnvidia-opticalflow1=$DEB_VERSION"
    "libnvidia-fbc1=$DEB_VERSION" "libnvidia-ngx1=$DEB_VERSION" "libnvoptix1=$DEB_VERSION"
    "libnvidia-rtcore=$DEB_VERSION" "libnvidia-eglcore=$DEB_VERSION" "libnvidia-glcore=$DEB_VERSION"
    "libnvidia-glvkspirv=$DEB_VERSION" "libegl-nvidia0=$DEB_VERSION" "libglx-nvidia0=$DEB_VERSION"
    "libgles-nvidia1=$DEB_VERSION" "libgles-nvidia2=$DEB_VERSION" "nvidia-vdpau-driver=$DEB_VERSION"
    "nvidia-opencl-icd=$DEB_VERSION" "nvidia-opencl-common=$DEB_VERSION"
    "nvidia-egl-common=$DEB_VERSION" "nvidia-vulkan-common=$DEB_VERSION"
    "nvidia-smi=$DEB_VERSION" "nvidia-cuda-mps=$DEB_VERSION" "nvidia-driver-bin=$DEB_VERSION"
    "nvidia-alternative=$DEB_VERSION" "nvidia-kernel-support=$DEB_VERSION"
    "xserver-xorg-video-nvidia=$DEB_VERSION" "firmware-nvidia-gsp=$DEB_VERSION"
    "nvidia-persistenced=$DRIVER_VERSION-1"
    "libnvidia-egl-gbm1=1.1.2.1-1" "libnvidia-egl-wayland1=1:1.1.18-1"
    "glx-alternative-nvidia=1.2.2"
)

die() { echo "fetch.sh: $*" >&2; exit 1; }
log() { echo "fetch.sh: $*" >&2; }

# The file name `apt-get download` gives a package (epoch colon escaped as %3a).
deb_file() {
    local pkg=${1%%=*} ver=${1#*=} arch=amd64
    printf '%s/debs/%s_%s_%s.deb' "$CACHE" "$pkg" "${ver//:/%3a}" "$arch"
}

# shellcheck source=../lib/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/debian-mirror.sh"
# shellcheck source=../lib/private-apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/private-apt.sh"

all_cached() {
    local p
    for p in "${PACKAGES[@]}"; do [ -s "$(deb_file "$p")" ] || return 1; done
}

# Under $CACHE/.lock: parallel test threads may all ask for the files at once.
with_lock() {
    mkdir -p "$CACHE"
    exec {lockfd}>"$CACHE/.lock"
    flock "$lockfd"
    "$@"
    flock -u "$lockfd"
}

do_fetch() {
    all_cached && return 0
    local mirror=${NVIDIA_DEBS_MIRROR:-$(debian_mirror)}
    [ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list.d/debian.sources (set NVIDIA_DEBS_MIRROR)"
    local a=$CACHE/apt
    rm -f "$a/status"
    private_apt_init "$a" amd64
    mkdir -p "$CACHE/debs"
    printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main contrib non-free non-free-firmware\n' \
        "$mirror" "$SUITE" >"$a/etc/sources.list"
    log "downloading ${#PACKAGES[@]} packages of $SUITE from $mirror into $CACHE/debs"
    private_apt "$a" update >&2 || die "apt-get update of $SUITE failed (private config $a/apt.conf)"
    (cd "$CACHE/debs" && private_apt "$a" download "${PACKAGES[@]}" >&2) ||
        die "apt-get download failed; is $SUITE's $DEB_VERSION still on the mirror?"
    local p
    for p in "${PACKAGES[@]}"; do
        [ -s "$(deb_file "$p")" ] || die "expected $(deb_file "$p") after download"
    done
}

# Each package extracted once into $CACHE/x/<pkg> (data and maintainer scripts), read-only.
do_extract() {
    local p f d
    for p in "${PACKAGES[@]}"; do
        f=$(deb_file "$p")
        d=$CACHE/x/${p%%=*}
        [ -e "$d/.done" ] && [ "$d/.done" -nt "$f" ] && continue
        rm -rf "$d" "$d.tmp"
        mkdir -p "$d.tmp/data" "$d.tmp/control"
        dpkg-deb -x "$f" "$d.tmp/data"
        dpkg-deb -e "$f" "$d.tmp/control"
        chmod -R a-w "$d.tmp/data"
        touch "$d.tmp/.done"
        mv "$d.tmp" "$d"
    done
}

ensure() { with_lock do_fetch; with_lock do_extract; }

# ROOT-relative destination directory, refusing one that leaves ROOT through a symlink (ROOT may be
# a fake host prepared by someone else; an absolute link there must not send our files to the
# machine's own /usr).
dest() {
    local rel=$1 real rootreal
    rootreal=$(realpath "$ROOT")
    real=$(realpath -m "$ROOT/$rel")
    case "$real/" in
        "$rootreal"/*) ;;
        *) die "$ROOT/$rel resolves to $real, outside $ROOT" ;;
    esac
    mkdir -p "$real"
    printf '%s' "$real"
}

# Copy one file (or symlink, kept as is) into ROOT/<dir>/<name>: hard link from the cache when
# possible, so two 600 MB trees cost no disk and no time.
put() {
    local src=$1 dir=$2 name=${3:-$(basename "$1")} d
    d=$(dest "$dir")
    rm -f "$d/$name"
    [ "$MODE" = uninstall ] && return 0
    if [ -L "$src" ]; then
        ln -s "$(readlink "$src")" "$d/$name"
    else
        ln "$src" "$d/$name" 2>/dev/null || cp -a "$src" "$d/$name"
    fi
}
link() { # link TARGET ROOT-RELATIVE-PATH
    local d
    d=$(dest "$(dirname "$2")")
    if [ "$MODE" = uninstall ]; then
        rm -f "$d/$(basename "$2")"
    else
        ln -sfn "$1" "$d/$(basename "$2")"
    fi
}

ld_cache() {
    local d
    d=$(dest etc/ld.so.conf.d)
    [ -e "$ROOT/etc/ld.so.conf" ] || printf 'include /etc/ld.so.conf.d/*.conf\n' >"$ROOT/etc/ld.so.conf"
    # libc6's own entry (what makes the multiarch directory a search directory on Debian).
    [ -e "$d/$TRIPLET.conf" ] ||
        printf '# Multiarch support\n/usr/local/lib/%s\n/lib/%s\n/usr/lib/%s\n' "$TRIPLET" "$TRIPLET" "$TRIPLET" >"$d/$TRIPLET.conf"
    # -X: only the cache, no links (each layout has exactly the links its installer makes).
    ldconfig -X -r "$ROOT" 2>/dev/null || die "ldconfig -r $ROOT failed"
}

install_run() {
    local x=$CACHE/x f rel name lib=usr/lib/$TRIPLET
    # Not merged-/usr unless ROOT already is: the installer writes /lib/firmware as such.
    for p in "${PACKAGES[@]}"; do
        p=${p%%=*}
        case $p in nvidia-alternative | nvidia-kernel-support | glx-alternative-nvidia) continue ;; esac
        while IFS= read -r -d '' f; do
            rel=${f#"$x/$p/data/"}
            name=$(basename "$rel")
            case $rel in
                usr/share/doc/* | usr/share/lintian/* | usr/share/bug/* | usr/share/man/* | etc/init.d/* | \
                    usr/lib/systemd/* | var/* | etc/nvidia/current/nvidia-*.conf | etc/nvidia/nvidia-*) ;;
                usr/lib/firmware/nvidia/*) put "$f" "lib/firmware/nvidia/$DRIVER_VERSION" ;;
                "$lib"/nvidia/current/libvdpau_nvidia.so*) put "$f" "$lib/vdpau" ;;
                "$lib"/nvidia/current/nvidia-drm_gbm.so) link ../libnvidia-allocator.so.1 "$lib/gbm/nvidia-drm_gbm.so" ;;
                "$lib"/nvidia/current/nvoptix.bin) put "$f" usr/share/nvidia ;;
                "$lib"/nvidia/current/nvidia/wine/*) put "$f" "$lib/nvidia/wine" ;;
                "$lib"/nvidia/current/* | "$lib"/*) put "$f" "$lib" ;;
                usr/lib/nvidia/current/nvidia_drv.so) put "$f" usr/lib/xorg/modules/drivers ;;
                usr/lib/nvidia/current/libglxserver_nvidia.so*) put "$f" usr/lib/xorg/modules/extensions ;;
                usr/lib/nvidia/current/nvidia.ids | usr/lib/nvidia/current/*.1.gz) ;;
                usr/lib/nvidia/current/* | usr/bin/* | usr/sbin/*) put "$f" usr/bin ;;
                usr/share/nvidia/nvidia-application-profiles-*) put "$f" usr/share/nvidia ;;
                etc/nvidia/current/nvidia-drm-outputclass.conf) put "$f" usr/share/X11/xorg.conf.d ;;
                usr/share/* | etc/*) put "$f" "$(dirname "$rel")" ;;
                *) die "install run: no place for $p's $rel" ;;
            esac
        done < <(find "$x/$p/data" \( -type f -o -type l \) -print0)
    done
    # The installer makes libGLX_indirect.so.0 when no other GLX vendor provides it.
    link libGLX_nvidia.so.0 "$lib/libGLX_indirect.so.0"
    link libglxserver_nvidia.so.$DRIVER_VERSION usr/lib/xorg/modules/extensions/libglxserver_nvidia.so
    ld_cache
}

# True if the absolute path $1, resolved inside ROOT (absolute link targets taken relative to ROOT,
# as on the host they describe), is a regular file. `[ -f ]` would follow /etc/alternatives/… links
# into this machine's own /etc.
in_root_file() {
    local p=$1 n=0 t
    while [ $n -lt 40 ]; do
        if [ -L "$ROOT$p" ]; then
            t=$(readlink "$ROOT$p")
            case $t in /*) p=$t ;; *) p=$(dirname "$p")/$t ;; esac
            n=$((n + 1))
        else
            [ -f "$ROOT$p" ]
            return
        fi
    done
    return 1
}

# update-alternatives --install for one slave, as add_slave() in the maintainer scripts decides it:
# only when the source exists (following links) and the link's directory exists.
ALT_NAMES=()
alt_slave() { # alt_slave LINK NAME SOURCE
    local link=$1 name=$2 src=$3
    # Uninstall removes every link install may have made, whatever is left of the sources.
    [ "$MODE" = uninstall ] || in_root_file "$src" || return 0
    [ -d "$ROOT$(dirname "$link")" ] || return 0
    link "/etc/alternatives/$name" "${link#/}"
    link "$src" "etc/alternatives/$name"
    ALT_NAMES+=("$name")
}
alt_multiarch() { # alt_multiarch SUBDIR FILE PREFIX [SOURCE-SUBDIR]  (x86_64 only: no i386 files here)
    local sub=$1 file=$2 prefix=$3
    alt_slave "/usr/lib/$TRIPLET/$sub$file" "$prefix$file-$TRIPLET" "/usr/lib/$TRIPLET/${4-nvidia/current/}$file"
}

install_deb() {
    local x=$CACHE/x p
    # Merged /usr, as on every trixie host (usrmerge is mandatory there).
    [ "$MODE" = uninstall ] || for p in bin sbin lib lib64; do
        [ -e "$ROOT/$p" ] || [ -L "$ROOT/$p" ] || { mkdir -p "$ROOT/usr/$p" && ln -s "usr/$p" "$ROOT/$p"; }
    done
    # dpkg's unpack: each package's data as it is.
    for p in "${PACKAGES[@]}"; do
        p=${p%%=*}
        (cd "$x/$p/data" && find . \( -type f -o -type l \) -print0) | while IFS= read -r -d '' rel; do
            rel=${rel#./}
            put "$x/$p/data/$rel" "$(dirname "$rel")"
        done
        [ "$MODE" = uninstall ] ||
            (cd "$x/$p/data" && find . -type d -empty -printf '%P\0') | while IFS= read -r -d '' rel; do
                [ -n "$rel" ] && dest "$rel" >/dev/null
            done
    done
    # Configure. Replicated from the maintainer scripts of this exact upload (read them in
    # $CACHE/x/<pkg>/control/postinst), x86_64 slaves only, in trigger order:
    # 1. nvidia-alternative 550.163.01-2 postinst, "triggered" branch: update-alternatives --install
    #    /usr/lib/nvidia/nvidia nvidia /usr/lib/nvidia/current 550 with these slaves (the kmod
    #    slaves point at /etc/nvidia/nvidia-550.163.01/, which nvidia-kernel-support links to
    #    current/; libnvidia-ml.so only with nvml.h installed, i.e. not here).
    local n=nvidia--
    link /etc/alternatives/nvidia usr/lib/nvidia/nvidia
    link /usr/lib/nvidia/current etc/alternatives/nvidia
    alt_slave /usr/lib/nvidia/libglxserver_nvidia.so ${n}libglxserver_nvidia.so /usr/lib/nvidia/current/libglxserver_nvidia.so
    alt_slave /usr/lib/nvidia/nvidia_drv.so ${n}nvidia_drv.so /usr/lib/nvidia/current/nvidia_drv.so
    alt_multiarch vdpau/ libvdpau_nvidia.so.1 $n
    for f in libGLX_nvidia.so.0 libEGL_nvidia.so.0 libGLESv1_CM_nvidia.so.1 libGLESv2_nvidia.so.2 \
        libcuda.so.1 libcuda.so libcudadebugger.so.1 libnvcuvid.so.1 libnvcuvid.so \
        libnvidia-allocator.so.1 libnvidia-api.so.1 libnvidia-encode.so.1 libnvidia-fbc.so.1 \
        libnvidia-ml.so.1 libnvidia-ngx.so.1 libnvidia-nvvm.so.4 libnvidia-nvvm.so.$DRIVER_VERSION \
        libnvidia-opencl.so.1 libnvidia-opticalflow.so.1 libnvidia-ptxjitcompiler.so.1 libnvoptix.so.1; do
        alt_multiarch "" "$f" $n
    done
    alt_slave /usr/share/nvidia/nvoptix.bin ${n}nvoptix.bin /usr/lib/$TRIPLET/nvidia/current/nvoptix.bin
    alt_multiarch gbm/ nvidia-drm_gbm.so $n
    alt_slave /usr/bin/nvidia-smi ${n}nvidia-smi /usr/lib/nvidia/current/nvidia-smi
    alt_slave /usr/share/man/man1/nvidia-smi.1.gz ${n}nvidia-smi.1.gz /usr/lib/nvidia/current/nvidia-smi.1.gz
    alt_slave /usr/lib/nvidia/nvidia-bug-report.sh ${n}nvidia-bug-report.sh /usr/lib/nvidia/current/nvidia-bug-report.sh
    alt_slave /usr/bin/nvidia-debugdump ${n}nvidia-debugdump /usr/lib/nvidia/current/nvidia-debugdump
    alt_slave /usr/share/nvidia/nvidia-application-profiles-key-documentation ${n}nvidia-application-profiles-key-documentation \
        /usr/share/nvidia/nvidia-application-profiles-$DRIVER_VERSION-key-documentation
    alt_multiarch nvidia/ libnvidia-cfg.so.1 $n
    alt_slave /etc/nvidia/nvidia-drm-outputclass.conf ${n}nvidia-drm-outputclass.conf /etc/nvidia/current/nvidia-drm-outputclass.conf
    for f in nvidia-blacklists-nouveau.conf nvidia-modprobe.conf nvidia-load.conf; do
        alt_slave /etc/nvidia/$f ${n}$f /etc/nvidia/nvidia-$DRIVER_VERSION/$f
    done
    alt_slave /etc/modprobe.d/nvidia-options.conf ${n}nvidia-options.conf /etc/nvidia/nvidia-$DRIVER_VERSION/nvidia-options.conf
    # 2. glx-alternative-nvidia 1.2.2 postinst setup_alternatives(), "normal" branch (nvidia_drv.so
    #    is present through step 1): update-alternatives --install /usr/lib/glx glx /usr/lib/nvidia
    #    100 with kernel_auto, xorg, xorg_conf, libGL_nvidia (only libGLX_indirect.so.0 exists of
    #    those: Debian's libGL.so.1 is glvnd's), libEGL_nvidia (none) and misc slaves.
    local g=glx--
    link /etc/alternatives/glx usr/lib/glx
    link /usr/lib/nvidia etc/alternatives/glx
    alt_slave /etc/modprobe.d/nvidia-blacklists-nouveau.conf ${g}nvidia-blacklists-nouveau.conf /etc/nvidia/nvidia-blacklists-nouveau.conf
    alt_slave /etc/modprobe.d/nvidia.conf ${g}nvidia-modprobe.conf /etc/nvidia/nvidia-modprobe.conf
    alt_slave /etc/modules-load.d/nvidia.conf ${g}nvidia-load.conf /etc/nvidia/nvidia-load.conf
    alt_slave /usr/lib/xorg/modules/drivers/nvidia_drv.so ${g}nvidia_drv.so /usr/lib/nvidia/nvidia_drv.so
    alt_slave /usr/lib/xorg/modules/extensions/libglxserver_nvidia.so ${g}libglxserver_nvidia.so /usr/lib/nvidia/libglxserver_nvidia.so
    alt_slave /usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf ${g}nvidia-drm-outputclass.conf /etc/nvidia/nvidia-drm-outputclass.conf
    alt_slave /usr/lib/$TRIPLET/libGLX_indirect.so.0 ${g}libGLX_indirect.so.0-$TRIPLET /usr/lib/$TRIPLET/libGLX_nvidia.so.0
    alt_multiarch "" libnvidia-cfg.so.1 $g nvidia/
    alt_slave /usr/bin/nvidia-bug-report.sh ${g}nvidia-bug-report.sh /usr/lib/nvidia/nvidia-bug-report.sh
    # 3. dpkg's ldconfig trigger. Debian's packages ship no ld.so.conf.d entry of their own: the
    #    libraries are reached through the alternatives links above in libc6's multiarch directory.
    #    Not replicated: /var/lib/dpkg/{status,alternatives/*} (no tool reads them at run time),
    #    initramfs and modprobe triggers.
    ld_cache
}
main() {
    local cmd=${1:-}
    case $cmd in
        fetch) with_lock do_fetch ;;
        cached)
            local p missing=()
            for p in "${PACKAGES[@]}"; do [ -s "$(deb_file "$p")" ] || missing+=("${p%%=*}"); done
            [ ${#missing[@]} = 0 ] ||
                die "${#missing[@]} of ${#PACKAGES[@]} pinned packages not cached in $CACHE/debs (${missing[*]}): run $0 fetch"
            ;;
        version) echo "$DRIVER_VERSION" ;;
        list-debs) ensure; for p in "${PACKAGES[@]}"; do deb_file "$p"; echo; done ;;
        install | uninstall)
            [ $# = 3 ] || die "usage: fetch.sh $cmd run|deb ROOT"
            MODE=$cmd
            ROOT=$3
            [ "$MODE" = install ] || [ -d "$ROOT" ] || die "$ROOT: no such directory"
            mkdir -p "$ROOT"
            ensure
            case $2 in
                run) install_run ;;
                deb) install_deb ;;
                *) die "unknown layout '$2' (run or deb)" ;;
            esac
            ;;
        build)
            [ $# = 2 ] || die "usage: fetch.sh build DIR"
            ensure
            local l
            for l in run deb; do
                rm -rf "${2:?}/$l"
                "$0" install "$l" "$2/$l"
            done
            ;;
        *) die "usage: fetch.sh fetch | cached | install run|deb ROOT | uninstall run|deb ROOT | build DIR | version | list-debs" ;;
    esac
}
main "$@"
