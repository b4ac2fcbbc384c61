#!/bin/bash
# A test double of nspawn-lifecycle-helper in shell, written from DESIGN.md, for ONE purpose: to
# validate the harness's own scenarios 1-7 before the real binary exists
#   HELPER=tests/e2e/lib/reference-helper.sh tests/e2e/harness.sh run
# A green run with it proves the scenarios are sound, NOT that the product works. It takes
# shortcuts the product must not (systemctl/systemd-run subprocesses, string paths into the
# machine root) and knows nothing of security, atomicity or exit-code contracts beyond the basics.
set -uo pipefail
SELF=$(readlink -f "$0")
STABLE=/usr/local/lib/nspawn-lifecycle/nspawn-lifecycle-helper
ML=x86_64-linux-gnu
EXIT_INCOMPLETE=3
say() { echo "nspawn-lifecycle(ref): $*" >&2; }
die() { say "$*"; exit 1; }

write_if_changed() { # write_if_changed <path> <content>; returns 0 when it wrote
    if [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; then return 1; fi
    mkdir -p "$(dirname "$1")"
    printf '%s\n' "$2" > "$1.tmp.$$" && mv "$1.tmp.$$" "$1"
}

# ---- discovery -----------------------------------------------------------------------------------
discover() { # sets VERDICT, WHY, KVER, UVER, LIBDIR, NODES[], DRI[]
    NODES=(); DRI=(); KVER=; UVER=; LIBDIR=; WHY=
    local p b d
    for p in /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia-modeset; do
        [ -c "$p" ] && NODES+=("$p")
    done
    for b in /sys/bus/pci/devices/*; do
        [ "$(cat "$b/vendor" 2>/dev/null)" = 0x10de ] || continue
        for d in "$b"/drm/card* "$b"/drm/renderD*; do [ -e "$d" ] && [ -c "/dev/dri/${d##*/}" ] && DRI+=("/dev/dri/${d##*/}"); done
    done
    if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then VERDICT=none; return; fi
    KVER=$(sed -n '1s/.*Kernel Module  *\([0-9.]*\).*/\1/p' /proc/driver/nvidia/version 2>/dev/null)
    local cuda nvml
    cuda=$(ldconfig -p | awk '$1=="libcuda.so.1"{print $NF; exit}'); cuda=${cuda:+$(readlink -f "$cuda")}
    nvml=$(ldconfig -p | awk '$1=="libnvidia-ml.so.1"{print $NF; exit}'); nvml=${nvml:+$(readlink -f "$nvml")}
    [ -n "$KVER" ] || WHY+="no kernel module version in /proc/driver/nvidia/version; "
    [ -n "$cuda" ] && [ -e "$cuda" ] || WHY+="libcuda.so.1 not found; "
    [ -n "$nvml" ] && [ -e "$nvml" ] || WHY+="libnvidia-ml.so.1 not found; "
    if [ -z "$WHY" ]; then
        UVER=${cuda##*/libcuda.so.}; LIBDIR=$(dirname "$cuda")
        [ "$KVER" = "$UVER" ] || WHY+="kernel module $KVER but libcuda.so.$UVER; "
        [ "${nvml##*/libnvidia-ml.so.}" = "$UVER" ] || WHY+="libnvidia-ml.so.${nvml##*/libnvidia-ml.so.} but libcuda.so.$UVER; "
    fi
    if [ -n "$WHY" ]; then VERDICT=incomplete; else VERDICT=complete; fi
}

render_nspawn() {
    local n
    echo "[Exec]"; echo "Capability=all"; echo "PrivateUsers=no"; echo "SystemCallFilter=@keyring bpf perf_event_open"; echo "NotifyReady=yes"
    echo "[Network]"; echo "VirtualEthernet=no"
    echo "[Files]"; echo "BindReadOnly=/lib/modules"
    [ -c /dev/kvm ] && echo "Bind=/dev/kvm"
    if [ "$VERDICT" = complete ]; then
        for n in "${NODES[@]}" "${DRI[@]}"; do echo "Bind=$n"; done
        # the driver root: one read-only bind per file and per SONAME name (issue 11)
        local f b so
        for f in "$LIBDIR"/*.so."$UVER" "$LIBDIR"/vdpau/*.so."$UVER"; do
            [ -e "$f" ] || continue
            b=${f#"$LIBDIR"/}
            echo "BindReadOnly=$f:/run/nvidia/driver/usr/lib/$ML/$b"
            for so in "$(dirname "$f")"/*; do
                [ -L "$so" ] && [ "$(readlink "$so")" = "${f##*/}" ] || continue
                echo "BindReadOnly=$f:/run/nvidia/driver/usr/lib/$ML/$(dirname "$b" | sed 's|^\.$||;s|.$|&/|')${so##*/}"
            done
        done
        for n in nvidia-smi nvidia-debugdump nvidia-persistenced nvidia-cuda-mps-control nvidia-cuda-mps-server; do
            [ -x "/usr/bin/$n" ] && echo "BindReadOnly=/usr/bin/$n:/run/nvidia/driver/usr/bin/$n"
        done
        [ -d "/lib/firmware/nvidia/$UVER" ] && echo "BindReadOnly=/lib/firmware/nvidia/$UVER:/run/nvidia/driver/lib/firmware/nvidia/$UVER"
    fi
}

lock() { # the product's lock directory (root's own, 0700), never world-writable /run/lock
    install -d -m 0700 /run/nspawn-lifecycle/locks || die "lock directory"
    exec 9>>"/run/nspawn-lifecycle/locks/$1.lock"; flock -w 300 9 || die "lock for $1 timed out"
}

pre_start() {
    lock "$1"; discover
    if [ "$VERDICT" = incomplete ]; then say "NVIDIA driver state incomplete: $WHY"; exit $EXIT_INCOMPLETE; fi
    write_if_changed "/etc/systemd/nspawn/$1.nspawn" "$(render_nspawn)" && say "rendered /etc/systemd/nspawn/$1.nspawn ($VERDICT)"
    return 0
}

# ---- post-start ----------------------------------------------------------------------------------
post_start() {
    local m=$1 L R st
    lock "$m"; discover
    [ "$VERDICT" = incomplete ] && { say "NVIDIA driver state incomplete: $WHY"; exit $EXIT_INCOMPLETE; }
    L=$(machinectl show "$m" -p Leader --value) || die "machine $m not registered"
    R=/proc/$L/root
    for _ in $(seq 1 300); do
        st=$(systemctl -M "$m" is-system-running 2>/dev/null); case "$st" in running|degraded) break;; esac; sleep 0.1
    done
    cleanup() {
        rm -f "$R/run/cdi/nvidia.com-gpu.json"
        find "$R/usr/lib/$ML" "$R/usr/bin" -maxdepth 2 \( -lname '/run/host-nvidia/*' -o -lname '/run/nvidia/*' \) -delete
        find "$R/dev/char" -maxdepth 1 -lname '../nvidia*' -delete 2>/dev/null
    }
    if [ "$VERDICT" = none ]; then cleanup; say "no NVIDIA GPUs: removed NVIDIA state from $m"; return 0; fi
    systemctl -M "$m" stop kubelet.service || die "stopping kubelet.service in $m failed"
    systemctl -M "$m" stop containerd.service || die "stopping containerd.service in $m failed"
    recover() { systemctl -M "$m" start containerd.service; systemctl -M "$m" start kubelet.service; die "$*"; }
    cleanup
    # the driver root is nspawn's binds (render_nspawn): only check it is there
    # NB: paths are joined as strings under /proc/<leader>/root, so an absolute symlink in the
    # machine (/var/run -> /run) would resolve on the HOST: only symlink-free paths are used here.
    # The product must resolve inside the machine root instead (DESIGN §5, openat2).
    local f b
    [ -f "$R/run/nvidia/driver/usr/lib/$ML/libcuda.so.$UVER" ] || recover "driver root incomplete"
    for f in "$R/run/nvidia/driver/usr/bin"/*; do
        [ -e "$f" ] && ln -sfn "/run/nvidia/driver/usr/bin/${f##*/}" "$R/usr/bin/${f##*/}"
    done
    # links in the machine's multiarch dir, /dev/char
    for f in "$R/run/nvidia/driver/usr/lib/$ML"/*.so.*; do
        b=${f##*/}; ln -sfn "/run/nvidia/driver/usr/lib/$ML/$b" "$R/usr/lib/$ML/$b"
    done
    mkdir -p "$R/dev/char"
    for f in "${NODES[@]}" "${DRI[@]}"; do
        ln -sfn "../${f#/dev/}" "$R/dev/char/$(stat -c '%t %T' "$f" | { read -r a c; echo $((0x$a)):$((0x$c)); })"
    done
    systemd-run -M "$m" --wait --quiet --collect /sbin/ldconfig || recover "ldconfig in $m failed"
    # CDI
    local devs="" all="" n k uuid bus ce
    node() { printf '{"path":"%s"}' "$1"; }
    for k in /proc/driver/nvidia/gpus/*/information; do
        n=$(awk -F: '$1=="Device Minor"{gsub(/ /,"",$2); print $2}' "$k"); uuid=$(awk '$1=="GPU" && $2=="UUID:"{print $3}' "$k")
        bus=$(basename "$(dirname "$k")")
        ce="$(node "/dev/nvidia$n")"
        for f in /sys/bus/pci/devices/"$bus"/drm/*; do ce+=",$(node "/dev/dri/${f##*/}")"; done
        devs+="{\"name\":\"$n\",\"containerEdits\":{\"deviceNodes\":[$ce]}},{\"name\":\"$uuid\",\"containerEdits\":{\"deviceNodes\":[$ce]}},"
        all+="$ce,"
    done
    local mounts="" opts='["ro","nosuid","nodev","rbind","rprivate"]'
    for f in "$R/run/nvidia/driver/usr/lib/$ML"/*.so.* "$R/run/nvidia/driver/usr/lib/$ML"/vdpau/*.so.*; do
        b=${f#"$R"/run/nvidia/driver}
        mounts+="{\"hostPath\":\"/run/nvidia/driver$b\",\"containerPath\":\"$b\",\"options\":$opts},"
    done
    mounts+="{\"hostPath\":\"/run/nvidia/driver/usr/bin/nvidia-smi\",\"containerPath\":\"/usr/bin/nvidia-smi\",\"options\":$opts}"
    local spec
    spec="{\"cdiVersion\":\"0.5.0\",\"kind\":\"nvidia.com/gpu\",\"devices\":[${devs}{\"name\":\"all\",\"containerEdits\":{\"deviceNodes\":[${all%,}]}}],\"containerEdits\":{\"env\":[\"NVIDIA_VISIBLE_DEVICES=void\"],\"deviceNodes\":[$(node /dev/nvidiactl),$(node /dev/nvidia-uvm),$(node /dev/nvidia-uvm-tools)],\"mounts\":[$mounts]}}"
    mkdir -p "$R/var/run/cdi"; write_if_changed "$R/run/cdi/nvidia.com-gpu.json" "$spec"
    systemctl -M "$m" start containerd.service || recover "starting containerd.service in $m failed"
    local img out
    for img in "$R"/var/lib/nspawn-lifecycle/images/*.tar; do
        [ -e "$img" ] || continue
        b=/var/lib/nspawn-lifecycle/images/${img##*/}
        if ! out=$(systemd-run -M "$m" --wait --pipe --quiet --collect ctr -n k8s.io images import "$b" 2>&1 </dev/null); then
            mkdir -p "$R/var/lib/nspawn-lifecycle/images/failed"; mv "$img" "$R/var/lib/nspawn-lifecycle/images/failed/"
            say "import of $b failed, moved to failed/: $out"
        fi
    done
    systemctl -M "$m" start kubelet.service || recover "starting kubelet.service in $m failed"
    say "post-start of $m done ($(( ${#NODES[@]} )) NVIDIA nodes)"
}

