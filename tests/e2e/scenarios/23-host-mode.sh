# shellcheck shell=bash
# Scenario 23 (issue 15, host mode): kubelet and containerd on the harness host itself, wired by
# `host post-start` from `install --host`'s oneshot nspawn-lifecycle-host.service and gate drop-ins.
# The rig masks the host's containerd (prepare_host in harness.sh: only the machines run it); this
# scenario unmasks it, adds a kubelet stand-in (sleep infinity, as in the machines) and puts the
# host back exactly as it found it at the end (trap): containerd masked, no kubelet unit, none of
# our files, units, markers, spec or /dev/char links on the host.
# 1. install --host, start the oneshot: CDI spec in the host's /var/run/cdi (NVIDIA's nvidia-ctk
#    lists its devices), /dev/char links, containerd and kubelet active, markers, image imported;
# 2. driver version switch, then as after a reboot (services down, markers gone with /run): a start
#    of kubelet is skipped by its gate; a restart of the oneshot: spec and links follow, containerd
#    and kubelet begin starting (InactiveExitTimestamp) only after their markers (ctime) of this
#    run, kubelet once;
# 3. GPUs gone: our spec and links removed, containerd and kubelet still started;
#    `host status` at each step: not installed (2), in sync (0), drift with the host's ld.so.cache
#    gone (5, in sync again after the oneshot's restart ran ldconfig), drift after the version switch
#    (5, naming the restart of the oneshot), in sync after it and without GPUs;
# 4. killed (failpoints build, in place) at each post-start point: 137, rerun 0, healthy;
# 5. host post-start and kube1's post-start at the same time: both 0, neither logged waiting for a
#    lock, the host's run ended while kube1's (slowed by a 4 s kubelet stop) was still running;
# then uninstall --host leaves no unit, drop-in or marker of ours.
scenario "host mode: the host's own containerd and kubelet stand-in" --needs-helper
baseline

HU=nspawn-lifecycle-host.service
SD=/etc/systemd/system
STAGED=/var/lib/nspawn-lifecycle/images
MARKERS=/run/nspawn-lifecycle/released
IMG=docker.io/library/e2e-hello:1
NEW_VERSION=580.95.05
# shellcheck source=../lib/oracle.sh
. "$E2E_SRC/lib/oracle.sh"
CTK=$ORACLE/nvidia-ctk

# put the host back as prepare_host made it (other scenarios assume a masked containerd)
restore_host() {
    H ctr -n k8s.io images rm "$IMG" >/dev/null 2>&1
    H systemctl stop "$HU" kubelet.service containerd.service 2>/dev/null
    H "$HP" uninstall --host >/dev/null 2>&1
    H sh -c "rm -f $SD/kubelet.service $CDI_SPEC $MARKERS/containerd.service $MARKERS/kubelet.service
        rm -rf $STAGED $(dirname "$CTK") /var/lib/containerd /run/containerd
        for l in /dev/char/*; do case \$(readlink \"\$l\") in *nvidia*) rm -f \"\$l\";; esac; done
        ln -sfn /dev/null $SD/containerd.service
        systemctl daemon-reload; systemctl reset-failed $HU kubelet.service containerd.service" 2>/dev/null
    mflag_clear kube1 slow-stop
}
trap restore_host EXIT
hstate() { H systemctl show -p ActiveState --value "$1" 2>/dev/null; }
host_active() { [ "$(hstate "$1")" = active ]; }
# nvidia /dev/char links on the host: "<name> <target>" lines, sorted
# shellcheck disable=SC2016  # expanded by the shell in the host container
char_links() { H sh -c 'for l in /dev/char/*; do t=$(readlink "$l"); case "$t" in *nvidia*) echo "${l##*/} $t";; esac; done | sort'; }
before_links=$(char_links)
before_units=$(H sh -c "readlink $SD/containerd.service; ls $SD/kubelet.service $CDI_SPEC 2>&1")

H sh -c "rm -f $SD/containerd.service
cat > $SD/kubelet.service <<'EOF'
[Unit]
Description=kubelet stand-in on the host (e2e scenario 23)
[Service]
ExecStart=/bin/sleep infinity
EOF
mkdir -p $STAGED"
cp "$RUN/support/images/e2e-hello.tar" "$RUN/host$STAGED/"
oracle_install_in "$RUN/host"

