# shellcheck shell=bash
# Scenario 0: the rig itself. Runs with the stand-in helper too (HELPER unset), so it proves the
# harness before the product exists: host boots, the fake driver looks real to systemd, DevicePolicy
# is enforced, the stock unit + drop-in starts a registered machine with real containerd and the
# kubelet stand-in, and the GPU nodes are usable (ENXIO, not EPERM) inside it.
scenario "rig sanity"

# ---- the host container ----------------------------------------------------------------------
assert_eq "$(c host-running)" running "$(H systemctl is-system-running 2>/dev/null)"
assert_eq "$(c fakehw-unit-active)" active "$(H systemctl is-active e2e-fakehw.service 2>/dev/null)"
info "host kernel $(uname -r); host cgroup fs: $(H stat -fc %T /sys/fs/cgroup)"

# ---- the fake driver, as the host sees it ----------------------------------------------------
pd=$(H cat /proc/devices)
assert_match "$(c proc-devices-nvidia)" '^195 nvidia$' "$pd"
assert_match "$(c proc-devices-nvidia-uvm)" '^[0-9]+ nvidia-uvm$' "$pd"
assert_match "$(c proc-devices-drm)" '^226 drm$' "$pd"
assert_match "$(c proc-driver-version)" "^NVRM version: NVIDIA UNIX x86_64 Kernel Module  $DRIVER_VERSION  " \
    "$(H cat /proc/driver/nvidia/version 2>&1)"
assert_eq "$(c proc-driver-gpus)" "$E2E_GPUS" "$(H sh -c 'ls /proc/driver/nvidia/gpus | wc -l')"
info0=$(H cat /proc/driver/nvidia/gpus/0000:06:00.0/information 2>&1)
assert_match "$(c gpu0-information)" '^GPU UUID: +GPU-[0-9a-f-]{36}$' "$info0"
assert_match "$(c gpu0-minor)" '^Device Minor: +0$' "$info0"
assert_eq "$(c pci-vendor)" 0x10de "$(H cat /sys/bus/pci/devices/0000:06:00.0/vendor 2>&1)"
assert_eq "$(c pci-drm)" "card1 renderD128" "$(H ls /sys/bus/pci/devices/0000:06:00.0/drm 2>&1 | tr '\n' ' ' | sed 's/ $//')"
real_pci=$(ls /sys/bus/pci/devices | wc -l)
assert_eq "$(c pci-real-devices-kept)" "$((real_pci + E2E_GPUS))" "$(H sh -c 'ls /sys/bus/pci/devices | wc -l')"
ldc=$(H ldconfig -p)
assert_match "$(c ldcache-libcuda)" "libcuda\.so\.1 .*=> (/usr)?/lib/x86_64-linux-gnu/libcuda\.so\.1$" "$ldc"
assert_match "$(c ldcache-libnvidia-ml)" 'libnvidia-ml\.so\.1 ' "$ldc"
assert_eq "$(c libcuda-soname-link)" "libcuda.so.$DRIVER_VERSION" "$(H readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1)"
assert_eq "$(c vdpau-soname-link)" "libvdpau_nvidia.so.$DRIVER_VERSION" "$(H readlink /usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.1)"
assert_match "$(c libcuda-is-elf-with-soname)" 'Shared object|ELF' "$(file -b "$RUN/host/usr/lib/x86_64-linux-gnu/libcuda.so.$DRIVER_VERSION" 2>/dev/null || head -c4 "$RUN/host/usr/lib/x86_64-linux-gnu/libcuda.so.$DRIVER_VERSION" | tr -d '\177')"
assert_match "$(c nvidia-smi)" "Driver Version: $DRIVER_VERSION" "$(H nvidia-smi 2>&1)"
assert_cmd "$(c firmware)" H test -s "/lib/firmware/nvidia/$DRIVER_VERSION/gsp_ga10x.bin"
assert_cmd "$(c dev-nvidia0-node)" H test -c /dev/nvidia0

# ---- DevicePolicy enforcement in the host (transient units, real cgroup BPF) -----------------
probe() { # probe <DeviceAllow or ""> <node>: errno of open() in a DevicePolicy=closed unit
    local args=(-p DevicePolicy=closed)
    [ -n "$1" ] && args+=(-p "DeviceAllow=$1")
    local out
    out=$(H systemd-run --wait --pipe --quiet --collect "${args[@]}" /bin/sh -c "exec 3<'$2' && echo opened" 2>&1 </dev/null)
    case "$out" in *opened*) echo opened;; *"No such device or address"*) echo ENXIO;;
                   *"Operation not permitted"*) echo EPERM;; *) echo "other: $out";; esac
}
r=$(probe "" /dev/nvidia0)
if [ "$r" = EPERM ]; then
    pass "$(c device-policy-enforced)"
    info "DevicePolicy= IS enforced in the host container (cgroup2 + bpf() allowed)"
else
    fail "$(c device-policy-enforced)" "DevicePolicy=closed without DeviceAllow gave $r, not EPERM: NOT enforced (hybrid cgroups, or bpf() blocked by nspawn's seccomp)"
