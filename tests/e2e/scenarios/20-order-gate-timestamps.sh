# shellcheck shell=bash
# Scenario 20 (issue 12, "the order of post-start"): post-start runs while the machine boots
# (NotifyReady=no), and the unit gate holds each service until its own precondition. pre-start
# releases containerd for the boot ahead once the driver tree the .nspawn file binds is checked
# complete (containerdAtBoot, the default), so the boot starts containerd; kubelet waits for all
# of post-start. The driver root a service sees is that tree, bound read-only: nothing but
# pre-start (before the start, under the machine's lock) changes it, so post-start's own check of
# it later in the same start (which fails the start otherwise) holds for the moment containerd
# began too. Proven from timestamps, over 20 restarts and with a crash point at each step of the
# order (pre-start's marker write included; the two points only the gated order has, with
# containerdAtBoot false):
# - the new order: post-start (ExecStartPost=) begins before the machine's systemd finished its
#   boot (its manager's FinishTimestamp; 0 = not yet finished when read);
# - containerd and kubelet each begin starting (InactiveExitTimestamp, realtime µs, in the
#   machine's systemd) only after their own gate marker exists (the marker's ctime: the rename
#   that makes it appear, /run/nspawn-lifecycle/released/<unit> in the machine's /run), and each
#   starts once per boot (one "Started" line in the machine's journal this boot);
# - the hooks' own log, in stream order: pre-start's release of containerd (saying the tree is
#   checked complete), then post-start's driver root check, links, ldconfig and CDI steps, the
#   wait for containerd, the imports, kubelet's marker (gated order: the file steps before
#   containerd's marker, which post-start then makes);
# - killed at each post-start point under systemd (failpoints build): in the killed boot (read
#   back from the machine's persistent journal once Restart=on-failure brought it up again),
#   containerd started at most once (never, in the gated order, unless the kill came after its
#   marker), kubelet never started at all (every point is before post-start's start of kubelet);
#   a pre-start killed at its marker write boots nothing; the healed boot holds all of the above.
scenario "post-start overlaps the boot; each service waits for its own gate marker" --needs-helper
baseline

UNIT=$(unit_of kube1)
DDIR=/etc/systemd/system/$UNIT.d
ARMED=$DDIR/90-e2e-failpoint.conf
STAGED=/var/lib/nspawn-lifecycle/images
r=$(mroot kube1)
RESTARTS=${E2E_ORDER_RESTARTS:-20}
mkdir -p "$r$STAGED"
cp "$RUN/support/images/e2e-hello.tar" "$r$STAGED/"

# facts: one line of the timestamps of this start, all realtime µs (one H call; python parses)
facts() {
    # shellcheck disable=SC2016  # expanded by the shell in the host container
    H sh -c '
        l=$(machinectl show kube1 -p Leader --value)
        for u in containerd.service kubelet.service; do
            printf "marker:%s " "$u"; stat -c %.6Z "/proc/$l/root/run/nspawn-lifecycle/released/$u" 2>/dev/null || echo none
        done
        for u in containerd_2eservice kubelet_2eservice; do
            printf "start:%s " "$u"; busctl -M kube1 --json=short get-property org.freedesktop.systemd1 \
                /org/freedesktop/systemd1/unit/$u org.freedesktop.systemd1.Unit InactiveExitTimestamp
        done
        printf "finish "; busctl -M kube1 --json=short get-property org.freedesktop.systemd1 \
            /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager FinishTimestamp
        p=$(busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager GetUnit s "$1" | cut -d" " -f2 | tr -d "\"")
        printf "post "; busctl --json=short get-property org.freedesktop.systemd1 "$p" org.freedesktop.systemd1.Service ExecStartPost
        printf "boot "; cat /proc/$l/root/proc/sys/kernel/random/boot_id 2>/dev/null || echo none
    ' sh "$UNIT" | python3 -c '
import json, sys
f = {}
for line in sys.stdin:
    k, _, v = line.strip().partition(" ")
    if not v: continue
    if k.startswith("marker:"):
        f[k] = "none" if v == "none" else str(int(round(float(v) * 1e6)))
    elif k == "boot":
        f[k] = v
    else:
        d = json.loads(v)["data"]
        f[k] = str(d[-1][3]) if k == "post" and d else ("0" if k == "post" else str(d))
print(" ".join("%s=%s" % kv for kv in sorted(f.items())))'
}
fact() { sed -n "s/.*\<$1=\([^ ]*\).*/\1/p" <<< "$2"; }

