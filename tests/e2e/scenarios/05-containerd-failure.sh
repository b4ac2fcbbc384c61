# shellcheck shell=bash
# Scenario 5 (issue 5 §5): containerd in the machine made to fail -> post-start fails (it cannot
# start containerd), the unit fails and systemd restarts it; once containerd is fixed the node
# recovers without help.
# Issue 10 item 5: a failed post-start puts back only what ran before it. Run by hand on the
# running machine with kubelet stopped by the operator, it tries containerd again and leaves
# kubelet stopped; on a gated boot nothing ran, so it starts nothing and says why.
scenario "containerd fails: post-start fails, unit restarts, recovers" --needs-helper
baseline

M systemctl stop kubelet.service
mflag_set kube1 fail-containerd
out=$(helper nspawn-lifecycle post-start kube1 2>&1); rc=$?
info "post-start by hand with containerd failing and kubelet stopped: rc=$rc $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_ne "$(c by-hand-post-start-fails)" 0 "$rc"
assert_match "$(c by-hand-tries-containerd-again)" '(could not start again|started again).*unit=containerd\.service' "$out"
assert_no_match "$(c by-hand-does-not-start-kubelet)" 'started again.*unit=kubelet\.service' "$out"
assert_eq "$(c kubelet-left-stopped)" inactive "$(inner_state kubelet.service)"

since="@$(date +%s)"
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
# by SYSLOG_IDENTIFIER: the last line before post-start exits can lose its unit field (systemd#2913)
hj=$(hook_journal_since kube1 "$since" "$HOOK_IDENT")
info "post-start said: $(printf '%s\n' "$hj" | grep -i containerd | head -3 | tr '\n' ' ')"
assert_match "$(c error-names-containerd)" 'containerd' "$hj"
assert_match "$(c gated-boot-restores-nothing)" 'neither containerd\.service nor kubelet\.service was running before it' "$hj"
assert_no_match "$(c gated-boot-starts-nothing-again)" 'started again after the failure' "$hj"

mflag_clear kube1 fail-containerd
t0=$(now_ms)
if wait_machine_up kube1 120; then
    pass "$(c recovers-by-itself)"; info "recovered $(( $(now_ms) - t0 )) ms after containerd was fixed"
else
    fail "$(c recovers-by-itself)" "unit $(uprop ActiveState kube1)/$(uprop SubState kube1), containerd $(inner_state containerd.service), kubelet $(inner_state kubelet.service)"
fi
assert_eq "$(c post-start-ok-after-recovery)" 0 "$(exec_field kube1 ExecStartPost 'post-start' status)"
assert_cmd "$(c cdi-spec-after-recovery)" M test -s "$CDI_SPEC"
scenario_end