fi
# systemd resolves char-<group> by reading /proc/devices when the unit starts. The real kernel has no
# nvidia/drm majors, so ENXIO here proves systemd read the bind-mounted stand-in.
assert_eq "$(c char-nvidia-glob-resolves-via-fake-proc-devices)" ENXIO "$(probe 'char-nvidia* rw' /dev/nvidia0)"
assert_eq "$(c char-nvidia-glob-covers-uvm)" ENXIO "$(probe 'char-nvidia* rw' /dev/nvidia-uvm)"
assert_eq "$(c char-drm-resolves)" ENXIO "$(probe 'char-drm rw' /dev/dri/renderD128)"
assert_eq "$(c char-nvidia-frontend-alone-denies)" EPERM "$(probe 'char-nvidia-frontend rw' /dev/nvidia0)"

# ---- the unit under test ---------------------------------------------------------------------
u=$(unit_of kube1)
dropins=$(uprop DropInPaths kube1)
info "drop-ins: $dropins"
assert_eq "$(c execstartpre-pre-start-once)" 1 "$(exec_count kube1 ExecStartPre 'nspawn-lifecycle pre-start')"
assert_eq "$(c execstartpost-post-start-once)" 1 "$(exec_count kube1 ExecStartPost 'nspawn-lifecycle post-start')"
assert_match "$(c deviceallow-char-nvidia)" 'char-nvidia\* rwm' "$(uprop DeviceAllow kube1)"
assert_eq "$(c restart-on-failure)" on-failure "$(uprop Restart kube1)"
assert_eq "$(c start-limit-off)" 0 "$(uprop StartLimitIntervalUSec kube1)"
# systemd logs (and ignores) keys it does not know in a drop-in; none may be ignored in ours
assert_no_match "$(c dropin-no-ignored-keys)" "systemd-nspawn@kube1\.service\.d/.*ignoring" \
    "$(H journalctl -b --no-pager -o cat _PID=1 2>/dev/null | sort -u)"
t0=$(now_ms)
if start_unit kube1; then pass "$(c unit-start)"; else fail "$(c unit-start)" "$(H systemctl status "$u" --no-pager -l 2>&1 | tail -15)"; fi
info "systemctl start $u took $(( $(now_ms) - t0 )) ms"
assert_eq "$(c unit-active)" active "$(uprop ActiveState kube1)"
assert_eq "$(c pre-start-ran-ok)" 0 "$(exec_field kube1 ExecStartPre 'pre-start' status)"
assert_eq "$(c post-start-ran-ok)" 0 "$(exec_field kube1 ExecStartPost 'post-start' status)"
nf=$(nspawn_file kube1)
assert_match "$(c nspawn-private-users-no)" '^PrivateUsers=no$' "$nf"
# the product says no (post-start overlaps the boot); only the shell doubles say yes
if have_real_helper; then
    assert_match "$(c nspawn-notify-ready)" '^NotifyReady=no$' "$nf"
else
    assert_match "$(c nspawn-notify-ready)" '^NotifyReady=(yes|no)$' "$nf"
fi

# ---- the machine -----------------------------------------------------------------------------
assert_cmd "$(c machine-registered)" machine_registered kube1
L=$(leader_of kube1)
assert_match "$(c machine-leader)" '^[1-9][0-9]*$' "$L"
info "kube1 leader pid (host view) $L, cgroup $(H cat /proc/"$L"/cgroup 2>/dev/null | tr '\n' ' ')"
assert_cmd "$(c containerd-active)" wait_until 60 inner_active containerd.service kube1
assert_cmd "$(c kubelet-active)" wait_until 60 inner_active kubelet.service kube1
ctrv=$(M ctr version 2>&1)
if printf '%s' "$ctrv" | grep -q '^Server:'; then pass "$(c ctr-version)"; else fail "$(c ctr-version)" "$ctrv"; fi
assert_cmd "$(c ctr-k8s-namespace)" M ctr -n k8s.io images ls -q

expect="/dev/nvidia0 c 195:0
/dev/nvidia1 c 195:1
/dev/nvidiactl c 195:255
/dev/nvidia-uvm c $(H awk '$2=="nvidia-uvm"{print $1}' /proc/devices):0
/dev/nvidia-uvm-tools c $(H awk '$2=="nvidia-uvm"{print $1}' /proc/devices):1
/dev/dri/card1 c 226:1
/dev/dri/renderD128 c 226:128"
got=$(M /bin/sh -c 'for d in /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/dri/card1 /dev/dri/renderD128; do
    if [ -c $d ]; then echo "$d c $(stat -c "%t %T" $d | { read a b; echo $((0x$a)):$((0x$b)); })"; else echo "$d missing"; fi; done' 2>&1)
assert_eq "$(c devices-visible-in-machine)" "$expect" "$got"
for d in /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/dri/renderD128; do
    assert_eq "$(c "open-${d#/dev/}-enxio")" ENXIO "$(open_errno kube1 "$d")"
done
# the machine's unit really has a closed device policy: a node outside the allow list is refused
r=$(M /bin/sh -c 'rm -f /tmp/e2e-probe; mknod /tmp/e2e-probe c 240 0 2>&1 && exec 3</tmp/e2e-probe' 2>&1)
assert_match "$(c device-policy-enforced-in-machine)" 'Operation not permitted' "$r"
M rm -f /tmp/e2e-probe >/dev/null 2>&1
scenario_end
