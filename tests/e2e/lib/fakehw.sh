#!/bin/bash
# Runs INSIDE the e2e host container (installed there as /usr/local/lib/e2e/fakehw).
# Makes the host container look like a machine with an NVIDIA driver loaded and N GPUs:
#   device nodes      /dev/nvidia<N> (195:N), /dev/nvidiactl (195:255), /dev/nvidia-uvm(-tools)
#                     (<uvm major>:0/1), /dev/dri/card<N+1> (226:N+1), /dev/dri/renderD<128+N>
#   /proc/devices     a copy of the real one plus `195 nvidia`, `<uvm> nvidia-uvm`, `226 drm`,
#                     bind-mounted over /proc/devices so systemd resolves DeviceAllow=char-nvidia*
#   /proc/driver      tmpfs with nvidia/version and nvidia/gpus/<bus>/information
#   /sys/bus/pci/devices  tmpfs with the real entries (as symlinks) plus one dir per fake GPU
#                     (vendor 0x10de, drm/cardN, drm/renderDN)
#   driver files      stand-in ELF libraries (built by the harness with gcc) in the multiarch dir
#                     with SONAME links and ld.so.cache (ldconfig), nvidia-smi & co, GSP firmware
#
# Usage: fakehw setup            one-time mounts at boot, then apply (run by e2e-fakehw.service)
#        fakehw apply            make the current state match /etc/e2e/fakehw.env
#        fakehw gpus N           N fake GPUs (0 = driver unloaded: no nodes, no /proc/driver/nvidia)
#        fakehw remove-libs      userspace driver files gone (an incomplete driver install)
#        fakehw restore-libs
#        fakehw version KVER [UVER]  kernel module version and userspace (library) version
#        fakehw renumber 0|1     1: the same GPUs (UUIDs) in the other slots, as after a reboot that
#                                renumbers them: the GPU with UUID k sits in slot N-1-k (its minor
#                                and bus id); 0: UUID k in slot k again
#        fakehw status
set -euo pipefail
CONF=/etc/e2e/fakehw.env
STATE=/run/e2e
STAGE=/opt/e2e-fake-driver           # pristine stub libraries, one dir per driver version
LIBDIR=/usr/lib/x86_64-linux-gnu
# defaults, overridden by $CONF
GPUS=2; KVER=580.82.07; UVER=580.82.07; LIBS=present; UVM_MAJOR=509; RENUMBER=0
# shellcheck disable=SC1090
[ -r "$CONF" ] && . "$CONF"

save_conf() {
    mkdir -p "$(dirname "$CONF")"
    printf 'GPUS=%s\nKVER=%s\nUVER=%s\nLIBS=%s\nUVM_MAJOR=%s\nRENUMBER=%s\n' "$GPUS" "$KVER" "$UVER" "$LIBS" "$UVM_MAJOR" "$RENUMBER" > "$CONF"
}
bus_of()  { printf '0000:%02x:00.0' $((6 + $1)); }
# uuid_of <slot>: the UUID of the GPU in that slot (minor and bus id), see `renumber`
uuid_of() {
    local k=$1
    [ "$RENUMBER" = 1 ] && k=$((GPUS - 1 - $1))
    printf 'GPU-e2e00000-0000-4000-8000-%012d' "$k"
}
is_mounted() { findmnt -rn --mountpoint "$1" >/dev/null 2>&1; }

