# shellcheck shell=bash
# Scenario 27: nothing one machine writes stops another machine's start, and a configuration
# error leaves the unit failed instead of restarting it forever. kube1 (every GPU: the NVIDIA
# capability and IMEX channel directories are bound into it whole and writable) leaves junk
# there, as root in a machine or a pod with a hostPath can: a stray file, a name with a newline,
# hundreds of files. kube2's restart still works and binds none of it. Then a configuration
# pre-start refuses (exit 2): systemd ignores RestartPreventExitStatus= for ExecStartPre=, so
# pre-start stops its own unit, which stays failed (no auto-restart) with the message in its
# journal; fixed, the next start works.
scenario "one machine's junk never stops another's start; a config error fails the unit once" --needs-helper
baseline
CFG=/etc/nspawn-lifecycle/config.json
cleanup() {
    H rm -f "$CFG"
    H sh -c 'find /dev/nvidia-caps /dev/nvidia-caps-imex-channels -maxdepth 1 -type f -delete' 2>/dev/null
    stop_unit kube2 >/dev/null 2>&1
}

out=$(helper install kube2 2>&1); rc=$?
assert_eq "$(c install-kube2)" 0 "$rc"; [ "$rc" = 0 ] || info "install kube2: $out"
start_unit kube2 >/dev/null 2>&1
if wait_machine_up kube2 120; then pass "$(c kube2-up)"; else fail "$(c kube2-up)" "$(uprop ActiveState kube2)"; fi

# ---- kube1 leaves junk in the directories bound into it -------------------------------------
out=$(M -m kube1 sh -c 'echo x > /dev/nvidia-caps/stray &&
    : > "/dev/nvidia-caps/nvidia-cap9
PrivateUsers=pick" &&
    i=0; while [ $i -lt 300 ]; do : > /dev/nvidia-caps-imex-channels/channel$((1000 + i)); i=$((i + 1)); done &&
    echo written' 2>&1)
assert_eq "$(c junk-written-from-kube1)" written "$out"
assert_cmd "$(c junk-is-in-the-host)" H test -f /dev/nvidia-caps/stray
assert_eq "$(c junk-count-in-the-host)" 300 "$(H sh -c 'find /dev/nvidia-caps-imex-channels -maxdepth 1 -type f | wc -l')"

since="@$(date +%s)"
out=$(reconcile kube2 2>&1); rc=$?
assert_eq "$(c kube2-restart-exit-0)" 0 "$rc"; [ "$rc" = 0 ] || info "reconcile kube2: $out"
if wait_machine_up kube2 120; then pass "$(c kube2-up-after-junk)"; else fail "$(c kube2-up-after-junk)" "$(uprop ActiveState kube2)"; fi
j=$(hook_journal_since kube2 "$since")
assert_match "$(c pre-start-says-what-it-skipped)" '/dev/nvidia-caps: skipping 2 entries' "$j"
assert_match "$(c pre-start-skipped-the-channels)" '/dev/nvidia-caps-imex-channels: skipping 300 entries' "$j"
assert_no_match "$(c nothing-injected)" 'pick|stray' "$(nspawn_file kube2)"
H sh -c 'find /dev/nvidia-caps /dev/nvidia-caps-imex-channels -maxdepth 1 -type f -delete'

# ---- a configuration error: failed once, not restarted every 5 s ----------------------------
H sh -c "mkdir -p ${CFG%/*} && echo '{\"defaults\": {\"lockTimeoutSeconds\": 0}}' > $CFG"
stop_unit kube2 >/dev/null 2>&1
since="@$(date +%s)"
H systemctl reset-failed "$(unit_of kube2)" 2>/dev/null
H timeout 60 systemctl start "$(unit_of kube2)" >/dev/null 2>&1; rc=$?
assert_ne "$(c bad-config-start-fails)" 0 "$rc"
sleep 12   # more than two RestartSec=5 periods: a restart loop would have started it again
assert_eq "$(c unit-failed)" failed "$(uprop ActiveState kube2)"
assert_eq "$(c no-auto-restart)" 0 "$(uprop NRestarts kube2)"
assert_eq "$(c pre-start-exit-2)" 2 "$(exec_field kube2 ExecStartPre 'pre-start' status)"
j=$(hook_journal_since kube2 "$since")
assert_match "$(c journal-names-the-key)" 'defaults.lockTimeoutSeconds: must be at least 1' "$j"
assert_match "$(c journal-says-no-retry)" 'no retry can mend this' "$j"
assert_not_cmd "$(c kube2-not-running)" machine_registered kube2
H rm -f "$CFG"
start_unit kube2 >/dev/null 2>&1
if wait_machine_up kube2 120; then pass "$(c starts-once-fixed)"; else fail "$(c starts-once-fixed)" "$(uprop ActiveState kube2)"; fi
cleanup
scenario_end
