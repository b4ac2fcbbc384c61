# shellcheck shell=bash
# Scenario 22 (issue 14): eight GPUs split 4/4 by UUID between kube1 and kube2, then renumbered
# (same UUIDs, other minors and bus ids) and both machines reconciled. Each machine has exactly
# its four GPUs by UUID in its CDI spec, its `.nspawn` binds, its /dev/char links and its device
# cgroup: root in it opens its own minors (ENXIO: no driver behind the fake nodes) and gets EPERM
# for the other machine's even after mknod. Checked after a start, a restart, a daemon-reload
# while running, and after renumbering. Overlapping lists are refused (exit 2) naming both.
scenario "gpus split 4/4 by UUID, survives renumbering" --needs-helper
baseline
CFG=/etc/nspawn-lifecycle/config.json
write_cfg() { printf '%s\n' "$1" | H sh -c "mkdir -p /etc/nspawn-lifecycle && cat > $CFG"; }
uuids() { local k out=""; for k in "$@"; do out+="\"$(gpu_uuid "$k")\", "; done; echo "[${out%, }]"; }
K1=(0 1 2 3); K2=(4 5 6 7)
cleanup() {
    H rm -f "$CFG"
    stop_unit kube2 >/dev/null 2>&1
    helper install kube2 >/dev/null 2>&1
    helper install kube1 >/dev/null 2>&1
    fake_renumber 0; fake_gpus "$E2E_GPUS"
    reconcile kube1 >/dev/null 2>&1
}

fake_gpus 8
write_cfg "{\"machines\": {\"kube1\": {\"gpus\": $(uuids "${K1[@]}")}, \"kube2\": {\"gpus\": $(uuids "${K2[@]}")}}}"
for m in kube1 kube2; do
    out=$(helper install "$m" 2>&1); rc=$?
    assert_eq "$(c "install-$m")" 0 "$rc"; [ "$rc" = 0 ] || info "install $m: $out"
    assert_no_match "$(c "$m-dropin-allows-no-nvidia-group")" 'DeviceAllow=char-(nvidia|drm)' \
        "$(H cat "/etc/systemd/system/systemd-nspawn@$m.service.d/50-nspawn-lifecycle.conf")"
done

# check_split <label> <renumbered 0|1>: each machine has exactly its GPUs, everywhere
check_split() {
    local label=$1 ren=$2 m k minor own other spec names want binds allow links
    for m in kube1 kube2; do
        if [ "$m" = kube1 ]; then own=("${K1[@]}"); other=("${K2[@]}"); else own=("${K2[@]}"); other=("${K1[@]}"); fi
        minor_of() { if [ "$ren" = 1 ]; then echo $((7 - $1)); else echo "$1"; fi; }
        spec=$(M -m "$m" cat "$CDI_SPEC" 2>/dev/null)
        names=$(printf '%s' "$spec" | python3 -c 'import json,sys; print(" ".join(sorted(d["name"] for d in json.load(sys.stdin)["devices"] if d["name"].startswith("GPU-"))))' 2>&1)
        want=$(for k in "${own[@]}"; do gpu_uuid "$k"; echo; done | sort | tr '\n' ' ' | sed 's/ $//')
        assert_eq "$(c "$label.$m-spec-has-exactly-its-uuids")" "$want" "$names"
        # each UUID's device in the spec is the node of its minor now
        for k in "${own[@]}"; do
            minor=$(minor_of "$k")
            assert_eq "$(c "$label.$m-spec-$k-node")" "/dev/nvidia$minor" \
                "$(printf '%s' "$spec" | python3 -c "import json,sys; print([n['path'] for d in json.load(sys.stdin)['devices'] if d['name']=='$(gpu_uuid "$k")' for n in d['containerEdits']['deviceNodes'] if n['path'].startswith('/dev/nvidia')][0])" 2>&1)"
        done
        binds=$(nspawn_file "$m" | sed -n 's|^Bind=/dev/nvidia\([0-9]*\)$|\1|p' | sort -n | tr '\n' ' ' | sed 's/ $//')
        want=$(for k in "${own[@]}"; do minor_of "$k"; done | sort -n | tr '\n' ' ' | sed 's/ $//')
        assert_eq "$(c "$label.$m-nspawn-binds-its-minors")" "$want" "$binds"
        links=$(M -m "$m" sh -c 'for l in /dev/char/195:*; do [ -L "$l" ] && echo "${l#/dev/char/195:}"; done' 2>/dev/null | grep -v '^255$' | sort -n | tr '\n' ' ' | sed 's/ $//')
        assert_eq "$(c "$label.$m-dev-char-links-its-minors")" "$want" "$links"
        allow=$(uprop DeviceAllow "$m")
        for k in "${own[@]}"; do
            minor=$(minor_of "$k")
            assert_match "$(c "$label.$m-cgroup-lists-$minor")" "/dev/char/195:$minor rwm" "$allow"
            assert_eq "$(c "$label.$m-own-$minor-enxio")" ENXIO "$(mknod_open "$m" 195 "$minor")"
        done
        for k in "${other[@]}"; do
            minor=$(minor_of "$k")
            assert_no_match "$(c "$label.$m-cgroup-omits-$minor")" "/dev/char/195:$minor " "$allow"
            assert_eq "$(c "$label.$m-foreign-$minor-eperm")" EPERM "$(mknod_open "$m" 195 "$minor")"
        done
        assert_eq "$(c "$label.$m-nvidiactl-enxio")" ENXIO "$(mknod_open "$m" 195 255)"
    done
}