# shellcheck disable=SC2016  # expanded by the shell in the host container
dangling_links() { H sh -c 'for l in /dev/char/*; do t=$(readlink "$l"); case "$t" in *nvidia*) [ -e "$l" ] || echo "${l##*/}";; esac; done'; }
# µs since the epoch: when a host unit last began starting; a marker's ctime
started_us() {
    H busctl --json=short get-property org.freedesktop.systemd1 "/org/freedesktop/systemd1/unit/${1//./_2e}" \
        org.freedesktop.systemd1.Unit InactiveExitTimestamp | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"])'
}
marker_us() { H stat -c %.6Z "$MARKERS/$1" 2>/dev/null | python3 -c 'import sys; print(int(round(float(sys.stdin.read()) * 1e6)))' 2>/dev/null; }

# healthy <tag> <gpus>: spec (nvidia-ctk lists every GPU), links, services, markers, image
healthy() {
    local t=$1 n=$2 out miss="" i
    wait_until 60 host_active kubelet.service
    assert_eq "$(c "$t.containerd-active")" active "$(hstate containerd.service)"
    assert_eq "$(c "$t.kubelet-active")" active "$(hstate kubelet.service)"
    assert_cmd "$(c "$t.markers")" H test -e "$MARKERS/containerd.service" -a -e "$MARKERS/kubelet.service"
    out=$(H "$CTK" cdi list 2>&1)
    for ((i = 0; i < n; i++)); do grep -q "nvidia.com/gpu=$i\$" <<< "$out" || miss+=" $i"; done
    grep -q 'nvidia.com/gpu=all$' <<< "$out" || miss+=" all"
    if [ -z "$miss" ]; then pass "$(c "$t.nvidia-ctk-cdi-list")"; else fail "$(c "$t.nvidia-ctk-cdi-list")" "missing$miss in: $out"; fi
    assert_no_match "$(c "$t.nvidia-ctk-no-errors")" '(level=error|level=warning|failed)' "$out"
    assert_match "$(c "$t.dev-char-links")" "nvidia$((n - 1))\$" "$(char_links)"
    assert_eq "$(c "$t.dev-char-none-dangling")" "" "$(dangling_links)"
    assert_match "$(c "$t.image-imported")" "^$IMG$" "$(H ctr -n k8s.io images ls -q 2>&1)"
}

# host status <tag> <exit> <summary ERE>: `host status` judged by the real systemd
host_status_is() {
    local out rc
    out=$(H "$HP" host status 2>&1); rc=$?
    assert_eq "$(c "$1.host-status-exit")" "$2" "$rc"
    assert_match "$(c "$1.host-status-says")" "$3" "$out"
}

# ---- 1: install --host, start the oneshot ----------------------------------------------------------
host_status_is not-installed 2 'host mode is not installed: no /etc/systemd/system/nspawn-lifecycle-host.service'
out=$(H "$HP" install --host 2>&1); rc=$?
assert_eq "$(c install-host)" 0 "$rc"
[ $rc = 0 ] || info "install --host: $(tail -5 <<< "$out")"
assert_cmd "$(c unit-installed)" H test -f "$SD/$HU" -a -L "$SD/multi-user.target.wants/$HU"
for u in containerd kubelet; do
    assert_cmd "$(c "gate-dropin-$u")" H grep -q "ConditionPathExists=$MARKERS/%n" "$SD/$u.service.d/50-nspawn-lifecycle-gate.conf"
done
H systemctl stop containerd.service kubelet.service 2>/dev/null
since="@$(date +%s)"
out=$(H timeout 180 systemctl start "$HU" 2>&1); rc=$?
assert_eq "$(c start-host-unit)" 0 "$rc"
[ $rc = 0 ] || info "start $HU: $(H journalctl --no-pager -o cat -u "$HU" --since "$since" | tail -8)"
assert_eq "$(c host-unit-active)" active "$(hstate "$HU")"
healthy start "$E2E_GPUS"
assert_match "$(c spec-version)" "libcuda\.so\.$DRIVER_VERSION" "$(H cat "$CDI_SPEC")"
host_status_is start 0 "^host: in sync: NVIDIA $DRIVER_VERSION, $E2E_GPUS GPU\\(s\\); containerd.service and kubelet.service active; last post-start succeeded "
out=$(H "$HP" host status --json 2>&1)
assert_match "$(c start.host-status-json-kind)" '"kind": "HostStatus"' "$out"
assert_match "$(c start.host-status-json-exit-status)" '"exitStatus": 0' "$out"
out=$(H "$HP" status --all --format prometheus 2>&1)
assert_match "$(c start.metrics-host-mode-in-sync)" '^nspawn_lifecycle_host_mode_state\{state="in_sync"\} 1$' "$out"
assert_match "$(c start.metrics-host-mode-last-run-ok)" '^nspawn_lifecycle_host_mode_last_post_start_success 1$' "$out"

