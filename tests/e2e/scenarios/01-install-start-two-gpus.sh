# shellcheck shell=bash
# Scenario 1 (issue 5 §1): install + start with two fake GPUs. From a node without our drop-in or
# .nspawn file: `install`, then start the stock unit; the .nspawn binds, devices usable in the
# machine (ENXIO, not EPERM), driver root, links, /dev/char links and CDI spec present and valid,
# containerd and kubelet active; both skipped at boot by the unit gate and started once by
# post-start (stop kubelet, stop containerd, file steps, release the gate, start containerd, start
# kubelet).
scenario "install + start with two GPUs" --needs-helper
baseline
fake_gpus 2

u=$(unit_of kube1)
stop_unit kube1 >/dev/null 2>&1
H rm -rf "/etc/systemd/system/$u.d" /etc/systemd/nspawn/kube1.nspawn
H systemctl daemon-reload

# ---- install ----------------------------------------------------------------------------------
out=$(helper install kube1 2>&1); rc=$?
info "install output: $(printf '%s' "$out" | tail -5 | tr '\n' ' ')"
assert_eq "$(c install-exit-0)" 0 "$rc"
assert_eq "$(c install-no-daemon-reload-needed)" no "$(uprop NeedDaemonReload kube1)"
assert_eq "$(c execstartpre-pre-start-once)" 1 "$(exec_count kube1 ExecStartPre 'nspawn-lifecycle pre-start kube1')"
assert_eq "$(c execstartpost-post-start-once)" 1 "$(exec_count kube1 ExecStartPost 'nspawn-lifecycle post-start kube1')"
assert_eq "$(c execstartpre-terminate-once)" 1 "$(exec_count kube1 ExecStartPre 'machinectl terminate kube1')"
assert_match "$(c hooks-use-stable-path)" "argv\[\]=$HP nspawn-lifecycle pre-start" "$(uprop ExecStartPre kube1)"
da=$(uprop DeviceAllow kube1)
for want in 'char-nvidia\* rwm' 'char-drm rwm' '/dev/kvm rwm'; do
    assert_match "$(c "deviceallow-${want%% *}")" "$want" "$da"
done
env_=$(uprop Environment kube1)
assert_match "$(c env-unified-hierarchy)" 'SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1' "$env_"
assert_match "$(c env-api-vfs-writable)" 'SYSTEMD_NSPAWN_API_VFS_WRITABLE=network' "$env_"
assert_eq "$(c restart-on-failure)" on-failure "$(uprop Restart kube1)"
assert_eq "$(c start-limit-off)" 0 "$(uprop StartLimitIntervalUSec kube1)"
assert_no_match "$(c dropin-no-ignored-keys)" "systemd-nspawn@kube1\.service\.d/.*ignoring" \
    "$(H journalctl -b --no-pager -o cat _PID=1 2>/dev/null | sort -u)"
assert_cmd "$(c install-rendered-nspawn)" H test -s /etc/systemd/nspawn/kube1.nspawn
assert_cmd "$(c stable-helper-present)" H test -x "$HP"

# ---- start ------------------------------------------------------------------------------------
t0=$(now_ms)
if start_unit kube1; then pass "$(c unit-start)"; else fail "$(c unit-start)" "$(H systemctl status "$u" --no-pager -l 2>&1 | tail -15)"; fi
info "start with two GPUs took $(( $(now_ms) - t0 )) ms"
assert_eq "$(c pre-start-status)" 0 "$(exec_field kube1 ExecStartPre 'pre-start' status)"
assert_eq "$(c post-start-status)" 0 "$(exec_field kube1 ExecStartPost 'post-start' status)"
assert_cmd "$(c machine-up)" wait_machine_up kube1 60

