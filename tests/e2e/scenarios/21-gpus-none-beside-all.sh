# shellcheck shell=bash
# Scenario 21 (issue 14): a CPU machine (`"gpus": "none"`) beside a GPU machine (`"all"`) on one
# host. kube2 first starts with every GPU (the default), then becomes a CPU machine: until
# `install`, plan, status and reconcile say pre-start would refuse it; then its drop-in allows no
# NVIDIA group, the restart removes the NVIDIA state the earlier start left, and root in
# it cannot open a GPU even after mknod. Then the driver install is incomplete: kube2 starts,
# kube1 is held back (exit 3, retried) until the driver is complete again.
scenario "gpus none beside gpus all: the CPU machine is never held back" --needs-helper
baseline
CFG=/etc/nspawn-lifecycle/config.json
write_cfg() { printf '%s\n' "$1" | H sh -c "mkdir -p /etc/nspawn-lifecycle && cat > $CFG"; }
cleanup() {
    H rm -f "$CFG"
    stop_unit kube2 >/dev/null 2>&1
    helper install kube2 >/dev/null 2>&1
    restore_libs
}

# ---- kube2 with every GPU first (the default), as an earlier life of the node ----------------
out=$(helper install kube2 2>&1); rc=$?
assert_eq "$(c install-kube2-all)" 0 "$rc"; [ "$rc" = 0 ] || info "install kube2: $out"
start_unit kube2 >/dev/null 2>&1
if wait_machine_up kube2 120; then pass "$(c kube2-up-with-gpus)"; else fail "$(c kube2-up-with-gpus)" "$(uprop ActiveState kube2)"; fi
assert_cmd "$(c kube2-had-a-spec)" M -m kube2 test -f "$CDI_SPEC"

# ---- kube2 becomes a CPU machine ---------------------------------------------------------------
write_cfg '{"machines": {"kube1": {"gpus": "all"}, "kube2": {"gpus": "none"}}}'
# Before `install`: pre-start would refuse the next start (its drop-in allows every GPU), so
# plan, status and reconcile say so, name the fix, and the running machine is left alone.
leader=$(leader_of kube2)
out=$(helper plan kube2 2>&1); rc=$?
assert_eq "$(c plan-before-install-exit-2)" 2 "$rc"
assert_match "$(c plan-says-pre-start-refuses)" 'pre-start would refuse to start kube2: .*was installed for gpus "all".*run `nspawn-lifecycle-helper install kube2`' "$out"
out=$(H "$HP" status kube2 2>&1); rc=$?
assert_eq "$(c status-before-install-broken)" 6 "$rc"
assert_match "$(c status-says-next-start-refused)" 'kube2: broken: pre-start would refuse the next start \(exit 2\): .*install kube2' "$out"
assert_no_match "$(c status-does-not-say-reconcile)" 'run `nspawn-lifecycle-helper reconcile' "$out"
out=$(reconcile kube2 2>&1); rc=$?
assert_eq "$(c reconcile-before-install-exit-2)" 2 "$rc"
assert_match "$(c reconcile-says-nothing-restarted)" 'reconcile would stop kube2 and pre-start would refuse to start it again; nothing was restarted' "$out"
assert_eq "$(c reconcile-refused-machine-untouched)" "$leader" "$(leader_of kube2)"
out=$(helper install kube2 2>&1); rc=$?
assert_eq "$(c install-kube2-none)" 0 "$rc"; [ "$rc" = 0 ] || info "install kube2: $out"
dropin=$(H cat /etc/systemd/system/systemd-nspawn@kube2.service.d/50-nspawn-lifecycle.conf)
assert_no_match "$(c none-dropin-allows-no-nvidia-group)" 'DeviceAllow=char-(nvidia|drm)' "$dropin"
assert_match "$(c all-dropin-unchanged)" 'DeviceAllow=char-nvidia\* rwm' \
    "$(H cat /etc/systemd/system/systemd-nspawn@kube1.service.d/50-nspawn-lifecycle.conf)"
