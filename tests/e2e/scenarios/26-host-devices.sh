# shellcheck shell=bash
# Scenario 26: the host devices a node needs beside its GPUs, and NVIDIA nodes the host makes
# while the machine runs. In the host: vhost-net, two fake InfiniBand nodes (major 231, named
# infiniband_verbs/infiniband_mad in the /proc/devices stand-in), a block node for a disk the
# kernel's /proc/partitions lists, and the fake nvidia-caps and IMEX majors. After a reconcile
# the .nspawn file binds them (InfiniBand and the two NVIDIA directories whole), the unit's
# runtime DeviceAllow= allows them, and they open in the machine (never EPERM). After the start
# the host makes an IMEX channel, a MIG cap and an InfiniBand port: each appears in the running
# machine and passes its device cgroup (ENXIO on the fake majors), no restart, and the path unit
# install wrote links the NVIDIA ones in the machine's /dev/char (status in sync). A second disk
# node made on the host is drift that status names and reconcile binds. The machine's own bpf
# filesystem: a map pinned in its /sys/fs/bpf is in its host directory only and survives the
# restart. Last, kube1 with a share of the GPUs: a MIG cap made later is neither in it nor allowed. This kernel's disks are
# what /proc/partitions lists: one mounted in the host container (the outer machine's, which the
# rig binds from) is the host's, so it is listed as used and never bound. The disks a
# machine gets are stand-in entries, e2edisk1 and e2edisk0, in a copy of /proc/partitions bound
# over it, numbered after the real disk's major so that only our DeviceAllow= lets them open
# (ENXIO); a stand-in device-mapper target over one (dm-9, its slaves/ in a tmpfs over
# /sys/block holding the real entries as links) makes it the host's.
scenario "host devices and nodes made while the machine runs" --needs-helper
baseline