# ---- install ---------------------------------------------------------------------------------------
# The product's drop-in, as the harness staged it from tests/golden/dropin-kube1.conf (the bytes
# the binary prints with `install <m> --print-dropin`): never a copy kept here, which drifted.
dropin() { sed "s/kube1/$1/g" /usr/local/lib/e2e/dropin-kube1.conf; }
install_() {
    local m=$1 d=/etc/systemd/system/systemd-nspawn@$1.service.d changed=0 line kept=""
    if ! cmp -s "$SELF" "$STABLE"; then
        mkdir -p "$(dirname "$STABLE")"; cp "$SELF" "$STABLE.tmp" && mv "$STABLE.tmp" "$STABLE" && say "installed $STABLE"
    fi
    if [ -f "$d/override.conf" ]; then
        local sec="" out=""
        while IFS= read -r line; do
            case "$line" in
                "["*"]") sec=$line; continue;;
                ""|Environment=SYSTEMD_NSPAWN_*|"ExecStartPre=-/usr/bin/machinectl terminate"*|Restart=*|RestartSec=*|StartLimitIntervalSec=*|DeviceAllow=/dev/nvidia*|DeviceAllow=/dev/dri*|DeviceAllow=char-nvidia*|DeviceAllow=char-drm*) continue;;
            esac
            case "$out" in *"$sec"*) ;; *) out+="$sec"$'\n';; esac
            out+="$line"$'\n'; kept+="$line "
        done < "$d/override.conf"
        if [ -n "$kept" ]; then write_if_changed "$d/override.conf" "${out%$'\n'}" && changed=1; say "kept unrecognised settings from override.conf: $kept"
        else rm -f "$d/override.conf"; changed=1; fi
    fi
    write_if_changed "$d/50-nspawn-lifecycle.conf" "$(dropin "$m")" && { changed=1; say "wrote $d/50-nspawn-lifecycle.conf"; }
    discover
    [ "$VERDICT" = incomplete ] || { write_if_changed "/etc/systemd/nspawn/$m.nspawn" "$(render_nspawn)" && say "rendered /etc/systemd/nspawn/$m.nspawn"; }
    if [ $changed = 1 ]; then systemctl daemon-reload; else say "nothing changed"; fi
}

reconcile() {
    local u=systemd-nspawn@$1.service
    [ -d "/etc/systemd/system/$u.d" ] || die "$1 is not installed: run install first"
    systemctl reset-failed "$u" 2>/dev/null
    systemctl restart "$u" || die "restart of $u failed: $(systemctl show -p Result --value "$u"); see journalctl -u $u"
}

case "${1:-} ${2:-}" in
    "nspawn-lifecycle pre-start") pre_start "$3";;
    "nspawn-lifecycle post-start") post_start "$3";;
    "nspawn-lifecycle reconcile") reconcile "$3";;
    "install "*) if [ "${3:-}" = --print-dropin ]; then dropin "$2"; else install_ "$2"; fi;;
    *) say "usage: nspawn-lifecycle {pre-start|post-start|reconcile} <m> | install <m> [--print-dropin]"; exit 2;;
esac
