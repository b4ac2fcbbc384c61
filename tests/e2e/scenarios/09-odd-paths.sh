# shellcheck shell=bash
# Scenario 9 (issue 10 item 3, total renderers): systemd itself reads what pre-start renders for
# odd values. Configured extra mounts whose source and target hold a space, a colon, a backslash
# and non-ASCII (the sources also quotes, '#', ';', '=') are bound inside the machine with the
# right content (read-only and read-write, with and without a separate target); a kubelet unit
# whose name holds ':' or a '\x2d' escape is really gated (the drop-in appears at the unit's own
# drop-in directory inside, the boot skips the unit, post-start starts it once). systemd-nspawn
# logs no "Invalid bind mount" message.
scenario "odd paths and unit names: escaped binds that systemd accepts" --needs-helper
baseline

CFG=/etc/nspawn-lifecycle/config.json
# read-only, bound at a different odd target; the source also holds quotes and '#', ';', '='
# (only touched through argv on the host, so a single quote is safe here)
RO_SRC="/srv/e2e odd:src\\ü 日本 'q' \"d\" #;="
RO_DST='/mnt/odd dst:x\y 日本'
RW_SRC='/srv/e2e rw:dir\é "q" #;='        # read-write, at the same path; no ' (M quotes it with ')
TOKEN="e2e-odd-$$-$RANDOM"
mr=$(mroot kube1)

H mkdir -p "$RO_SRC" "$RW_SRC"
printf '%s\n' "$TOKEN" | H tee "$RO_SRC/content" >/dev/null
H rm -f "$RW_SRC/from-machine"

write_config() { # write_config <kubelet unit name>
    python3 - "$1" "$RO_SRC" "$RO_DST" "$RW_SRC" <<'PY' | H sh -c "mkdir -p ${CFG%/*} && cat > $CFG"
import json, sys
unit, ro_src, ro_dst, rw_src = sys.argv[1:]
print(json.dumps({"machines": {"kube1": {
    "kubeletUnit": unit,
    "mounts": [{"source": ro_src, "target": ro_dst},
               {"source": rw_src, "readOnly": False}]}}}, ensure_ascii=False))
PY
}

# the line pre-start must render for a path pair: ':' and '\' escaped with a backslash
esc() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/:/\\:/g'; }

n=0
for U in 'kube:let.service' 'kube\x2dlet.service'; do
    n=$((n + 1)); k="u$n"
    info "kubelet unit name for this round: $U"
    # a second kubelet stand-in under the odd name, enabled so that only the gate keeps it from
    # starting at boot
    cat > "$mr/etc/systemd/system/$U" <<'EOF'