# A disk (or partition) mounted in the host container: the first mount of its PID 1's with a
# block device the kernel lists (the rig binds the helper and its caches from the outer
# machine's disk; the helper itself may by now be the Debian package's copy on the overlay).
USED_DEV=$(H sh -c 'awk "\$3 !~ /^0:/ {print \$3}" /proc/1/mountinfo | while IFS=: read -r ma mi; do
        awk -v ma="$ma" -v mi="$mi" "\$1 == ma && \$2 == mi {print ma\":\"mi; exit}" /proc/partitions; done | head -1')
USED=$(H sh -c "basename \"\$(readlink -f /sys/dev/block/$USED_DEV)\"" 2>/dev/null)
DISKS=()
if [ -n "$USED" ] && [ "${USED_DEV%%:*}" != 0 ]; then
    DISKS+=("e2edisk1 ${USED_DEV%%:*}:$(( ${USED_DEV##*:} + 241 ))")
    DISKS+=("e2edisk0 ${USED_DEV%%:*}:$(( ${USED_DEV##*:} + 240 ))")
fi
# Free majors in the /proc/devices stand-in for the fake nvidia-caps and IMEX channel drivers.
mapfile -t FREE < <(H awk '/^Character/{c=1;next} /^$/{c=0} c{print $1}' /proc/devices \
    | sort -n | awk 'BEGIN{for(m=503;m>=480;m--) free[m]=1} {delete free[$1]} END{for(m=503;m>=480;m--) if(m in free) print m}' | head -2)
CAPS=${FREE[0]:-} IMEX=${FREE[1]:-}
cleanup() {
    H rm -rf /dev/infiniband /dev/nvidia-caps /dev/nvidia-caps-imex-channels
    H sh -c 'umount /proc/partitions /sys/block 2>/dev/null; rm -rf /run/e2e-partitions /run/e2e-sys-block'
    [ "${MADE_VHOST:-0}" = 1 ] && H rm -f /dev/vhost-net
    [ "${MADE_USED:-0}" = 1 ] && H rm -f "/dev/$USED"
    for d in "${DISKS[@]}"; do H rm -f "/dev/${d%% *}"; done
    H rm -f "$NL_CFG"; helper install kube1 >/dev/null 2>&1
    fake_gpus "$E2E_GPUS"   # rewrites the /proc/devices stand-in without our majors
    reconcile kube1 >/dev/null 2>&1
}
if [ "${#DISKS[@]}" -lt 2 ] || [ -z "$IMEX" ]; then
    fail "$(c setup)" "need a block device mounted in the host container (${USED_DEV:-none}: ${USED:-not in sysfs}) and two free majors (${FREE[*]})"
    scenario_end
    exit 0
fi
info "host's disk $USED ($USED_DEV); stand-ins ${DISKS[*]}; fake nvidia-caps $CAPS, nvidia-caps-imex-channels $IMEX"
read -r DISK1 DEV1 <<<"${DISKS[0]}"
read -r DISK2 DEV2 <<<"${DISKS[1]}"

# ---- the host as a GPU node's host ----------------------------------------------------------
H sh -c "awk -v caps=$CAPS -v imex=$IMEX '
    /^Character devices:/ {print; c=1; next}
    c && /^\$/ {printf \"231 infiniband_verbs\n231 infiniband_mad\n%3d nvidia-caps\n%3d nvidia-caps-imex-channels\n\", caps, imex; c=0}
    {print}' /proc/devices > /run/e2e-proc-devices && cat /run/e2e-proc-devices > /proc/devices"
assert_match "$(c proc-devices-stand-in)" "$IMEX nvidia-caps-imex-channels" "$(H cat /proc/devices)"
MADE_VHOST=0
if ! H test -c /dev/vhost-net; then H mknod -m 0600 /dev/vhost-net c 10 238; MADE_VHOST=1; fi
H sh -c 'rm -rf /dev/infiniband /dev/nvidia-caps /dev/nvidia-caps-imex-channels &&
    mkdir /dev/infiniband && mknod -m 0666 /dev/infiniband/uverbs0 c 231 192 &&
    mknod -m 0600 /dev/infiniband/umad0 c 231 0'
H mknod -m 0660 "/dev/$DISK1" b "${DEV1%%:*}" "${DEV1##*:}"
# The stand-ins in the kernel's list of block devices: a copy of /proc/partitions with their
# lines, bound over it (as lxcfs binds its files over /proc's).
H sh -c "cat /proc/partitions > /run/e2e-partitions &&
    printf '%4d %7d %10d %s\n' ${DEV1%%:*} ${DEV1##*:} 1048576 $DISK1 ${DEV2%%:*} ${DEV2##*:} 1048576 $DISK2 >> /run/e2e-partitions &&
    mount --bind /run/e2e-partitions /proc/partitions"
assert_match "$(c stand-in-disk-in-proc-partitions)" " $DISK2\$" "$(H cat /proc/partitions)"
# Other machines may be installed by earlier scenarios: a machine beside others gets only the
# disks its devices.disks names (e2edisk0 is not on the host yet: left out until it is).
DISKS_CFG="{\"machines\": {\"kube1\": {\"devices\": {\"disks\": [\"/dev/$DISK1\", \"/dev/$DISK2\"]}}}}"
printf '%s\n' "$DISKS_CFG" | H sh -c "mkdir -p ${NL_CFG%/*} && cat > $NL_CFG"
info "installed machines: $(H ls /etc/systemd/system | grep -c '^systemd-nspawn@.*\.service\.d$'); config: $DISKS_CFG"
# The host's own disk with a node in the host, as on a real host.
MADE_USED=0
if ! H test -b "/dev/$USED"; then
    H mknod -m 0660 "/dev/$USED" b "${USED_DEV%%:*}" "${USED_DEV##*:}"; MADE_USED=1
fi

out=$(H "$HP" discover 2>&1)
assert_match "$(c discover-lists-network)" 'network /dev/vhost-net char 10:238' "$out"
assert_match "$(c discover-lists-infiniband)" 'infiniband /dev/infiniband/uverbs0 char 231:192' "$out"
assert_match "$(c discover-lists-the-disk)" "block /dev/$DISK1 block $DEV1" "$out"
assert_no_match "$(c discover-skips-disks-without-nodes)" "block /dev/$DISK2 " "$out"
assert_match "$(c discover-says-the-hosts-disk-is-used)" "/dev/$USED $USED_DEV the host's: (mounted at |/dev/[^ ]* on the same disk is mounted at )" "$out"
assert_no_match "$(c hosts-disk-not-a-host-device)" "block /dev/$USED block" "$out"

out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-exit-0)" 0 "$rc"; [ "$rc" = 0 ] || info "reconcile: $out"
wait_machine_up kube1 60 || fail "$(c kube1-up)" "$(uprop ActiveState kube1)"
f=$(nspawn_file kube1)
for b in /dev/net/tun /dev/vhost-net "/dev/$DISK1" /dev/nvidia-caps /dev/nvidia-caps-imex-channels; do
    assert_match "$(c "binds-${b//\//-}")" "^Bind=$b\$" "$f"
done
assert_match "$(c binds-infiniband-read-only)" '^BindReadOnly=/dev/infiniband$' "$f"
assert_no_match "$(c never-binds-the-hosts-disk)" "^Bind=/dev/$USED\$" "$f"
# Read-only: the machine can leave nothing there for every other machine's start to read, and
# its ports still open (uverbs0-enxio below: the device, not the mount, answers).
assert_match "$(c infiniband-read-only-in-machine)" 'Read-only file system' "$(M -m kube1 touch /dev/infiniband/e2e-junk 2>&1)"
assert_cmd "$(c pre-start-made-the-caps-dirs)" H test -d /dev/nvidia-caps-imex-channels
allow=$(uprop DeviceAllow kube1)
info "kube1 DeviceAllow: $allow"
for e in 'char-infiniband_verbs rwm' 'char-infiniband_mad rwm' '/dev/char/10:238 rwm' "/dev/block/$DEV1 rwm" 'char-nvidia\* rwm' 'char-macvtap rwm'; do
    assert_match "$(c "allows-${e%% *}")" "$e" "$allow"
done

# ---- its own bpf filesystem at /sys/fs/bpf ---------------------------------------------------
assert_match "$(c binds-its-bpffs)" '^Bind=/run/nspawn-lifecycle/bpffs/kube1:/sys/fs/bpf$' "$f"
assert_eq "$(c host-bpffs-mounted)" bpf "$(H findmnt -n -o FSTYPE /run/nspawn-lifecycle/bpffs/kube1)"
assert_eq "$(c machine-sys-fs-bpf-is-bpffs)" cafe4a11 "$(M -m kube1 stat -f -c %t /sys/fs/bpf)"
tmp=$(mktemp -d)
cat > "$tmp/bpfpin.c" <<'EOF'
#include <errno.h>
#include <linux/bpf.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
/* bpfpin PATH: create an array map and pin it at PATH, as an eBPF datapath pins its maps. */
int main(int argc, char **argv) {
    union bpf_attr a;
    if (argc != 2) return 2;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_ARRAY; a.key_size = 4; a.value_size = 4; a.max_entries = 1;
    long fd = syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof a);
    if (fd < 0) { printf("map: errno %d (%s)\n", errno, strerror(errno)); return 1; }
    memset(&a, 0, sizeof a);
    a.pathname = (unsigned long)argv[1]; a.bpf_fd = (unsigned)fd;
    if (syscall(SYS_bpf, BPF_OBJ_PIN, &a, sizeof a) < 0) { printf("pin: errno %d (%s)\n", errno, strerror(errno)); return 1; }
    printf("pinned %s\n", argv[1]);
    return 0;
}
EOF
R=$(mroot kube1)
if gcc -static -O2 -o "$tmp/bpfpin" "$tmp/bpfpin.c"; then
    mkdir -p "$R/usr/local/bin" && install -m 0755 "$tmp/bpfpin" "$R/usr/local/bin/e2e-bpfpin"
    assert_eq "$(c map-pinned-in-machine)" "pinned /sys/fs/bpf/e2e-pin" "$(M -m kube1 /usr/local/bin/e2e-bpfpin /sys/fs/bpf/e2e-pin 2>&1)"
    assert_cmd "$(c pin-in-its-host-dir)" H test -e /run/nspawn-lifecycle/bpffs/kube1/e2e-pin
    assert_not_cmd "$(c pin-not-in-the-hosts-bpffs)" H test -e /sys/fs/bpf/e2e-pin
    # Another machine, running beside it, has a bpf filesystem of its own without kube1's pin.
    helper install kube2 >/dev/null 2>&1
    if start_unit kube2 >/dev/null 2>&1 && wait_machine_up kube2 120; then
        assert_eq "$(c kube2-bpffs-mounted)" bpf "$(H findmnt -n -o FSTYPE /run/nspawn-lifecycle/bpffs/kube2)"
        assert_eq "$(c kube2-sys-fs-bpf-is-bpffs)" cafe4a11 "$(M -m kube2 stat -f -c %t /sys/fs/bpf 2>&1)"
        assert_eq "$(c pin-not-in-another-machine)" absent "$(M -m kube2 sh -c 'test -e /sys/fs/bpf/e2e-pin && echo present || echo absent' 2>&1)"
    else
        fail "$(c kube2-up)" "$(uprop ActiveState kube2)"
    fi
    stop_unit kube2 >/dev/null 2>&1
else
    fail "$(c bpfpin-built)" "gcc -static failed"
fi
rm -rf "$tmp"

# ---- what the machine gets at its start -------------------------------------------------------
assert_eq "$(c tun-opens)" opened "$(open_errno kube1 /dev/net/tun)"
assert_ne "$(c vhost-net-not-eperm)" EPERM "$(open_errno kube1 /dev/vhost-net)"
assert_eq "$(c uverbs0-enxio)" ENXIO "$(open_errno kube1 /dev/infiniband/uverbs0)"
assert_eq "$(c umad0-enxio)" ENXIO "$(open_errno kube1 /dev/infiniband/umad0)"
# The stand-in disk: allowed by our DeviceAllow= entry alone (no device behind its numbers:
# ENXIO, never EPERM), in the host container and in the machine alike.
host_open=$(H sh -c "exec 3<'/dev/$DISK1' && echo opened" 2>&1)
case $host_open in *"No such device or address"*) host_open=ENXIO;; *"not permitted"*) host_open=EPERM;; esac
assert_eq "$(c disk-enxio-in-the-host)" ENXIO "$host_open"
assert_eq "$(c disk-enxio-in-the-machine)" ENXIO "$(open_errno kube1 "/dev/$DISK1")"
assert_eq "$(c gpu-still-enxio)" ENXIO "$(open_errno kube1 /dev/nvidia0)"