since="@$(date +%s)"
out=$(reconcile kube2 2>&1); rc=$?
assert_eq "$(c reconcile-kube2-none)" 0 "$rc"; [ "$rc" = 0 ] || info "reconcile kube2: $out"
# Without GPUs post-start returns (and with it the start) once the machine's boot is done.
assert_match "$(c none-start-returned-after-the-boot)" '^(running|degraded)$' \
    "$(M -m kube2 systemctl is-system-running 2>/dev/null)"
wait_machine_up kube2 60 || fail "$(c kube2-up-none)" "$(uprop ActiveState kube2)"
assert_match "$(c none-post-start-says-why)" 'no NVIDIA GPUs for this machine \(gpus: none\)' \
    "$(hook_journal_since kube2 "$since")"
f=$(nspawn_file kube2)
assert_no_match "$(c none-nspawn-binds-no-nvidia)" '/dev/nvidia|/dev/dri|/run/nvidia/driver' "$f"
assert_match "$(c none-nspawn-header)" '# Host: no NVIDIA GPUs \(0 of the host' "$f"
assert_not_cmd "$(c none-spec-removed)" M -m kube2 test -e "$CDI_SPEC"
assert_not_cmd "$(c none-driver-root-gone)" M -m kube2 test -e /run/nvidia/driver/usr
allow=$(uprop DeviceAllow kube2)
info "kube2 DeviceAllow: $allow"
assert_no_match "$(c none-cgroup-has-no-nvidia)" 'nvidia|/dev/char/195:|/dev/char/226:' "$allow"
assert_eq "$(c none-mknod-gpu-eperm)" EPERM "$(mknod_open kube2 195 0)"
assert_eq "$(c none-mknod-ctl-eperm)" EPERM "$(mknod_open kube2 195 255)"
assert_eq "$(c all-mknod-gpu-enxio)" ENXIO "$(mknod_open kube1 195 0)"
# a daemon-reload re-reads the drop-ins: still nothing of NVIDIA for kube2
H systemctl daemon-reload
assert_eq "$(c none-after-daemon-reload-eperm)" EPERM "$(mknod_open kube2 195 0)"
assert_eq "$(c all-after-daemon-reload-enxio)" ENXIO "$(mknod_open kube1 195 0)"

# ---- incomplete driver: kube2 starts, kube1 is held back ---------------------------------------
stop_unit kube1 >/dev/null 2>&1; stop_unit kube2 >/dev/null 2>&1
H systemctl reset-failed "$(unit_of kube1)" "$(unit_of kube2)" 2>/dev/null
remove_libs
since="@$(date +%s)"
H systemctl start --no-block "$(unit_of kube1)" "$(unit_of kube2)"
if wait_machine_up kube2 120; then pass "$(c none-starts-with-incomplete-driver)"
else fail "$(c none-starts-with-incomplete-driver)" "$(uprop ActiveState kube2)/$(uprop SubState kube2)"; fi
wait_until 20 nrestarts_ge kube1 2
assert_le "$(c all-held-back-retried)" 2 "$(uprop NRestarts kube1)"
assert_not_cmd "$(c all-not-running)" machine_registered kube1
assert_eq "$(c all-pre-start-exit-3)" 3 "$(exec_field kube1 ExecStartPre 'pre-start' status)"
assert_match "$(c all-message-names-missing)" 'incomplete.*(libcuda|libnvidia-ml)' "$(hook_journal_since kube1 "$since")"
restore_libs
if wait_machine_up kube1 90; then pass "$(c all-recovers-by-itself)"; else fail "$(c all-recovers-by-itself)" "$(uprop ActiveState kube1)"; fi
assert_eq "$(c kube2-still-eperm)" EPERM "$(mknod_open kube2 195 0)"
out=$(H "$HP" status kube2 --json 2>&1); rc=$?
assert_eq "$(c status-kube2-in-sync)" 0 "$rc"
assert_match "$(c status-kube2-shows-assignment)" '"gpus": "none"' "$out"
assert_match "$(c status-kube2-summary-says-none)" 'no NVIDIA GPUs for this machine \(gpus: none\)' "$out"
cleanup
scenario_end
