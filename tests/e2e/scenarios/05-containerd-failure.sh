# shellcheck shell=bash
# Scenario 5 (issue 5 §5): containerd in the machine made to fail -> post-start fails (it cannot
# start containerd), the unit fails and systemd restarts it; once containerd is fixed the node
# recovers without help.
scenario "containerd fails: post-start fails, unit restarts, recovers" --needs-helper
baseline

since="@$(date +%s)"
mflag_set kube1 fail-containerd
out=$(reconcile kube1 2>&1); rc=$?
info "reconcile with containerd failing: rc=$rc $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_ne "$(c reconcile-fails)" 0 "$rc"
n0=$(uprop NRestarts kube1)
wait_until 40 nrestarts_ge kube1 $((n0 + 1))
assert_le "$(c unit-restarted)" "$((n0 + 1))" "$(uprop NRestarts kube1)"
post=$(exec_field kube1 ExecStartPost 'post-start' status)
info "post-start exit status while containerd fails: ${post:-<not run>}; unit $(uprop ActiveState kube1)/$(uprop SubState kube1)"
j=$(unit_journal_since kube1 "$since")
assert_match "$(c post-start-failed)" 'Control process exited|Failed with result' "$j"
hj=$(hook_journal_since kube1 "$since")
info "post-start said: $(printf '%s\n' "$hj" | grep -i containerd | head -3 | tr '\n' ' ')"
assert_match "$(c error-names-containerd)" 'containerd' "$hj"

mflag_clear kube1 fail-containerd
t0=$(now_ms)
if wait_machine_up kube1 120; then
    pass "$(c recovers-by-itself)"; info "recovered $(( $(now_ms) - t0 )) ms after containerd was fixed"
else
    fail "$(c recovers-by-itself)" "unit $(uprop ActiveState kube1)/$(uprop SubState kube1), containerd $(inner_state containerd.service), kubelet $(inner_state kubelet.service)"
fi
assert_eq "$(c post-start-ok-after-recovery)" 0 "$(exec_field kube1 ExecStartPost 'post-start' status)"
assert_cmd "$(c cdi-spec-after-recovery)" M test -s "$CDI_SPEC"