# order_violations <facts> <hook journal of this start> <hook lines since the restart, by
# SYSLOG_IDENTIFIER>: one word per broken rule (empty: none). pre-start's lines are read from the
# third: a short-lived process's lines can lose their unit (and invocation) fields in journald
# (systemd#2913), the identifier never does.
order_violations() {
    local f=$1 hj=$2 v="" cm km cs ks fin post n
    cm=$(fact marker:containerd.service "$f"); km=$(fact marker:kubelet.service "$f")
    cs=$(fact start:containerd_2eservice "$f"); ks=$(fact start:kubelet_2eservice "$f")
    fin=$(fact finish "$f"); post=$(fact post "$f")
    [[ $cm =~ ^[0-9]+$ && $cs =~ ^[0-9]+$ && $cs -gt $cm ]] || v+=" containerd-before-its-marker($cs<=$cm)"
    [[ $km =~ ^[0-9]+$ && $ks =~ ^[0-9]+$ && $ks -gt $km ]] || v+=" kubelet-before-its-marker($ks<=$km)"
    [[ $post =~ ^[0-9]+$ && $post -gt 0 && ( $fin = 0 || $post -lt $fin ) ]] || v+=" post-start-after-boot($post>=$fin)"
    # post-start's own lines, in stream order
    n=$(printf '%s\n' "$hj" | grep -oE 'driver root: [0-9]+ binds|step=links|step=ldconfig|step=cdi|unit gate: released [a-z]+|imported|started machine=kube1 unit=[a-z]+' \
        | sed -E 's/driver root: [0-9]+ binds/root/; s/unit gate: released containerd/gate-c/; s/unit gate: released kubelet/gate-k/; s/started machine=kube1 unit=//' | uniq | tr '\n' ',')
    # containerd released by pre-start (the default: post-start says it found the marker), or by
    # post-start (containerdAtBoot false)
    if grep -q 'released before post-start began' <<< "$hj"; then
        n=${n#gate-c,}
        [[ $n == root,step=links,step=ldconfig,step=cdi,containerd,imported,gate-k,kubelet, ]] || v+=" hooks-log-order($n)"
        grep -q 'unit gate: released containerd.service for the boot ahead .*the driver tree it binds is checked complete' <<< "$3" \
            || v+=" pre-start-release-without-tree-check"
    else
        [[ $n == root,step=links,step=ldconfig,step=cdi,gate-c,containerd,imported,gate-k,kubelet, ]] || v+=" hooks-log-order($n)"
    fi
    for u in containerd kubelet; do
        n=$(M journalctl -b --no-pager -o cat -u "$u.service" 2>/dev/null | grep -c '^Started ')
        [ "$n" = 1 ] || v+=" $u-started-$n-times-this-boot"
    done
    echo "$v"
}

# ---- 20 restarts -------------------------------------------------------------------------------
bad=0 worst=""
for ((i = 1; i <= RESTARTS; i++)); do
    since="@$(H date +%s)"
    H systemctl reset-failed "$UNIT" 2>/dev/null
    if ! H timeout 180 systemctl restart "$UNIT"; then bad=$((bad + 1)); worst+=" #$i:restart-failed"; continue; fi
    # "the restart returned" means served: both services are already active
    for s in containerd kubelet; do
        [ "$(inner_state "$s.service")" = active ] || { bad=$((bad + 1)); worst+=" #$i:$s-not-active-when-the-restart-returned"; }
    done
    f=$(facts)
    v=$(order_violations "$f" "$(hook_journal_this_start kube1 "$since")" "$(hook_journal_since kube1 "$since" "$HOOK_IDENT")")
    if [ -n "$v" ]; then bad=$((bad + 1)); worst+=" #$i:$v"; info "restart $i: $f"; fi
    [ "$i" = 1 ] && info "restart 1 timestamps (µs): $f"
done
assert_eq "$(c restarts-order-held)" "0 of $RESTARTS broke a rule" "$bad of $RESTARTS broke a rule"
[ -z "$worst" ] || info "broken:$worst"

# ---- a crash point at each step of the new order ----------------------------------------------
if [ -z "${HELPER_FAILPOINTS:-}" ]; then
    if [ "${E2E_REQUIRE_FAILPOINTS:-0}" = 1 ]; then
        fail "$(c crash-points)" "HELPER_FAILPOINTS is not set, but E2E_REQUIRE_FAILPOINTS=1"
    else
        skip "$(c crash-points)" "needs the failpoints build (set HELPER_FAILPOINTS=...)"
    fi
    exit 0
fi
arm()    { H sh -c "printf '[Service]\nEnvironment=NSPAWN_LIFECYCLE_FAILPOINT=%s\n' '$1' > '$ARMED'" && H systemctl daemon-reload; }
disarm() { H rm -f "$ARMED"; H systemctl daemon-reload; }
cleanup() { disarm; default_order; H umount "$HP" 2>/dev/null; }
trap cleanup EXIT
H mount --bind "$HP_FAILPOINTS" "$HP" || { fail "$(c mount-failpoints-build)" "cannot bind $HP_FAILPOINTS over $HP"; exit 0; }
POINTS=$("$HELPER_FAILPOINTS" failpoints | grep '^post-start-')
info "post-start points: $(echo $POINTS)"
assert_cmd "$(c new-points-listed)" grep -qx 'post-start-after-bus' <<< "$POINTS"
assert_cmd "$(c kubelet-gate-point-listed)" grep -qx 'post-start-mid-kubelet-gate-release' <<< "$POINTS"
containerd_may_run=0
for p in $POINTS; do
    t=${p#post-start-}
    # containerd may have started in the killed boot only once its marker was there: from the
    # boot on when pre-start released it, after post-start's release in the gated order
    gated=0
    case " $GATED_ONLY_POINTS " in *" $p "*) gated=1; gated_order;; esac
    [ "$p" = post-start-after-containerd-start ] && containerd_may_run=1
    arm "$p"
    since="@$(H date +%s)"
    boot_before=$(fact boot "$(facts)")
    H systemctl reset-failed "$UNIT" 2>/dev/null
    H timeout 180 systemctl restart "$UNIT" >/dev/null 2>&1; rc=$?
    disarm
    default_order
    assert_ne "$(c "$t.start-failed")" 0 "$rc"
    assert_match "$(c "$t.killed-at-the-point")" "failpoint $p: SIGKILL" "$(hook_journal_since kube1 "$since" "$HOOK_IDENT")"
    if wait_machine_up kube1 120; then pass "$(c "$t.healed")"; else fail "$(c "$t.healed")" "unit $(uprop ActiveState kube1)"; continue; fi
    f=$(facts)
    # the killed boot is the one before this one, in the machine's persistent journal
    boots=$(M journalctl --list-boots --no-pager 2>/dev/null | awk '{print $2}')
    prev=$(printf '%s\n' "$boots" | tail -2 | head -1)
    [ "$(printf '%s\n' "$boots" | grep -c .)" -ge 2 ] && [ "${prev//-/}" != "$(fact boot "$f" | tr -d -)" ] \
        && [ "${prev//-/}" != "${boot_before//-/}" ] \
        || { fail "$(c "$t.killed-boot-in-journal")" "boots: $(echo $boots); now $(fact boot "$f")"; continue; }
    for u in containerd kubelet; do
        n=$(M journalctl -b "$prev" --no-pager -o cat -u "$u.service" 2>/dev/null | grep -c '^Started ')
        if [ "$u" = containerd ] && { [ "$gated" = 0 ] || [ "$containerd_may_run" = 1 ]; }; then
            assert_le "$(c "$t.killed-boot-$u-at-most-once")" "$n" 1
        else
            assert_eq "$(c "$t.killed-boot-$u-never-started")" 0 "$n"
        fi
    done
    v=$(order_violations "$f" "$(hook_journal_this_start kube1 "$since")" "$(hook_journal_since kube1 "$since" "$HOOK_IDENT")")
    assert_eq "$(c "$t.healed-boot-order-held")" "" "$v"
done
# pre-start killed writing containerd's marker for the boot ahead: the start fails before nspawn
# runs (no boot in the machine's journal for it); Restart=on-failure's pre-start heals it. The
# marker is written only when it is missing (a pre-start keeps the same bytes), as after a host
# reboot: the host's markers go first.
p=pre-start-mid-gate-release; t=${p}
assert_cmd "$(c "$t.listed")" grep -qx "$p" <<< "$("$HELPER_FAILPOINTS" failpoints)"
H sh -c 'rm -f /run/nspawn-lifecycle/machines/kube1/released/*'
arm "$p"
since="@$(H date +%s)"
nboots=$(M journalctl --list-boots --no-pager 2>/dev/null | grep -c .)
H systemctl reset-failed "$UNIT" 2>/dev/null
H timeout 180 systemctl restart "$UNIT" >/dev/null 2>&1; rc=$?
disarm
assert_ne "$(c "$t.start-failed")" 0 "$rc"
assert_match "$(c "$t.killed-at-the-point")" "failpoint $p: SIGKILL" "$(hook_journal_since kube1 "$since" "$HOOK_IDENT")"
if wait_machine_up kube1 120; then pass "$(c "$t.healed")"; else fail "$(c "$t.healed")" "unit $(uprop ActiveState kube1)"; fi
assert_eq "$(c "$t.one-boot-the-healed-one")" $((nboots + 1)) "$(M journalctl --list-boots --no-pager 2>/dev/null | grep -c .)"
assert_eq "$(c "$t.healed-boot-order-held")" "" "$(order_violations "$(facts)" "$(hook_journal_this_start kube1 "$since")" "$(hook_journal_since kube1 "$since" "$HOOK_IDENT")")"
assert_eq "$(c "$t.no-temp-left")" "" "$(H find /run/nspawn-lifecycle/machines -name '*.tmp' 2>&1)"

trap - EXIT
cleanup
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c final-reconcile)" 0 "$rc"
assert_cmd "$(c final-machine-up)" wait_machine_up kube1 120
rm -rf "${r:?}$STAGED/"*
scenario_end
