# shellcheck shell=bash
# Scenario 6 (issue 5 §6, issue 4): `install` on a RUNNING machine that an older agent set up
# (override.conf with per-device DeviceAllow=, the SYSTEMD_NSPAWN_* lines, machinectl terminate,
# Restart=; a .nspawn with BindReadOnly=<dir>:/run/host-nvidia/<n>). Install must not touch the
# running machine (leader PID, InvocationID, inner services unchanged), leave our settings in
# effect exactly once, keep what it does not recognise, and a second install changes nothing.
# Then reconcile reruns both hooks under the new layout.
scenario "install over the older override.conf layout on a running machine" --needs-helper
baseline

u=$(unit_of kube1)
d=/etc/systemd/system/$u.d
# ---- the older layout, running ------------------------------------------------------------------
H sh -c "rm -f $d/*.conf"
H tee "$d/override.conf" >/dev/null <<'EOF'
[Unit]
StartLimitIntervalSec=0
[Service]
Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1
Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network
Environment=E2E_OPERATOR_SETTING=keep-me
ExecStartPre=-/usr/bin/machinectl terminate kube1
Restart=on-failure
DeviceAllow=/dev/nvidia0 rwm
DeviceAllow=/dev/nvidia1 rwm
DeviceAllow=/dev/nvidiactl rwm
DeviceAllow=/dev/nvidia-uvm rwm
DeviceAllow=/dev/nvidia-uvm-tools rwm
EOF
H tee /etc/systemd/nspawn/kube1.nspawn >/dev/null <<'EOF'
[Exec]
Capability=all
PrivateUsers=no
SystemCallFilter=@keyring bpf perf_event_open
[Network]
VirtualEthernet=no
[Files]
BindReadOnly=/lib/modules
Bind=/dev/nvidia0
Bind=/dev/nvidia1
Bind=/dev/nvidiactl
Bind=/dev/nvidia-uvm
Bind=/dev/nvidia-uvm-tools
BindReadOnly=/usr/lib/x86_64-linux-gnu:/run/host-nvidia/0
EOF
H systemctl daemon-reload
H systemctl reset-failed "$u" 2>/dev/null
if H timeout 120 systemctl restart "$u" && wait_machine_up kube1 60; then pass "$(c old-layout-running)"
else fail "$(c old-layout-running)" "$(H systemctl status "$u" --no-pager -l 2>&1 | tail -10)"; fi
assert_eq "$(c old-layout-has-no-hooks)" 0 "$(exec_count kube1 ExecStartPre 'nspawn-lifecycle')"

state() { # what must not change: unit invocation, leader, inner services' PIDs
    echo "inv=$(uprop InvocationID kube1) leader=$(leader_of kube1) active=$(uprop ActiveState kube1)" \
         "kubelet=$(H systemctl -M kube1 show -p MainPID --value kubelet.service)" \
         "containerd=$(H systemctl -M kube1 show -p MainPID --value containerd.service)"
}
s0=$(state)
info "before install: $s0"

# ---- install ------------------------------------------------------------------------------------
out=$(helper install kube1 2>&1); rc=$?
info "install output:"; printf '%s\n' "$out" | sed 's/^/    | /' | head -30
assert_eq "$(c install-exit-0)" 0 "$rc"
assert_eq "$(c running-machine-untouched)" "$s0" "$(state)"
assert_eq "$(c no-daemon-reload-needed)" no "$(uprop NeedDaemonReload kube1)"
assert_eq "$(c pre-start-hook-once)" 1 "$(exec_count kube1 ExecStartPre 'nspawn-lifecycle pre-start kube1')"
assert_eq "$(c post-start-hook-once)" 1 "$(exec_count kube1 ExecStartPost 'nspawn-lifecycle post-start kube1')"
assert_eq "$(c terminate-once)" 1 "$(exec_count kube1 ExecStartPre 'machinectl terminate kube1')"
env_=$(uprop Environment kube1)
assert_eq "$(c env-unified-once)" 1 "$(printf '%s\n' $env_ | grep -c '^SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=')"
assert_eq "$(c env-api-vfs-once)" 1 "$(printf '%s\n' $env_ | grep -c '^SYSTEMD_NSPAWN_API_VFS_WRITABLE=')"
assert_match "$(c unrecognised-setting-kept)" 'E2E_OPERATOR_SETTING=keep-me' "$env_"
assert_match "$(c unrecognised-setting-reported)" 'E2E_OPERATOR_SETTING' "$out"
da=$(uprop DeviceAllow kube1)
info "DeviceAllow after install: $da"
assert_match "$(c deviceallow-char-nvidia)" 'char-nvidia\* rwm' "$da"
assert_match "$(c deviceallow-char-drm)" 'char-drm rwm' "$da"
assert_eq "$(c restart-on-failure)" on-failure "$(uprop Restart kube1)"
assert_eq "$(c start-limit-off)" 0 "$(uprop StartLimitIntervalUSec kube1)"
nf=$(nspawn_file kube1)
assert_no_match "$(c nspawn-old-style-binds-gone)" ':/run/host-nvidia/[0-9]+$' "$nf"
# Issue 12: the host driver tree bound at the driver root; its driver files are hard links of
# the host's, so no bind per driver file.
assert_match "$(c nspawn-new-style-driver-root)" "^BindReadOnly=/var/lib/nspawn-lifecycle/driver-root/kube1:/run/nvidia/driver$" "$nf"
assert_no_match "$(c nspawn-no-bind-per-driver-file)" ":/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda\.so\.$DRIVER_VERSION$" "$nf"

# ---- a second install writes nothing --------------------------------------------------------------
files=$(H sh -c "ls -d $d/* /etc/systemd/nspawn/kube1.nspawn $HP" | tr '\n' ' ')
before=$(snapshot $files)
sleep 1.1
out=$(helper install kube1 2>&1); rc=$?
info "second install: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_eq "$(c second-install-exit-0)" 0 "$rc"
assert_eq "$(c second-install-writes-nothing)" "$before" "$(snapshot $files)"
assert_eq "$(c second-install-machine-untouched)" "$s0" "$(state)"

# ---- reconcile reruns both hooks under the new layout -------------------------------------------
pre0=$(exec_field kube1 ExecStartPre 'pre-start' pid); post0=$(exec_field kube1 ExecStartPost 'post-start' pid)
inv0=$(uprop InvocationID kube1)
t0=$(now_ms)
out=$(reconcile kube1 2>&1); rc=$?
info "reconcile: rc=$rc in $(( $(now_ms) - t0 )) ms: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_eq "$(c reconcile-exit-0)" 0 "$rc"
assert_ne "$(c reconcile-new-invocation)" "$inv0" "$(uprop InvocationID kube1)"
assert_match "$(c reconcile-ran-pre-start)" '^[0-9]+$' "$(exec_field kube1 ExecStartPre 'pre-start' pid)"
assert_ne "$(c reconcile-pre-start-new-run)" "$pre0" "$(exec_field kube1 ExecStartPre 'pre-start' pid)"
assert_ne "$(c reconcile-post-start-new-run)" "$post0" "$(exec_field kube1 ExecStartPost 'post-start' pid)"
assert_eq "$(c reconcile-hooks-ok)" "0 0" "$(exec_field kube1 ExecStartPre 'pre-start' status) $(exec_field kube1 ExecStartPost 'post-start' status)"
assert_cmd "$(c machine-up-after-reconcile)" wait_machine_up kube1 60
scenario_end