[Unit]
Description=odd-name kubelet stand-in (e2e scenario 9)
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
EOF
    ln -sfn "../$U" "$mr/etc/systemd/system/multi-user.target.wants/$U"
    write_config "$U"

    stop_unit kube1 >/dev/null 2>&1
    since="@$(H date +%s)"
    if start_unit kube1; then pass "$(c "$k-unit-start")"; else fail "$(c "$k-unit-start")" "$(H systemctl status "$(unit_of kube1)" --no-pager -l 2>&1 | tail -15)"; fi
    assert_cmd "$(c "$k-machine-up")" wait_machine_up kube1 60
    nf=$(nspawn_file kube1)
    info "kube1.nspawn [Files] this round:"; printf '%s\n' "$nf" | sed -n '/^\[Files\]/,$p' | sed 's/^/    | /'
    assert_no_match "$(c "$k-nspawn-accepted-every-bind")" 'Invalid bind mount|Failed to parse' \
        "$(unit_journal_since kube1 "$since")"

    # ---- the extra mounts ----------------------------------------------------------------------
    want_ro="BindReadOnly=$(esc "$RO_SRC"):$(esc "$RO_DST")"
    want_rw="Bind=$(esc "$RW_SRC")"
    assert_cmd "$(c "$k-nspawn-ro-line-escaped")" grep -qxF -- "$want_ro" <<< "$nf"
    assert_cmd "$(c "$k-nspawn-rw-line-escaped")" grep -qxF -- "$want_rw" <<< "$nf"
    assert_eq "$(c "$k-ro-bind-content")" "$TOKEN" "$(M -m kube1 cat "$RO_DST/content" 2>&1)"
    # no '$' in what M passes: systemd 252 expands $VAR in a transient unit's command line
    assert_not_cmd "$(c "$k-ro-bind-read-only")" M -m kube1 sh -c "echo x > '$RO_DST/w'"
    assert_cmd "$(c "$k-rw-bind-writable")" M -m kube1 sh -c "echo $TOKEN > '$RW_SRC/from-machine'"
    assert_eq "$(c "$k-rw-bind-reaches-host")" "$TOKEN" "$(H cat "$RW_SRC/from-machine" 2>&1)"
    H rm -f "$RW_SRC/from-machine"

    # ---- the gate on the odd unit name -----------------------------------------------------------
    want_gate="BindReadOnly=/run/nspawn-lifecycle/unit-gate.conf:$(esc "/run/systemd/system/$U.d/50-nspawn-lifecycle-gate.conf")"
    assert_cmd "$(c "$k-nspawn-gate-line-escaped")" grep -qxF -- "$want_gate" <<< "$nf"
    assert_cmd "$(c "$k-gate-dropin-inside")" M -m kube1 test -f "/run/systemd/system/$U.d/50-nspawn-lifecycle-gate.conf"
    assert_match "$(c "$k-gated-by-dropin")" "ConditionPathExists=/run/nspawn-lifecycle/released/%n" \
        "$(M -m kube1 systemctl cat -- "$U" 2>&1)"
    uj=$(M -m kube1 journalctl -b --no-pager -o cat -u "$U" 2>&1)
    info "$U in kube1's journal this boot: $(printf '%s' "$uj" | tr '\n' '|')"
    assert_match "$(c "$k-skipped-at-boot")" 'unmet condition check \(ConditionPathExists=/run/nspawn-lifecycle/released/kube' "$uj"
    assert_cmd "$(c "$k-own-marker")" M -m kube1 test -f "/run/nspawn-lifecycle/released/$U"
    assert_eq "$(c "$k-started-once")" 1 "$(printf '%s\n' "$uj" | grep -c '^Started ')"
    assert_eq "$(c "$k-active")" active "$(inner_state "$U" kube1)"
    assert_eq "$(c "$k-post-start-status")" 0 "$(exec_field kube1 ExecStartPost 'post-start' status)"
done

# ---- refused: a control character in a configured path, exit 2 naming the key, nothing written --
before=$(H sha256sum /etc/systemd/nspawn/kube1.nspawn)
python3 -c 'import json; print(json.dumps({"machines": {"kube1": {"mounts": [{"source": "/srv/a\nPrivateUsers=pick"}]}}}))' \
    | H sh -c "cat > $CFG"
out=$(helper nspawn-lifecycle pre-start kube1 2>&1); rc=$?
assert_eq "$(c control-char-exit-2)" 2 "$rc"
assert_match "$(c control-char-names-key-and-value)" 'machines\.kube1\.mounts\[0\]\.source: "/srv/a\\nPrivateUsers=pick" contains the control character' "$out"
assert_eq "$(c control-char-nothing-written)" "$before" "$(H sha256sum /etc/systemd/nspawn/kube1.nspawn)"

# ---- back to the baseline: no config, no odd units, kube1 restarted without the extra binds -------
H rm -f "$CFG"
for U in 'kube:let.service' 'kube\x2dlet.service'; do
    rm -f "$mr/etc/systemd/system/$U" "$mr/etc/systemd/system/multi-user.target.wants/$U"
done
H rm -rf "$RO_SRC" "$RW_SRC"
stop_unit kube1 >/dev/null 2>&1
start_unit kube1 >/dev/null 2>&1
assert_cmd "$(c back-to-baseline)" wait_machine_up kube1 60
scenario_end