setup() {
    mkdir -p "$STATE"
    # /proc/devices: keep the real list once, then a writable stand-in on tmpfs bind-mounted over it.
    # systemd's bpf-devices code opens /proc/devices by path, so it reads the stand-in.
    if ! is_mounted /proc/devices; then
        cat /proc/devices > "$STATE/proc-devices.real"
        : > "$STATE/proc-devices"
        mount --bind "$STATE/proc-devices" /proc/devices
    fi
    # /proc/driver may be empty or absent; procfs accepts a tmpfs mounted over the directory.
    if ! is_mounted /proc/driver; then
        mkdir -p /proc/driver 2>/dev/null || true
        mount -t tmpfs -o mode=755,size=1M e2e-proc-driver /proc/driver
    fi
    # sysfs is read-only in the container; a tmpfs over /sys/bus/pci/devices keeps the real
    # devices (as absolute symlinks) and lets us add fake ones.
    if ! is_mounted /sys/bus/pci/devices; then
        mkdir -p "$STATE/pci-real"
        local d
        for d in /sys/bus/pci/devices/*; do
            [ -e "$d" ] || continue
            ln -sfn "$(readlink -f "$d")" "$STATE/pci-real/$(basename "$d")"
        done
        mount -t tmpfs -o mode=755,size=1M e2e-pci-devices /sys/bus/pci/devices
        cp -a "$STATE/pci-real/." /sys/bus/pci/devices/ 2>/dev/null || true
    fi
    apply
}

write_proc_devices() {
    local extra=("226 drm") real=$STATE/proc-devices.real chars rest
    if [ "$GPUS" -gt 0 ]; then extra+=("195 nvidia" "$UVM_MAJOR nvidia-uvm"); fi
    chars=$(sed -n '/^Character devices:/,/^$/p' "$real" | sed '1d;/^$/d')
    rest=$(sed -n '/^Block devices:/,$p' "$real")
    {
        echo "Character devices:"
        { printf '%s\n' "$chars"; printf '%s\n' "${extra[@]}" | awk '{printf "%3d %s\n", $1, $2}'; } \
            | sort -n -s -k1,1 | awk 'NF && !seen[$0]++'
        echo
        printf '%s\n' "$rest"
    } > "$STATE/proc-devices.new"
    # rewrite in place (same inode): the bind mount over /proc/devices shows the new content
    cat "$STATE/proc-devices.new" > "$STATE/proc-devices"
    rm -f "$STATE/proc-devices.new"
}

grp() { getent group "$1" >/dev/null 2>&1 && echo "$1" || echo root; }
node() { # node <path> <major> <minor> <mode> <group>
    local p=$1
    if [ -c "$p" ] && [ "$(stat -c '%t:%T' "$p")" = "$(printf '%x:%x' "$2" "$3")" ]; then return; fi
    rm -f "$p"; mknod -m "$4" "$p" c "$2" "$3"; chgrp "$5" "$p"
}

apply_nodes() {
    local i p n
    mkdir -p /dev/dri
    # remove fake nodes beyond the GPU count (never touch anything else in /dev)
    for p in /dev/nvidia[0-9]*; do
        [ -e "$p" ] || continue
        n=${p#/dev/nvidia}; [ "$n" -ge "$GPUS" ] && rm -f "$p"
    done
    for p in /dev/dri/card[0-9]* /dev/dri/renderD[0-9]*; do
        [ -e "$p" ] || continue
        case "$p" in
            */card*)    n=$(( ${p#/dev/dri/card} - 1 ));;
            */renderD*) n=$(( ${p#/dev/dri/renderD} - 128 ));;
        esac
        [ "$n" -ge "$GPUS" ] && rm -f "$p"
    done
    if [ "$GPUS" -gt 0 ]; then
        for ((i = 0; i < GPUS; i++)); do
            node "/dev/nvidia$i" 195 "$i" 666 root
            node "/dev/dri/card$((i + 1))" 226 "$((i + 1))" 660 "$(grp video)"
            node "/dev/dri/renderD$((128 + i))" 226 "$((128 + i))" 666 "$(grp render)"
        done
        node /dev/nvidiactl 195 255 666 root
        node /dev/nvidia-uvm "$UVM_MAJOR" 0 666 root
        node /dev/nvidia-uvm-tools "$UVM_MAJOR" 1 666 root
    else
        rm -f /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools
    fi
    rmdir /dev/dri 2>/dev/null || true
}

apply_proc_driver() {
    local i b d
    rm -rf /proc/driver/nvidia
    [ "$GPUS" -gt 0 ] || return 0
    mkdir -p /proc/driver/nvidia/gpus
    printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Wed Jul 23 22:22:58 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n' \
        "$KVER" > /proc/driver/nvidia/version
    # the module's parameters, as a real driver shows them; ModifyDeviceFiles: 1 means the driver
    # (re)creates /dev/nvidia* itself, which NVIDIA's disable-device-node-modification hook hides
    # from containers (issue 11 item 5)
    cat > /proc/driver/nvidia/params <<'EOF2'
ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 0
RmProfilingAdminOnly: 1
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
RmNvlinkBandwidthLinkCount: 0
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 1
DmaRemapPeerMmio: 1
ImexChannelCount: 2048
CreateImexChannel0: 0
GrdmaPciTopoCheckOverride: 0
RegistryDwords: ""
RegistryDwordsPerDevice: ""
RmMsg: ""
GpuBlacklist: ""
TemporaryFilePath: ""
ExcludedGpus: ""
EOF2
    for ((i = 0; i < GPUS; i++)); do
        b=$(bus_of "$i"); d=/proc/driver/nvidia/gpus/$b
        mkdir -p "$d"
        cat > "$d/information" <<EOF
Model:           NVIDIA H100 80GB HBM3
IRQ:             $((400 + i))
GPU UUID:        $(uuid_of "$i")
Video BIOS:      96.00.99.00.01
Bus Type:        PCIe
DMA Size:        52 bits
DMA Mask:        0xfffffffffffff
Bus Location:    $b
Device Minor:    $i
GPU Excluded:    No
EOF
    done
}

apply_pci() {
    local d i b
    for d in /sys/bus/pci/devices/*; do
        [ -e "$d/.e2e-fake" ] && rm -rf "$d"
    done
    for ((i = 0; i < GPUS; i++)); do
        b=$(bus_of "$i"); d=/sys/bus/pci/devices/$b
        mkdir -p "$d/drm/card$((i + 1))" "$d/drm/renderD$((128 + i))"
        : > "$d/.e2e-fake"
        echo 0x10de > "$d/vendor"; echo 0x2330 > "$d/device"; echo 0x030200 > "$d/class"
        echo 0x10de > "$d/subsystem_vendor"; echo 0x16c1 > "$d/subsystem_device"
        printf 'DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SLOT_NAME=%s\n' "$b" > "$d/uevent"
        echo "226:$((i + 1))"   > "$d/drm/card$((i + 1))/dev"
        echo "226:$((128 + i))" > "$d/drm/renderD$((128 + i))/dev"
    done
}

# Library files and their SONAME links, like the NVIDIA installer leaves them.
remove_lib_files() {
    local f
    for f in "$LIBDIR"/*.so.[0-9]*.[0-9]* "$LIBDIR"/vdpau/*.so.[0-9]*.[0-9]*; do
        [ -e "$f" ] || continue
        grep -q e2e_fake_driver "$f" 2>/dev/null || continue   # only our stand-ins
        rm -f "$f"
    done
    # files of a real driver's userspace (a stage marked .real), as listed when they were installed
    if [ -s "$STATE/real-files" ]; then
        while IFS= read -r f; do rm -f "$LIBDIR/$f"; done < "$STATE/real-files"
        rm -f "$STATE/real-files"
    fi
    if [ -s "$STATE/real-bins" ]; then
        while IFS= read -r f; do rm -f "/usr/bin/$f"; done < "$STATE/real-bins"
        rm -f "$STATE/real-bins"
    fi
    # dangling links that pointed at them (SONAME and dev links)
    find "$LIBDIR" "$LIBDIR/vdpau" -maxdepth 1 -xtype l \( -name 'lib*nvidia*' -o -name 'libcuda*' \) -delete 2>/dev/null || true
}
# Whether the stand-ins of $UVER are installed byte for byte and nothing else of ours is: then
# apply_libs leaves every file (and its inode) alone. A running machine's driver root binds the
# host files themselves (issue 11), so reinstalling identical files under it on every fakehw
# call would make each running machine's driver root stale (post-start refuses one).
libs_current() {
    local f rel
    [ "$LIBS" = present ] && [ -d "$STAGE/$UVER" ] || return 1
    for f in "$STAGE/$UVER"/lib/*.so.* "$STAGE/$UVER"/lib/vdpau/*.so.*; do
        rel=${f#"$STAGE/$UVER/lib/"}
        cmp -s "$f" "$LIBDIR/$rel" || return 1
    done
    # nvidia-smi is rewritten by write_nvidia_smi with the current GPUs: compared there
    for f in "$STAGE/$UVER"/bin/*; do
        [ "${f##*/}" = nvidia-smi ] || cmp -s "$f" "/usr/bin/${f##*/}" || return 1
    done
    [ "$(ls /lib/firmware/nvidia 2>/dev/null)" = "$UVER" ] || return 1
    for f in "$STAGE/$UVER"/firmware/*; do cmp -s "$f" "/lib/firmware/nvidia/$UVER/${f##*/}" || return 1; done
    for f in "$LIBDIR"/*.so.* "$LIBDIR"/vdpau/*.so.*; do
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        grep -q e2e_fake_driver "$f" 2>/dev/null || continue
        [ -e "$STAGE/$UVER/lib/${f#"$LIBDIR/"}" ] || return 1
    done
}
apply_libs() {
    if libs_current; then return 0; fi
    remove_lib_files
    if [ "$LIBS" = present ]; then
        [ -d "$STAGE/$UVER" ] || { echo "fakehw: no stub libraries for version $UVER in $STAGE" >&2; exit 1; }
        mkdir -p "$LIBDIR/vdpau" "$STATE"
        # a real driver's files carry no marker: remember them to remove them again
        if [ -e "$STAGE/$UVER/.real" ]; then
            ( cd "$STAGE/$UVER/lib" && find . ! -type d | sed 's|^\./||' ) > "$STATE/real-files"
            ls "$STAGE/$UVER/bin" > "$STATE/real-bins"
        fi
        cp -a "$STAGE/$UVER/lib/." "$LIBDIR/"
        # SONAME links: ldconfig makes them in the dirs it scans; vdpau/ is not one, so link by hand
        [ ! -e "$LIBDIR/vdpau/libvdpau_nvidia.so.$UVER" ] || ( cd "$LIBDIR/vdpau" && ln -sfn "libvdpau_nvidia.so.$UVER" libvdpau_nvidia.so.1 )
        ( cd "$LIBDIR" && ln -sfn libcuda.so.1 libcuda.so && ln -sfn libnvidia-ml.so.1 libnvidia-ml.so )
        # binaries and firmware come with the same installer
        [ -z "$(ls "$STAGE/$UVER/bin")" ] || install -m755 "$STAGE/$UVER/bin/"* /usr/bin/
        rm -rf /lib/firmware/nvidia; mkdir -p "/lib/firmware/nvidia/$UVER"
        cp -a "$STAGE/$UVER/firmware/." "/lib/firmware/nvidia/$UVER/"
    fi
    ldconfig
}

write_nvidia_smi() {
    # a stand-in with the current state baked in, so it prints the same table in the host, in
    # the machine (which has its own /proc) and in a container
    [ -e /usr/bin/nvidia-smi ] || return 0
    local i rows=""
    for ((i = 0; i < GPUS; i++)); do
        rows+="|   $i  NVIDIA H100 80GB HBM3          Off |   $(bus_of "$i") Off |                    0 |"$'\n'
    done
    cat > /usr/bin/nvidia-smi.new <<EOF
#!/bin/sh
# e2e_fake_driver: stand-in for nvidia-smi
case "\${1:-}" in
  -L) $(for ((i = 0; i < GPUS; i++)); do printf "echo 'GPU %d: NVIDIA H100 80GB HBM3 (UUID: %s)'; " "$i" "$(uuid_of "$i")"; done) exit 0;;
  --version) echo "NVIDIA-SMI version  : $UVER"; echo "DRIVER version      : $KVER"; exit 0;;
esac
[ $GPUS -gt 0 ] || { echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9; }
cat <<'TABLE'
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI $UVER             Driver Version: $KVER     CUDA Version: 13.0     |
|-----------------------------------------+------------------------+----------------------+
${rows}+-----------------------------------------------------------------------------------------+
TABLE
EOF
    chmod 755 /usr/bin/nvidia-smi.new
    # unchanged: keep the file (and its inode, which a running machine's driver root binds)
    if cmp -s /usr/bin/nvidia-smi.new /usr/bin/nvidia-smi; then rm -f /usr/bin/nvidia-smi.new; return 0; fi
    mv /usr/bin/nvidia-smi.new /usr/bin/nvidia-smi
}

apply() {
    save_conf
    write_proc_devices
    apply_proc_driver
    apply_pci
    apply_nodes
    apply_libs
    write_nvidia_smi
}

status() {
    echo "config: GPUS=$GPUS KVER=$KVER UVER=$UVER LIBS=$LIBS UVM_MAJOR=$UVM_MAJOR RENUMBER=$RENUMBER"
    ls -l /dev/nvidia* /dev/dri 2>/dev/null || true
    grep -E 'nvidia|drm' /proc/devices || true
    ls /proc/driver/nvidia/gpus 2>/dev/null || true
    ldconfig -p | grep -E 'nvidia|cuda' || true
}

cmd=${1:-status}; shift || true
case "$cmd" in
    setup) setup;;
    apply) apply;;
    gpus) GPUS=${1:?count}; apply;;
    remove-libs) LIBS=absent; apply;;
    restore-libs) LIBS=present; apply;;
    version) KVER=${1:?kernel version}; UVER=${2:-$1}; apply;;
    renumber) RENUMBER=${1:?0 or 1}; apply;;
    status) status;;
    *) echo "fakehw: unknown command $cmd" >&2; exit 2;;
esac
