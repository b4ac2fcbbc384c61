# shellcheck shell=bash
# Scenario 8 (issue 7, "Crash at any step"): post-start killed with SIGKILL at every one of its
# named points under a real systemd, then rerun; the node must end fully healthy each time.
#
# Needs the failpoints build (HELPER_FAILPOINTS, bind-mounted at $HP_FAILPOINTS); for this
# scenario it is mounted over the stable path $HP, so the hooks systemd runs are that build.
# A point is armed with a drop-in `Environment=NSPAWN_LIFECYCLE_FAILPOINT=<point>`
# (90-e2e-failpoint.conf) and disarmed by removing it, each time with a daemon-reload.
#
# A. under systemd: arm, restart the unit, see post-start die at the point and the start fail,
#    disarm before RestartSec= runs out; Restart=on-failure restarts the machine by itself.
# B. in place on the running machine (no reboot, so /run keeps whatever the kill left): a
#    library link, the nvidia-smi link and the CDI spec are made to drift so every step has work
#    (the driver root is nspawn's read-only binds, which post-start only checks),
#    `post-start` runs by hand with the point armed in its environment, then again without.
# C. install killed after rewriting the drop-in and before daemon-reload: the rerun has nothing
#    to write and must still reload (NeedDaemonReload).
# Healthy means: unit active, containerd and kubelet active, the driver root and the library and
# /dev/char links exactly as a clean start left them, exactly one NVIDIA CDI spec, byte-identical
# to the clean one and valid JSON, no temp file or staging tree in the machine or on the host,
# and every staged tarball still there (imported and kept, or set aside in failed/).
scenario "crash at every post-start point: the node heals" --needs-helper
if [ -z "${HELPER_FAILPOINTS:-}" ]; then
    if [ "${E2E_REQUIRE_FAILPOINTS:-0}" = 1 ]; then
        fail "$SC_NAME" "HELPER_FAILPOINTS is not set, but E2E_REQUIRE_FAILPOINTS=1"
    else
        echo "SKIP $SC_NAME: needs the failpoints build (set HELPER_FAILPOINTS=...)"
        _record SKIP "$SC_NAME: needs the failpoints build (set HELPER_FAILPOINTS=...)"
    fi
    exit 0
fi
baseline

UNIT=$(unit_of kube1)
DDIR=/etc/systemd/system/$UNIT.d
ARMED=$DDIR/90-e2e-failpoint.conf
STAGED=/var/lib/nspawn-lifecycle/images
IMG=docker.io/library/e2e-hello:1
r=$(mroot kube1)
good_sha=$(sha256sum < "$RUN/support/images/e2e-hello.tar" | cut -d' ' -f1)
bad_sha=$(sha256sum < "$RUN/support/images/e2e-corrupt.tar" | cut -d' ' -f1)

arm()    { H sh -c "printf '[Service]\nEnvironment=NSPAWN_LIFECYCLE_FAILPOINT=%s\n' '$1' > '$ARMED'" && H systemctl daemon-reload; }
disarm() { H rm -f "$ARMED"; H systemctl daemon-reload; }
cleanup() {
    disarm
    default_order
    H umount "$HP" 2>/dev/null
}
trap cleanup EXIT

# ---- the state a clean start leaves ----------------------------------------------------------
driver_listing() { M sh -c 'cd /run/nvidia/driver && find . -printf "%p %y %m %l\n" | sort'; }
links_listing()  { M sh -c 'find /usr/lib/x86_64-linux-gnu /dev/char -type l -printf "%p -> %l\n" | sort'; }
spec_sha()       { M cat "$CDI_SPEC" 2>/dev/null | sha256sum | cut -d' ' -f1; }
nvidia_specs()   { M sh -c 'grep -ls "nvidia.com/gpu" /etc/cdi/* /run/cdi/* 2>/dev/null' | tr '\n' ' ' | sed 's/ $//'; }
leftovers() {
    M sh -c 'find /run/nvidia /run/nspawn-lifecycle /etc/cdi /run/cdi /usr/lib/x86_64-linux-gnu /dev/char -maxdepth 4 \( -name "*.tmp" -o -name ".driver.new" \) 2>/dev/null'
    H sh -c "find /etc/systemd/nspawn '$DDIR' /usr/local/lib/nspawn-lifecycle /run/nspawn-lifecycle/machines -name '*.tmp' 2>/dev/null"
}
count_sha() { find "$r$STAGED" -type f -exec sha256sum {} + 2>/dev/null | awk -v s="$1" '$1==s' | wc -l; }
stage_images() { mkdir -p "$r$STAGED"; cp "$RUN/support/images/e2e-hello.tar" "$RUN/support/images/e2e-corrupt.tar" "$r$STAGED/"; }
assert_same() { # assert_same <name> <expected> <actual>: with a short diff on failure
    if [ "$2" = "$3" ]; then pass "$1"; else fail "$1" "$(diff <(printf '%s\n' "$2") <(printf '%s\n' "$3") | head -12)"; fi
}