# the host's loader cache without the driver (here: gone): drift `ld-cache`; the oneshot's restart
# runs the real ldconfig and host status agrees it is in sync again
H mv /etc/ld.so.cache /etc/ld.so.cache.e2e
host_status_is no-ld-cache 5 '^host: drift: the host.s /etc/ld.so.cache does not list NVIDIA .*\(run `systemctl restart nspawn-lifecycle-host.service`\)$'
out=$(H timeout 180 systemctl restart "$HU" 2>&1); rc=$?
assert_eq "$(c no-ld-cache.restart)" 0 "$rc"
H test -e /etc/ld.so.cache || H mv /etc/ld.so.cache.e2e /etc/ld.so.cache
H rm -f /etc/ld.so.cache.e2e
host_status_is ld-cache-rebuilt 0 "^host: in sync: NVIDIA $DRIVER_VERSION"

# ---- 2: driver version change, restart of the host service ------------------------------------------
fake_driver_version "$NEW_VERSION"
host_status_is version-switched 5 "^host: drift: NVIDIA driver changed: host kernel module $NEW_VERSION, host mode's CDI spec $DRIVER_VERSION.*\\(run \`systemctl restart nspawn-lifecycle-host.service\`\\)$"
# as after a reboot: services down, the markers gone with /run; a start of kubelet is skipped
H systemctl stop kubelet.service containerd.service
H rm -f "$MARKERS/containerd.service" "$MARKERS/kubelet.service"
H systemctl start kubelet.service
assert_eq "$(c version.gated-kubelet-skipped)" "inactive no" \
    "$(hstate kubelet.service) $(H systemctl show -p ConditionResult --value kubelet.service)"
t0us=$(date +%s%6N)
out=$(H timeout 180 systemctl restart "$HU" 2>&1); rc=$?
assert_eq "$(c version-restart)" 0 "$rc"
healthy version "$E2E_GPUS"
spec=$(H cat "$CDI_SPEC")
assert_match "$(c version.spec-new)" "libcuda\.so\.$NEW_VERSION" "$spec"
assert_no_match "$(c version.spec-no-old)" "$DRIVER_VERSION" "$spec"
host_status_is version 0 "^host: in sync: NVIDIA $NEW_VERSION"
for u in containerd.service kubelet.service; do
    m=$(marker_us "$u"); s=$(started_us "$u")
    info "$u: marker $m µs, began starting $s µs (restart began $t0us µs)"
    if [[ $m =~ ^[0-9]+$ && $s =~ ^[0-9]+$ && $m -gt $t0us && $s -gt $m ]]; then pass "$(c "version.$u-after-marker")"
    else fail "$(c "version.$u-after-marker")" "began starting at $s, marker at $m (µs)"; fi
done
# "Started" lines of this restart only (--since has one-second granularity)
n=$(H journalctl --no-pager -o short-unix -u kubelet.service --since "@$((t0us / 1000000))" \
    | awk -v t="$t0us" '$1 * 1000000 >= t && / Started /' | wc -l)
assert_eq "$(c version.kubelet-started-once)" 1 "$n"
fake_driver_version "$DRIVER_VERSION"
H timeout 180 systemctl restart "$HU" >/dev/null 2>&1

# ---- 3: GPUs gone → cleanup -------------------------------------------------------------------------
fake_gpus 0
out=$(H timeout 180 systemctl restart "$HU" 2>&1); rc=$?
assert_eq "$(c nogpu-restart)" 0 "$rc"
assert_cmd "$(c nogpu.spec-removed)" H test ! -e "$CDI_SPEC"
assert_eq "$(c nogpu.links-removed)" "" "$(char_links)"
wait_until 30 host_active kubelet.service
assert_eq "$(c nogpu.containerd-active)" active "$(hstate containerd.service)"
assert_eq "$(c nogpu.kubelet-active)" active "$(hstate kubelet.service)"
host_status_is nogpu 0 '^host: in sync: no NVIDIA GPUs on the host, no NVIDIA state on the host'
fake_gpus "$E2E_GPUS"
out=$(H timeout 180 systemctl restart "$HU" 2>&1); rc=$?
assert_eq "$(c gpus-back-restart)" 0 "$rc"
healthy back "$E2E_GPUS"

# ---- 4: killed at each post-start point, in place, run again -------------------------------------------
if [ -z "${HELPER_FAILPOINTS:-}" ]; then
    skip "$(c crash-points)" "needs the failpoints build (HELPER_FAILPOINTS)"