# ---- start ------------------------------------------------------------------------------------
t_start=$(H date +%s)
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-kube1)" 0 "$rc"; [ "$rc" = 0 ] || info "reconcile kube1: $out"
stop_unit kube2 >/dev/null 2>&1
start_unit kube2 >/dev/null 2>&1
for m in kube1 kube2; do
    if wait_machine_up "$m" 120; then pass "$(c "$m-up")"; else fail "$(c "$m-up")" "$(uprop ActiveState "$m")"; fi
done
info "kube1 DeviceAllow: $(uprop DeviceAllow kube1 | tr '\n' ' ')"
check_split start 0
# a share's device cgroup is pre-start's first step, through the one executor
assert_match "$(c kube1-pre-start-device-cgroup-step)" \
    'device cgroup of systemd-nspawn@kube1\.service (set|unchanged): [0-9]+ NVIDIA/DRM node\(s\).* machine=kube1 step=device-cgroup us=[0-9]+$' \
    "$(hook_journal_since kube1 "@$((t_start - 1))" "$HOOK_IDENT")"

# ---- restart, daemon-reload while running -------------------------------------------------------
out=$(reconcile kube2 2>&1); rc=$?
assert_eq "$(c reconcile-kube2)" 0 "$rc"; [ "$rc" = 0 ] || info "reconcile kube2: $out"
wait_machine_up kube2 60 >/dev/null
H systemctl daemon-reload
check_split restart-and-daemon-reload 0

# ---- renumbered: same UUIDs, other minors and bus ids ------------------------------------------
fake_renumber 1
info "renumbered: $(H cat /proc/driver/nvidia/gpus/0000:06:00.0/information | grep UUID)"
for m in kube1 kube2; do
    out=$(reconcile "$m" 2>&1); rc=$?
    assert_eq "$(c "renumbered.reconcile-$m")" 0 "$rc"; [ "$rc" = 0 ] || info "reconcile $m: $out"
    wait_machine_up "$m" 60 >/dev/null
done
check_split renumbered 1
H systemctl daemon-reload
check_split renumbered-daemon-reload 1
for m in kube1 kube2; do
    out=$(H "$HP" status "$m" --json 2>&1); rc=$?
    assert_eq "$(c "renumbered.status-$m-in-sync")" 0 "$rc"
    assert_match "$(c "renumbered.status-$m-shows-assignment")" '"assigned"' "$out"
done

# ---- overlap: exit 2 naming both machines, nothing written --------------------------------------
write_cfg "{\"machines\": {\"kube1\": {\"gpus\": $(uuids 0 1 2 3)}, \"kube2\": {\"gpus\": [\"$(H cat /proc/driver/nvidia/gpus/0000:0d:00.0/information | sed -n 's/^Bus Location: *//p')\", 7]}}}"
before=$(snapshot /etc/systemd/nspawn/kube2.nspawn /etc/systemd/system/systemd-nspawn@kube2.service.d/50-nspawn-lifecycle.conf)
for cmd in "install kube2" "plan kube2" "nspawn-lifecycle pre-start kube2"; do
    # shellcheck disable=SC2086
    out=$(helper $cmd 2>&1); rc=$?
    assert_eq "$(c "overlap.${cmd##* }-${cmd%% *}-exit-2")" 2 "$rc"
    assert_match "$(c "overlap.${cmd%% *}-names-both")" 'assigned to both machines kube1 and kube2' "$out"
done
assert_eq "$(c overlap.nothing-written)" "$before" "$(snapshot /etc/systemd/nspawn/kube2.nspawn /etc/systemd/system/systemd-nspawn@kube2.service.d/50-nspawn-lifecycle.conf)"
cleanup
scenario_end