stage_images
out=$(reconcile kube1 2>&1) || info "reconcile before taking the reference: $out"
wait_machine_up kube1 120
ref_driver=$(driver_listing)
ref_links=$(links_listing)
ref_spec=$(spec_sha)
assert_match "$(c reference-driver-root)" 'usr/lib/x86_64-linux-gnu/libcuda\.so' "$ref_driver"
assert_match "$(c reference-links)" 'libcuda\.so\.1 -> ' "$ref_links"
assert_eq "$(c reference-one-spec)" /run/cdi/nvidia.com-gpu.json "$(nvidia_specs)"

# healthy <tag> <bad tarballs expected> : the full healthy state after a rerun
healthy() {
    local t=$1 nbad=$2 left specs
    if wait_machine_up kube1 120; then pass "$(c "$t.up")"
    else fail "$(c "$t.up")" "unit $(uprop ActiveState kube1)/$(uprop SubState kube1), containerd $(inner_state containerd.service), kubelet $(inner_state kubelet.service)"; fi
    assert_eq "$(c "$t.containerd-active")" active "$(inner_state containerd.service)"
    assert_eq "$(c "$t.kubelet-active")" active "$(inner_state kubelet.service)"
    assert_same "$(c "$t.driver-root-complete")" "$ref_driver" "$(driver_listing)"
    assert_same "$(c "$t.links-complete")" "$ref_links" "$(links_listing)"
    specs=$(nvidia_specs)
    assert_eq "$(c "$t.exactly-one-cdi-spec")" /run/cdi/nvidia.com-gpu.json "$specs"
    assert_eq "$(c "$t.cdi-spec-as-clean-start")" "$ref_spec" "$(spec_sha)"
    assert_eq "$(c "$t.cdi-spec-valid-json")" ok "$(M cat "$CDI_SPEC" | python3 -c 'import json, sys
d = json.load(sys.stdin)
print("ok" if d["kind"] == "nvidia.com/gpu" and d["devices"] else "bad")' 2>&1)"
    left=$(leftovers)
    assert_eq "$(c "$t.no-temp-or-staging-left")" "" "$left"
    assert_eq "$(c "$t.valid-tarball-kept")" 1 "$(count_sha "$good_sha")"
    assert_eq "$(c "$t.no-corrupt-tarball-lost")" "$nbad" "$(count_sha "$bad_sha")"
    assert_cmd "$(c "$t.corrupt-tarball-set-aside")" test ! -e "$r$STAGED/e2e-corrupt.tar"
    assert_match "$(c "$t.valid-image-imported")" "^$IMG$" "$(M ctr -n k8s.io images ls -q 2>&1)"
}

# From here on the hooks are the failpoints build (same code, plus the points).
H mount --bind "$HP_FAILPOINTS" "$HP" || { fail "$(c mount-failpoints-build)" "cannot bind $HP_FAILPOINTS over $HP"; exit 0; }
POINTS=$("$HELPER_FAILPOINTS" failpoints | grep '^post-start-')
info "post-start points: $(echo $POINTS)"
assert_le "$(c post-start-points-listed)" 10 "$(echo "$POINTS" | wc -l)"
# killed in A and B below like every other; tests/crash.rs cannot reach it (no machine bus there)
assert_cmd "$(c post-start-after-bus-listed)" grep -qx post-start-after-bus <<< "$POINTS"