else
    POINTS=$("$HELPER_FAILPOINTS" failpoints | grep '^post-start-')
    info "post-start points: $(tr '\n' ' ' <<< "$POINTS")"
    # A loop over no point checks nothing.
    assert_ne "$(c crash-points-listed)" "" "$POINTS"
    drift() { # every step has work: spec changed, a link and the markers gone
        H sh -c "printf ' ' >> '$CDI_SPEC'; rm -f $MARKERS/containerd.service $MARKERS/kubelet.service
            for l in /dev/char/*; do case \$(readlink \"\$l\") in *nvidia0) rm -f \"\$l\";; esac; done"
    }
    for p in $POINTS; do
        t=crash-${p#post-start-}
        drift
        out=$(H env NSPAWN_LIFECYCLE_FAILPOINT="$p" "$HP_FAILPOINTS" host post-start 2>&1); rc=$?
        assert_eq "$(c "$t.killed")" 137 "$rc"
        assert_match "$(c "$t.killed-at-the-point")" "failpoint $p: SIGKILL" "$out"
        out=$(H "$HP" host post-start 2>&1); rc=$?
        assert_eq "$(c "$t.rerun-succeeds")" 0 "$rc"
        [ $rc = 0 ] || info "$p rerun: $(tail -5 <<< "$out")"
        healthy "$t" "$E2E_GPUS"
    done
fi

# ---- 5: host post-start beside kube1's post-start ----------------------------------------------------
# kube1's driver tree was built for the files the version switch (case 2) replaced: a machine
# needs a restart after a driver change (its post-start refuses a stale tree), so restart it here
H timeout 180 systemctl restart "$(unit_of kube1)"
assert_cmd "$(c concurrent.kube1-restarted)" wait_machine_up kube1 120
mflag_set kube1 slow-stop 4
t0=$(now_ms)
( o=$(H "$HP" nspawn-lifecycle post-start kube1 2>&1); echo "rc=$? end=$(now_ms)"; printf '%s\n' "$o" ) > "$RUN/s23-kube1.out" &
kpid=$!
sleep 0.3
out=$(H "$HP" host post-start 2>&1); hrc=$?; hend=$(now_ms)
wait "$kpid"
kout=$(cat "$RUN/s23-kube1.out"); rm -f "$RUN/s23-kube1.out"
krc=$(sed -n '1s/^rc=\([0-9]*\) .*/\1/p' <<< "$kout"); kend=$(sed -n '1s/.* end=//p' <<< "$kout")
mflag_clear kube1 slow-stop
info "concurrent: host post-start ended after $((hend - t0)) ms, kube1's after $((kend - t0)) ms"
assert_eq "$(c concurrent.host-ok)" 0 "$hrc"
assert_eq "$(c concurrent.kube1-ok)" 0 "$krc"
[ "$krc" = 0 ] || info "kube1 post-start: $(tail -8 <<< "$kout")"
[ "$hrc" = 0 ] || info "host post-start: $(tail -8 <<< "$out")"
assert_no_match "$(c concurrent.host-never-waited)" 'waiting for the' "$out"
assert_no_match "$(c concurrent.kube1-never-waited)" 'waiting for the' "$kout"
assert_lt "$(c concurrent.host-done-while-kube1-runs)" "$hend" "$kend"
healthy concurrent "$E2E_GPUS"
assert_cmd "$(c concurrent.kube1-up)" wait_machine_up kube1 60

# ---- uninstall --host --------------------------------------------------------------------------------
H systemctl stop "$HU" 2>/dev/null
out=$(H "$HP" uninstall --host 2>&1); rc=$?
assert_eq "$(c uninstall-host)" 0 "$rc"
left=$(H sh -c "ls -d $SD/$HU $SD/*.wants/$HU $SD/containerd.service.d/50-nspawn-lifecycle-gate.conf \
    $SD/kubelet.service.d/50-nspawn-lifecycle-gate.conf $MARKERS/containerd.service $MARKERS/kubelet.service 2>/dev/null")
assert_eq "$(c uninstall-leaves-nothing)" "" "$left"

# ---- the host as the rig made it, for the scenarios after this one ---------------------------------
trap - EXIT
restore_host
assert_eq "$(c host-restored.units)" "$before_units" "$(H sh -c "readlink $SD/containerd.service; ls $SD/kubelet.service $CDI_SPEC 2>&1")"
assert_eq "$(c host-restored.dev-char)" "$before_links" "$(char_links)"
assert_eq "$(c host-restored.containerd-inactive)" inactive "$(hstate containerd.service)"
scenario_end