# ---- nodes the host makes while the machine runs: no restart ----------------------------------
leader=$(leader_of kube1)
H mknod -m 0666 /dev/nvidia-caps-imex-channels/channel1 c "$IMEX" 1
H mknod -m 0444 /dev/nvidia-caps/nvidia-cap5 c "$CAPS" 5
H mknod -m 0666 /dev/infiniband/uverbs1 c 231 193
for n in /dev/nvidia-caps-imex-channels/channel1 /dev/nvidia-caps/nvidia-cap5 /dev/infiniband/uverbs1; do
    assert_cmd "$(c "appears-${n##*/}")" M -m kube1 test -c "$n"
    assert_eq "$(c "opens-${n##*/}-enxio")" ENXIO "$(open_errno kube1 "$n")"
done
assert_eq "$(c no-restart)" "$leader" "$(leader_of kube1)"
# The machine has no udev: nspawn-lifecycle-devices@kube1.path (its drop-in wants it) runs
# refresh-devices, which links them in /dev/char; then status is in sync.
assert_eq "$(c devices-path-unit-active)" active \
    "$(H systemctl show -p ActiveState --value nspawn-lifecycle-devices@kube1.path)"
linked=""
for _ in $(seq 50); do
    linked=$(M -m kube1 readlink "/dev/char/$IMEX:1" 2>/dev/null) && [ -n "$linked" ] && break
    sleep 0.2
done
assert_eq "$(c channel-linked-while-running)" /dev/nvidia-caps-imex-channels/channel1 "$linked"
assert_eq "$(c cap-linked-while-running)" /dev/nvidia-caps/nvidia-cap5 \
    "$(M -m kube1 readlink "/dev/char/$CAPS:5" 2>/dev/null)"
assert_match "$(c refresh-logged)" 'dev-char' \
    "$(H journalctl --no-pager -o cat -u nspawn-lifecycle-devices@kube1.service 2>/dev/null)"
out=$(H "$HP" status kube1 2>&1); rc=$?
assert_eq "$(c status-in-sync-with-new-nodes)" 0 "$rc"; [ "$rc" = 0 ] || info "status: $out"
assert_eq "$(c still-no-restart)" "$leader" "$(leader_of kube1)"
H rm -f /dev/nvidia-caps-imex-channels/channel1 /dev/nvidia-caps/nvidia-cap5
# Their links go with them (the directories changed again).
gone=""
for _ in $(seq 50); do
    M -m kube1 test -L "/dev/char/$IMEX:1" || { gone=yes; break; }
    sleep 0.2
done
assert_eq "$(c channel-link-removed-with-it)" yes "$gone"

# ---- a disk added on the host: drift until the next start binds it -----------------------------
H mknod -m 0660 "/dev/$DISK2" b "${DEV2%%:*}" "${DEV2##*:}"
out=$(H "$HP" status kube1 2>&1); rc=$?
assert_eq "$(c status-hot-added-disk-drift)" 5 "$rc"
assert_match "$(c status-names-the-disk)" "host-devices.*/dev/$DISK2|/dev/$DISK2.*next start binds it" "$out"
out=$(H "$HP" plan kube1 2>&1)
assert_match "$(c plan-binds-the-disk)" "^\\+Bind=/dev/$DISK2\$" "$out"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-binds-the-disk)" 0 "$rc"; [ "$rc" = 0 ] || info "reconcile: $out"
wait_machine_up kube1 60 || fail "$(c kube1-up-again)" "$(uprop ActiveState kube1)"
assert_eq "$(c new-disk-allowed-enxio)" ENXIO "$(open_errno kube1 "/dev/$DISK2")"
assert_cmd "$(c pin-survives-the-restart)" M -m kube1 test -e /sys/fs/bpf/e2e-pin
rm -f "$R/usr/local/bin/e2e-bpfpin"
out=$(H "$HP" status kube1 2>&1); rc=$?
assert_eq "$(c status-in-sync-after-reconcile)" 0 "$rc"; [ "$rc" = 0 ] || info "status: $out"

# ---- a bound disk the host starts to use (a stand-in device-mapper target, dm-9, made of it) ----
H sh -c "printf '%4d %7d %10d %s\n' 253 199 1048576 dm-9 >> /run/e2e-partitions &&
    rm -rf /run/e2e-sys-block && mkdir /run/e2e-sys-block &&
    for d in /sys/block/*; do ln -s \"\$(readlink -f \"\$d\")\" /run/e2e-sys-block/\"\${d##*/}\"; done &&
    mkdir -p /run/e2e-sys-block/dm-9/slaves/$DISK2 && mount --bind /run/e2e-sys-block /sys/block"