# ---- A: killed under systemd, restarted by Restart=on-failure -----------------------------------
for p in $POINTS; do
    t=${p#post-start-}
    if [ "$p" = post-start-after-driver-root-swap ]; then
        info "$p: not reached on a fresh boot (nothing to swap with); killed in place in part B"
        continue
    fi
    stage_images
    nbad=$(count_sha "$bad_sha")
    # the gated order's own points (GATED_ONLY_POINTS, lib/scenario.sh): a boot pre-start
    # released containerd for never reaches them
    case " $GATED_ONLY_POINTS " in *" $p "*) gated_order;; *) default_order;; esac
    arm "$p"
    since="@$(date +%s)"
    t0=$(now_ms)
    H systemctl reset-failed "$UNIT" 2>/dev/null
    out=$(H timeout 180 systemctl restart "$UNIT" 2>&1); rc=$?
    disarm
    default_order
    assert_ne "$(c "$t.start-failed")" 0 "$rc"
    healthy "$t" "$nbad"
    # a manual restart sets NRestarts to 0; systemd's own restart after the failure counts 1
    info "$p: healed $(( $(now_ms) - t0 )) ms after the restart began; NRestarts $(uprop NRestarts kube1)"
    assert_le "$(c "$t.restarted-by-systemd")" 1 "$(uprop NRestarts kube1)"
    assert_match "$(c "$t.killed-at-the-point")" "failpoint $p: SIGKILL" "$(hook_journal_since kube1 "$since" "$HOOK_IDENT")"
    assert_match "$(c "$t.systemd-saw-the-kill")" 'code=killed, status=9/KILL' "$(unit_journal_since kube1 "$since")"
done

# ---- B: killed in place, post-start run again by hand -------------------------------------------
drift() { # every file step has work, the unit gate's markers (the host's) included
    M sh -c "printf ' ' >> '$CDI_SPEC'; rm -f /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/bin/nvidia-smi"
    H sh -c 'rm -f /run/nspawn-lifecycle/machines/kube1/released/*'
}
for p in $POINTS; do
    t=inplace-${p#post-start-}
    # Two post-starts every few seconds start containerd and kubelet faster than the machine's
    # default start limit (5 in 10 s) allows: post-start clears the limit before each start
    # (ResetFailedUnit), so nothing is reset here.
    stage_images
    nbad=$(count_sha "$bad_sha")
    drift
    out=$(H env NSPAWN_LIFECYCLE_FAILPOINT="$p" "$HP" nspawn-lifecycle post-start kube1 2>&1); rc=$?
    assert_eq "$(c "$t.killed")" 137 "$rc"
    assert_match "$(c "$t.killed-at-the-point")" "failpoint $p: SIGKILL" "$out"
    out=$(H "$HP" nspawn-lifecycle post-start kube1 2>&1); rc=$?
    assert_eq "$(c "$t.rerun-succeeds")" 0 "$rc"
    [ $rc = 0 ] || info "$p rerun: $(printf '%s' "$out" | tail -5)"
    healthy "$t" "$nbad"
done

# ---- C: install killed between the drop-in and daemon-reload -------------------------------------
DROPIN=$DDIR/50-nspawn-lifecycle.conf
H sh -c "printf '# e2e: drift\n' >> '$DROPIN'" && H systemctl daemon-reload
assert_eq "$(c install.loaded-before)" no "$(uprop NeedDaemonReload kube1)"
out=$(H env NSPAWN_LIFECYCLE_FAILPOINT=install-before-daemon-reload "$HP" install kube1 2>&1); rc=$?
assert_eq "$(c install.killed-before-daemon-reload)" 137 "$rc"
assert_match "$(c install.killed-at-the-point)" 'failpoint install-before-daemon-reload: SIGKILL' "$out"
assert_no_match "$(c install.dropin-rewritten)" 'e2e: drift' "$(H cat "$DROPIN")"
assert_eq "$(c install.reload-owed)" yes "$(uprop NeedDaemonReload kube1)"
out=$(H "$HP" install kube1 2>&1); rc=$?
assert_eq "$(c install.rerun-succeeds)" 0 "$rc"
assert_match "$(c install.rerun-reloads)" 'systemd: reloaded' "$out"
assert_eq "$(c install.reload-done)" no "$(uprop NeedDaemonReload kube1)"
out=$(H "$HP" install kube1 2>&1)
assert_match "$(c install.third-run-nothing-to-do)" 'not reloaded \(no unit file changed\)' "$out"

# ---- back to the product build; a last clean start, fully checked --------------------------------
trap - EXIT
cleanup
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c final-reconcile)" 0 "$rc"
assert_cmd "$(c final-machine-up)" wait_machine_up kube1 120
check_cdi_spec kube1 "$E2E_GPUS"
rm -rf "${r:?}$STAGED/"*
scenario_end