# ---- the rendered .nspawn --------------------------------------------------------------------
nf=$(nspawn_file kube1)
info "kube1.nspawn:"; printf '%s\n' "$nf" | sed 's/^/    | /'
for d in /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools \
         /dev/dri/card1 /dev/dri/card2 /dev/dri/renderD128 /dev/dri/renderD129; do
    assert_match "$(c "nspawn-bind-${d#/dev/}")" "^Bind=$d(:$d)?$" "$nf"
done
for kv in 'PrivateUsers=no' 'NotifyReady=no' 'Capability=all' 'VirtualEthernet=no' 'BindReadOnly=/lib/modules'; do
    assert_match "$(c "nspawn-${kv%%=*}")" "^$kv" "$nf"
done
# The driver root is read-only binds of the host's files, one per file and per SONAME (issue 11);
# no whole host library directory is bound any more.
# Issue 12: driver files are hard links in the host tree, not binds.
assert_no_match "$(c nspawn-no-libcuda-bind)" ":/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda\.so\.$DRIVER_VERSION\$" "$nf"
# Issue 12: the SONAME is a link of the host tree, not a bind; the tree is bound read-only.
assert_no_match "$(c nspawn-no-soname-bind)" ":/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda\.so\.1\$" "$nf"
assert_match "$(c nspawn-driver-tree-bind)" "^BindReadOnly=/var/lib/nspawn-lifecycle/driver-root/kube1:/run/nvidia/driver\$" "$nf"
assert_no_match "$(c nspawn-no-whole-libdir-bind)" '^BindReadOnly=(/usr)?/lib/x86_64-linux-gnu(:|$)' "$nf"
assert_no_match "$(c nspawn-no-host-nvidia)" '/run/host-nvidia' "$nf"
assert_match "$(c nspawn-firmware-bind)" "^BindReadOnly=/(usr/)?lib/firmware/nvidia/$DRIVER_VERSION:/run/nvidia/driver/lib/firmware/nvidia/$DRIVER_VERSION\$" "$nf"
assert_no_match "$(c nspawn-no-nvidia-smi-bind)" ':/run/nvidia/driver/usr/bin/nvidia-smi$' "$nf"
assert_eq "$(c driver-tree-nvidia-smi-is-the-host-inode)" "$(H stat -L -c %d:%i /usr/bin/nvidia-smi 2>&1)" \
    "$(H stat -c %d:%i /var/lib/nspawn-lifecycle/driver-root/kube1/usr/bin/nvidia-smi 2>&1)"
assert_no_match "$(c nspawn-no-kvm-when-absent)" '/dev/kvm' "$nf"
assert_no_match "$(c nspawn-no-nonexistent-nodes)" '^Bind=/dev/nvidia[2-9]' "$nf"

# ---- devices in the machine ------------------------------------------------------------------
for d in /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm /dev/dri/renderD128 /dev/dri/card2; do
    assert_eq "$(c "open-${d#/dev/}")" ENXIO "$(open_errno kube1 "$d")"
done

# ---- driver root, links, /dev/char, ldconfig -------------------------------------------------
DR=/run/nvidia/driver
ML=/usr/lib/x86_64-linux-gnu
assert_cmd "$(c driver-root-libcuda)" M test -e "$DR$ML/libcuda.so.$DRIVER_VERSION"
assert_cmd "$(c driver-root-libcuda-soname)" M test -e "$DR$ML/libcuda.so.1"
assert_cmd "$(c driver-root-libnvidia-ml)" M test -e "$DR$ML/libnvidia-ml.so.$DRIVER_VERSION"
assert_cmd "$(c driver-root-vdpau)" M test -e "$DR$ML/vdpau/libvdpau_nvidia.so.$DRIVER_VERSION"
# Issue 12: SONAMEs are links of pre-start's host tree to the file beside them, not binds; no
# link leaves its directory. Files are binds: one mount per file, none per name.
assert_eq "$(c driver-root-links-stay-in-their-directory)" "" "$(M find "$DR" -type l -lname '*/*' 2>&1)"
assert_eq "$(c driver-root-libcuda-soname-link)" "libcuda.so.$DRIVER_VERSION" "$(M readlink "$DR$ML/libcuda.so.1" 2>&1)"
assert_eq "$(c driver-root-libcuda-is-a-file)" "$DR$ML/libcuda.so.$DRIVER_VERSION" "$(M readlink -f "$DR$ML/libcuda.so.1" 2>&1)"
assert_cmd "$(c driver-root-read-only)" M sh -c "! touch $DR/planted 2>/dev/null"
nfiles=$(M find "$DR/usr/lib" -type f | wc -l)
# (awk on this side: systemd-run would expand the program's $5.)
nmounts=$(M cat /proc/self/mountinfo | awk -v dr="$DR" '$5 == dr || index($5, dr "/") == 1' | wc -l)
nsoname=$(M find "$DR" -type l | wc -l)
info "driver root in kube1: $nfiles library files, $nsoname SONAME links, $nmounts mounts"
# One mount per driver-root bind line of the .nspawn file (the tree, firmware, sockets) and
# none per file or SONAME (issue 12): the files are hard links of the host's in pre-start's
# tree, the names links (per-name binds made them files, per-file binds one mount each).
nbinds=$(grep -c ':/run/nvidia/driver' <<< "$nf")
assert_eq "$(c driver-root-one-mount-per-bind-line)" "$nbinds" "$nmounts"
assert_cmd "$(c driver-root-sonames-are-links)" test "$nsoname" -gt 0
assert_cmd "$(c driver-root-files-are-not-mounts)" test "$nmounts" -lt "$nfiles"
lib=usr/lib/x86_64-linux-gnu/libcuda.so.$DRIVER_VERSION
assert_eq "$(c driver-root-libcuda-is-the-host-inode)" "$(H stat -c %d:%i "/$lib" 2>&1)" \
    "$(H stat -c %d:%i "/var/lib/nspawn-lifecycle/driver-root/kube1/$lib" 2>&1)"
assert_cmd "$(c no-host-nvidia-in-machine)" M test ! -e /run/host-nvidia
assert_match "$(c nvidia-smi-on-path)" "Driver Version: $DRIVER_VERSION" "$(M /bin/sh -c 'command -v nvidia-smi && nvidia-smi' 2>&1)"
assert_eq "$(c nvidia-smi-link)" "/run/nvidia/driver/usr/bin/nvidia-smi" "$(M readlink /usr/bin/nvidia-smi 2>&1)"
assert_match "$(c driver-root-nvidia-smi-runs)" "Driver Version: $DRIVER_VERSION" "$(M "$DR/usr/bin/nvidia-smi" 2>&1)"
assert_cmd "$(c driver-root-firmware)" M test -s "$DR/lib/firmware/nvidia/$DRIVER_VERSION/gsp_ga10x.bin"
assert_cmd "$(c machine-libcuda-soname-link)" M test -e "$ML/libcuda.so.1"
assert_match "$(c machine-libcuda-resolves-to-version)" "libcuda\.so\.$DRIVER_VERSION$" "$(M readlink -f "$ML/libcuda.so.1" 2>&1)"
assert_cmd "$(c machine-libcuda-loads)" M /lib64/ld-linux-x86-64.so.2 --list "$ML/libcuda.so.1"
ldp=$(M /sbin/ldconfig -p 2>&1)
assert_match "$(c machine-ldcache-libcuda)" 'libcuda\.so\.1 ' "$ldp"
assert_match "$(c machine-ldcache-libnvidia-ml)" 'libnvidia-ml\.so\.1 ' "$ldp"
uvm=$(H awk '$2=="nvidia-uvm"{print $1}' /proc/devices)
for mm in 195:0 195:1 195:255 "$uvm:0" "$uvm:1"; do
    got=$(M /bin/sh -c "p=/dev/char/$mm; [ -L \$p ] && [ -c \$p ] && stat -L -c '%t %T' \$p" 2>&1)
    want=$(printf '%x %x' "${mm%%:*}" "${mm#*:}")
    assert_eq "$(c "dev-char-$mm")" "$want" "$got"
done
info "/dev/char in kube1: $(M ls -l /dev/char 2>&1 | awk 'NR>1{print $(NF-2), $NF}' | tr '\n' ' ')"

# ---- CDI -------------------------------------------------------------------------------------
check_cdi_spec kube1 2
# The operator's copy: `cdi-spec kube1` prints, byte for byte, the spec post-start wrote there.
assert_eq "$(c cdi-spec-command-is-the-machines)" "$(M cat "$CDI_SPEC" | sha256sum)" \
    "$(H "$HP" cdi-spec kube1 | sha256sum)"
assert_match "$(c cdi-spec-list-names-all)" '^nvidia.com/gpu=all$' "$(H "$HP" cdi-spec kube1 --list)"

# ---- services: containerd with the boot, kubelet gated until post-start, in order ---------------
# The .nspawn file binds the unit gate (src/apply/gate.rs) over both units, and the host's marker
# directory of this machine read-only where the gate looks. pre-start emptied it and released
# containerd (its driver root is built and checked), so the boot starts containerd itself;
# kubelet is skipped at boot until post-start (running while the machine boots) has wired the
# driver, waited for containerd, imported and released it -- each starts once.
assert_eq "$(c containerd-active)" active "$(inner_state containerd.service)"
assert_eq "$(c kubelet-active)" active "$(inner_state kubelet.service)"
assert_match "$(c nspawn-markers-bound)" "^BindReadOnly=/run/nspawn-lifecycle/machines/kube1/released:/run/nspawn-lifecycle/released$" "$nf"
for unit in containerd kubelet; do
    assert_match "$(c "nspawn-gate-$unit")" "^BindReadOnly=/run/nspawn-lifecycle/unit-gate.conf:/run/systemd/system/$unit.service.d/50-nspawn-lifecycle-gate.conf$" "$nf"
    assert_match "$(c "$unit-gated-by-dropin")" "ConditionPathExists=/run/nspawn-lifecycle/released/%n" \
        "$(M systemctl cat "$unit.service" 2>&1)"
    uj=$(M journalctl -b --no-pager -o cat -u "$unit.service" 2>&1)
    info "$unit.service in kube1's journal this boot: $(printf '%s' "$uj" | tr '\n' '|')"
    skipped="unmet condition check \\(ConditionPathExists=/run/nspawn-lifecycle/released/$unit\\.service\\)"
    if [ "$unit" = kubelet ]; then
        assert_match "$(c "$unit-skipped-at-boot")" "$skipped" "$uj"
    else
        assert_no_match "$(c "$unit-not-skipped-at-boot")" "$skipped" "$uj"
    fi
    assert_eq "$(c "$unit-started-once")" 1 "$(printf '%s\n' "$uj" | grep -c '^Started ')"
    assert_cmd "$(c "gate-released-$unit")" M test -f "/run/nspawn-lifecycle/released/$unit.service"
done
assert_match "$(c containerd-released-by-pre-start)" '^nspawn-lifecycle pre-start released containerd.service' \
    "$(H cat /run/nspawn-lifecycle/machines/kube1/released/containerd.service 2>&1)"
assert_match "$(c kubelet-released-by-post-start)" '^nspawn-lifecycle post-start released kubelet.service' \
    "$(H cat /run/nspawn-lifecycle/machines/kube1/released/kubelet.service 2>&1)"
# the machine cannot release a unit itself: its markers are the host's, bound read-only
assert_not_cmd "$(c markers-read-only-in-machine)" M touch /run/nspawn-lifecycle/released/kubelet.service
ts() { H systemctl -M kube1 show -p "$2" --value "$1" 2>/dev/null; }
c_up=$(ts containerd.service ActiveEnterTimestampMonotonic)       # containerd active
k_start=$(ts kubelet.service InactiveExitTimestampMonotonic)      # kubelet began starting
info "machine monotonic usec: containerd active $c_up, kubelet start began $k_start"
assert_le "$(c containerd-started-before-kubelet)" "$c_up" "$k_start"
# the hooks' own order: pre-start releases containerd; post-start stops kubelet (a start job the
# boot queued), waits for containerd, then kubelet's gate (after the imports) and its start
hj=$(hook_journal_this_start kube1 "@$(( t0 / 1000 - 1 ))")
order=$(printf '%s\n' "$hj" | grep -oE 'stopped machine=kube1 unit=[a-z]+|unit gate: released [a-z]+|started machine=kube1 unit=[a-z]+' | sed 's/machine=kube1 unit=//' | tr '\n' ',')
# pre-start's line is read by its SYSLOG_IDENTIFIER: a short-lived process's lines can lose their
# unit and invocation fields in journald (systemd#2913)
assert_eq "$(c hooks-order)" "stopped kubelet,started containerd,unit gate: released kubelet,started kubelet," "${order#unit gate: released containerd,}"
assert_match "$(c pre-start-released-containerd)" 'unit gate: released containerd\.service for the boot ahead' \
    "$(hook_journal_since kube1 "@$(( t0 / 1000 - 1 ))" "$HOOK_IDENT")"
# pre-start's parts run through the one executor: one line per part with its STEP key, in the
# plan's order, each applied or found as it must be (the host nodes it binds, the device cgroup
# under the real root: its host devices and, for gpus "all", the drop-in's NVIDIA groups)
pre_steps=$(hook_journal_since kube1 "@$(( t0 / 1000 - 1 ))" "$HOOK_IDENT" \
    | grep -oE 'step=(host-nodes|device-cgroup|gate-file|driver-tree|gate|nspawn) ' | tr -d ' ' | tr '\n' ,)
# The window opens a second before t0: a start the rig made just before (01 run first after `up`)
# may show too; its last run is this start's.
assert_eq "$(c pre-start-steps-in-plan-order)" "step=host-nodes,step=device-cgroup,step=gate-file,step=driver-tree,step=gate,step=nspawn," \
    "step=host-nodes,${pre_steps##*step=host-nodes,}"

# ---- journald-native fields (issue 16 item 4) ---------------------------------------------------
# stderr of the hooks is the journal: each line is sent natively, MESSAGE= the same line as the
# plain format, the event's fields beside it, so an operator can filter on them.
jfields() { # <journalctl match...>: "MACHINE|STEP|UNIT|US|SYSLOG_IDENTIFIER|MESSAGE" per entry
    H journalctl --no-pager -o json -u "$u" "_SYSTEMD_INVOCATION_ID=$(uprop InvocationID kube1)" "$@" 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    try: e = json.loads(line)
    except ValueError: continue
    def f(k):
        v = e.get(k, "")
        return bytes(v).decode("utf-8", "replace") if isinstance(v, list) else str(v)
    print("|".join(f(k) for k in ("MACHINE", "STEP", "UNIT", "US", "SYSLOG_IDENTIFIER", "MESSAGE")))'
}
cdi_lines=$(jfields STEP=cdi)
info "journalctl -u $u STEP=cdi: $cdi_lines"
assert_eq "$(c journal-step-cdi-one-line)" 1 "$(printf '%s\n' "$cdi_lines" | grep -c .)"
assert_match "$(c journal-step-cdi-fields)" '^kube1\|cdi\|\|[0-9]+\|[^|]*nspawn-lifecycle[^|]*\|' "$cdi_lines"
assert_match "$(c journal-message-is-the-text-line)" '\|[[:space:]]*INFO CDI spec: .* machine=kube1 step=cdi us=[0-9]+$' "$cdi_lines"
for step in driver-root links ldconfig gate gate-kubelet; do
    assert_eq "$(c "journal-step-$step")" "kube1|$step" "$(jfields "STEP=$step" | cut -d'|' -f1,2)"
done
assert_match "$(c journal-unit-field)" '^kube1\|\|containerd\.service\|\|[^|]*\|[[:space:]]*INFO started machine=kube1 unit=containerd\.service$' \
    "$(jfields UNIT=containerd.service MACHINE=kube1)"

# ---- idempotency: pre-start again on the same host rewrites nothing ---------------------------
before=$(snapshot /etc/systemd/nspawn/kube1.nspawn)
sleep 1.1
assert_cmd "$(c pre-start-again)" helper nspawn-lifecycle pre-start kube1
assert_eq "$(c pre-start-again-writes-nothing)" "$before" "$(snapshot /etc/systemd/nspawn/kube1.nspawn)"
scenario_end
