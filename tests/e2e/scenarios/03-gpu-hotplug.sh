# shellcheck shell=bash
# Scenario 3 (issue 5 §3): hardware changes show up on the next start. A third GPU appears ->
# reconcile -> three GPUs bound and in the CDI spec. All GPUs gone (driver unloaded) -> reconcile ->
# no NVIDIA binds, no NVIDIA CDI spec or driver root left in the machine, services active.
scenario "GPU added, then all GPUs removed" --needs-helper
baseline

# ---- a third GPU -------------------------------------------------------------------------------
fake_gpus 3
out=$(reconcile kube1 2>&1); rc=$?
info "reconcile (3 GPUs): rc=$rc $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_eq "$(c reconcile-3-gpus)" 0 "$rc"
assert_cmd "$(c machine-up-3-gpus)" wait_machine_up kube1 60
nf=$(nspawn_file kube1)
for d in /dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/dri/card3 /dev/dri/renderD130; do
    assert_match "$(c "nspawn-bind-${d#/dev/}")" "^Bind=$d(:$d)?$" "$nf"
done
assert_eq "$(c open-nvidia2)" ENXIO "$(open_errno kube1 /dev/nvidia2)"
assert_eq "$(c open-renderD130)" ENXIO "$(open_errno kube1 /dev/dri/renderD130)"
check_cdi_spec kube1 3

# ---- every GPU gone ----------------------------------------------------------------------------
fake_gpus 0
out=$(reconcile kube1 2>&1); rc=$?
info "reconcile (0 GPUs): rc=$rc $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_eq "$(c reconcile-0-gpus)" 0 "$rc"
assert_cmd "$(c machine-up-0-gpus)" wait_machine_up kube1 60
nf=$(nspawn_file kube1)
info "kube1.nspawn without GPUs:"; printf '%s\n' "$nf" | sed 's/^/    | /'
assert_no_match "$(c nspawn-no-nvidia-binds)" '^Bind(ReadOnly)?=.*(nvidia|/dev/dri)' "$nf"
assert_cmd "$(c no-nvidia-nodes-in-machine)" M /bin/sh -c '! ls /dev/nvidia* /dev/dri 2>/dev/null | grep -q .'
assert_cmd "$(c no-cdi-spec)" M test ! -e "$CDI_SPEC"
assert_cmd "$(c no-nvidia-spec-anywhere)" M /bin/sh -c '! grep -rlsq "nvidia.com/gpu" /etc/cdi /var/run/cdi'
assert_cmd "$(c no-driver-root)" M test ! -e /run/nvidia/driver
assert_cmd "$(c no-dev-char-nvidia-links)" M /bin/sh -c '! ls /dev/char/195:* 2>/dev/null | grep -q .'
stale=$(M find /usr/lib/x86_64-linux-gnu -maxdepth 2 \( -lname '/run/host-nvidia/*' -o -lname '/run/nvidia/*' \) 2>&1)
assert_eq "$(c no-stale-library-links)" "" "$stale"
assert_cmd "$(c no-nvidia-smi-link)" M test ! -e /usr/bin/nvidia-smi
assert_eq "$(c containerd-active-0-gpus)" active "$(inner_state containerd.service)"
assert_eq "$(c kubelet-active-0-gpus)" active "$(inner_state kubelet.service)"

# ---- back to the baseline GPUs -----------------------------------------------------------------
fake_gpus "$E2E_GPUS"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-back-to-$E2E_GPUS)" 0 "$rc"
assert_cmd "$(c machine-up-again)" wait_machine_up kube1 60
assert_cmd "$(c cdi-spec-back)" M test -s "$CDI_SPEC"
scenario_end
