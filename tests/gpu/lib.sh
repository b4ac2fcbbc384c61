# shellcheck shell=bash
# What tests/gpu/run.sh does in its private mount namespace, as functions, so that
# tests/gpu/selftest.sh runs the same code on a host with no GPU. Nothing here installs anything
# on the host: every mount is in the caller's private mount namespace, every file under $S.

KIT_LINK=/run/nspawn-lifecycle-gpu-kit
# shellcheck disable=SC2034 # used by run.sh and selftest.sh, which source this
MACHINE=gpuproof

# host_view S: $S/host, the host as it is, writable only into $S: an overlay (upper on a tmpfs)
# over every directory mount of the host, in mount order, so pre-start and install read the
# host's real files (wherever the driver is: /usr/local/nvidia's own mount included) and write
# nothing outside $S. /proc, /sys and /dev are the host's own (recursive binds): discovery reads
# the live kernel there. A mount that cannot be an overlay's lower layer (a file bind, an odd
# filesystem) is bound read-only instead.
host_view() {
    local s=$1 h=$1/host n=0 mp
    mkdir -p "$s/layers" "$h"
    mount -t tmpfs -o size=8g,mode=700 gpu-layers "$s/layers" || return 1
    # The mount points of the host now, parents first; the scratch and the kit link excluded.
    local mps
    mps=$(awk '{print $5}' /proc/self/mountinfo | while IFS= read -r m; do printf '%b\n' "$m"; done |
        sort -u | grep -v -e '^/proc\(/\|$\)' -e '^/sys\(/\|$\)' -e '^/dev\(/\|$\)' \
            -e "^${s}\(/\|$\)" -e "^${KIT_LINK}\(/\|$\)")
    while IFS= read -r mp; do
        [ -n "$mp" ] || continue
        n=$((n + 1))
        local at=$h${mp%/}
        [ "$mp" = / ] && at=$h
        if [ -d "$mp" ] && [ ! -L "$mp" ]; then
            mkdir -p "$s/layers/$n/upper" "$s/layers/$n/work" "$at" 2>/dev/null
            if mount -t overlay "gpu-view-$n" \
                -o "lowerdir=$mp,upperdir=$s/layers/$n/upper,workdir=$s/layers/$n/work" "$at" 2>/dev/null; then
                continue
            fi
        fi
        # Not an overlay: the host's own, read-only.
        if [ -d "$mp" ]; then mkdir -p "$at"; else mkdir -p "$(dirname "$at")" && touch "$at"; fi 2>/dev/null
        mount --bind "$mp" "$at" 2>/dev/null && mount -o remount,bind,ro "$at" 2>/dev/null ||
            echo "host_view: $mp left out (neither an overlay nor a read-only bind)" >&2
    done <<<"$mps"
    mountpoint -q "$h" || { echo "host_view: no overlay over / (overlayfs missing?)" >&2; return 1; }
    local d
    for d in proc sys dev; do
        mkdir -p "$h/$d" && mount --rbind "/$d" "$h/$d" || return 1
    done
}

# nspawn_binds FILE HOST MACHINE: the Bind= and BindReadOnly= lines of the .nspawn FILE made as
# systemd-nspawn makes them: SOURCE (under HOST) bound at TARGET (under MACHINE), read-only for
# BindReadOnly=. Prints each bind; fails on a line it cannot read (an escape, an option).
nspawn_binds() {
    local file=$1 host=$2 m=$3 line key val src dst
    while IFS= read -r line; do
        case $line in
            Bind=*) key=Bind ;;
            BindReadOnly=*) key=BindReadOnly ;;
            *) continue ;;
        esac
        val=${line#*=}
        case $val in *\\*|*:*:*) echo "nspawn_binds: $file: cannot read '$line'" >&2; return 1 ;; esac
        src=${val%%:*}
        dst=${val#*:}
        [ "$dst" = "$val" ] && dst=$src
        local s=$host$src t=$m$dst
        if [ -d "$s" ]; then mkdir -p "$t"; else mkdir -p "$(dirname "$t")" && { [ -e "$t" ] || touch "$t"; }; fi
        mount --bind "$s" "$t" || { echo "nspawn_binds: $file: $line: bind failed" >&2; return 1; }
        if [ $key = BindReadOnly ]; then mount -o remount,bind,ro "$t" || return 1; fi
        echo "$key $src -> $dst"
    done <"$file"
}

# machine_view M: the API filesystems systemd-nspawn gives a machine (a root that is a mount
# point, /proc, /sys, a /dev tmpfs with the basic nodes, /run and /tmp tmpfs) and the kit at its
# fixed path inside, for the runtime that runs in the machine.
machine_view() {
    local m=$1 n
    mount --bind "$m" "$m" || return 1
    mount -t proc proc "$m/proc" || return 1
    mount --rbind /sys "$m/sys" || return 1
    mount -t tmpfs -o mode=755,size=64m dev "$m/dev" || return 1
    for n in null zero full random urandom tty; do
        touch "$m/dev/$n" && mount --bind "/dev/$n" "$m/dev/$n" || return 1
    done
    ln -s /proc/self/fd "$m/dev/fd"
    mkdir -p "$m/dev/pts" "$m/dev/shm"
    mount -t tmpfs -o mode=755,size=256m run "$m/run" || return 1
    mount -t tmpfs -o mode=1777,size=1g tmp "$m/tmp" || return 1
    mkdir -p "$m$KIT_LINK" && mount --bind "$(readlink -f "$KIT_LINK")" "$m$KIT_LINK" &&
        mount -o remount,bind,ro "$m$KIT_LINK"
}

# bundle DIR ARGS_JSON: an OCI bundle in DIR (seen from where its runtime runs) from the kit's
# template: a fresh copy of the kit's image (no driver in it) as rootfs, the process ARGS_JSON.
bundle() {
    local dir=$1 args=$2
    rm -rf "$dir" && mkdir -p "$dir" && cp -a "$KIT_LINK/image" "$dir/rootfs" || return 1
    python3 - "$KIT_LINK/runc-template.json" "$dir/template.json" "$args" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["root"] = {"path": "rootfs", "readonly": False}
c["process"]["terminal"] = False
c["process"]["args"] = json.loads(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"), indent=1)
EOF
}

# now_us: the clock in microseconds, from bash itself (no process started to read it).
now_us() { local t=$EPOCHREALTIME; echo "${t/./}"; }