out=$(H "$HP" status kube1 2>&1); rc=$?
assert_eq "$(c status-disk-the-host-uses-broken)" 6 "$rc"
assert_match "$(c status-names-the-disk-the-host-uses)" "/dev/$DISK2 in the machine: the running machine has this disk and the host uses it now \\(held by dm-9" "$out"
# Keep the bound file's inode: write the lines back into it.
H sh -c "umount /sys/block && grep -v ' dm-9\$' /run/e2e-partitions > /run/e2e-partitions.new &&
    cat /run/e2e-partitions.new > /run/e2e-partitions && rm -f /run/e2e-partitions.new"
out=$(H "$HP" status kube1 2>&1); rc=$?
assert_eq "$(c status-in-sync-once-the-host-lets-go)" 0 "$rc"; [ "$rc" = 0 ] || info "status: $out"

# ---- a machine with a share of the GPUs: a node made later is neither in it nor allowed ---------
printf '%s\n' "{\"machines\": {\"kube1\": {\"gpus\": [0], \"devices\": {\"disks\": [\"/dev/$DISK1\", \"/dev/$DISK2\"]}}}}" | H sh -c "mkdir -p ${NL_CFG%/*} && cat > $NL_CFG"
out=$(helper install kube1 2>&1); rc=$?
assert_eq "$(c share-install)" 0 "$rc"; [ "$rc" = 0 ] || info "install: $out"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c share-reconcile)" 0 "$rc"; [ "$rc" = 0 ] || info "reconcile: $out"
wait_machine_up kube1 60 || fail "$(c share-up)" "$(uprop ActiveState kube1)"
f=$(nspawn_file kube1)
assert_no_match "$(c share-binds-no-nvidia-dirs)" '^Bind=/dev/nvidia-caps(-imex-channels)?$' "$f"
assert_match "$(c share-keeps-host-devices)" '^BindReadOnly=/dev/infiniband$' "$f"
H mknod -m 0444 /dev/nvidia-caps/nvidia-cap7 c "$CAPS" 7
assert_not_cmd "$(c share-new-cap-not-in-machine)" M -m kube1 test -e /dev/nvidia-caps/nvidia-cap7
assert_eq "$(c share-new-cap-mknod-eperm)" EPERM "$(mknod_open kube1 "$CAPS" 7)"
assert_eq "$(c share-own-gpu-enxio)" ENXIO "$(open_errno kube1 /dev/nvidia0)"
assert_eq "$(c share-other-gpu-eperm)" EPERM "$(mknod_open kube1 195 1)"
H rm -f /dev/nvidia-caps/nvidia-cap7
printf '%s\n' "$DISKS_CFG" | H sh -c "cat > $NL_CFG"
out=$(helper install kube1 2>&1); rc=$?
assert_eq "$(c all-again-install)" 0 "$rc"; [ "$rc" = 0 ] || info "install: $out"

cleanup
scenario_end
