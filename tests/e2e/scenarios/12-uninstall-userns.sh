# shellcheck shell=bash
# Scenario 12 (issue 10 item 9): user namespaces and ownership of the machine rootfs.
# - uninstall, then a start of the stock unit (which passes -U): the rootfs stays owned by root
#   (uninstall leaves a .nspawn file with PrivateUsers=no and no GPU binds) and the machine runs.
# - Without any .nspawn file the stock unit's -U shifts the rootfs to a private UID range (the
#   failure the issue saw). install and pre-start then refuse, exit 2, with the command that
#   shifts it back; that exact command does, and the machine starts with our hooks again.
scenario "uninstall keeps PrivateUsers=no; a rootfs shifted by -U is refused with the fix" --needs-helper
baseline

u=$(unit_of kube1)
R=$(mroot kube1)
owners() { # uid:gid of the machine's / and a few files, as the outer machine sees the overlay
    local p out=""
    for p in "" /usr/bin/mount /etc/passwd /usr/bin/containerd; do out+="${p:-/}=$(stat -c %u:%g "$R$p") "; done
    echo "${out% }"
}
all_root='/=0:0 /usr/bin/mount=0:0 /etc/passwd=0:0 /usr/bin/containerd=0:0'
assert_eq "$(c owners-root-at-start)" "$all_root" "$(owners)"

# The rig bind-mounts the helper read-only at its stable path, where uninstall's removal of it
# would fail (EBUSY): put a plain copy there instead, and keep one to install from afterwards.
COPY=/usr/local/lib/e2e/helper-copy
H cp "$HP" "$COPY"
H umount "$HP" && H install -m 0755 "$COPY" "$HP"
assert_cmd "$(c helper-is-a-plain-file)" H sh -c "! mountpoint -q $HP && test -x $HP"

# ---- uninstall, then the stock unit -------------------------------------------------------------
out=$(helper uninstall kube1 2>&1); rc=$?
info "uninstall output:"; printf '%s\n' "$out" | sed 's/^/    | /'
assert_eq "$(c uninstall-exit-0)" 0 "$rc"
assert_eq "$(c uninstall-hooks-gone)" 0 "$(exec_count kube1 ExecStartPre 'nspawn-lifecycle')"
nf=$(nspawn_file kube1)
# The helper goes with the last machine that uses it (kube2 does after scenario 7).
others=$(H sh -c 'grep -ls "nspawn-lifecycle pre-start" /etc/systemd/system/systemd-nspawn@*.service.d/*.conf' 2>/dev/null)
if [ -n "$others" ]; then
    assert_match "$(c uninstall-keeps-the-helper-for-other-machines)" "nspawn-lifecycle-helper: kept \(still used by" "$out"
    assert_cmd "$(c helper-still-there)" H test -x "$HP"
else
    assert_cmd "$(c uninstall-removed-the-helper)" H test ! -e "$HP"
fi
assert_match "$(c uninstall-leaves-private-users-no)" '^PrivateUsers=no$' "$nf"
assert_no_match "$(c uninstall-no-gpu-binds)" '/dev/nvidia|host-nvidia|unit-gate' "$nf"
stop_unit kube1 >/dev/null 2>&1
# Nothing gates containerd and kubelet any more: the boot starts them.
if start_unit kube1 && wait_until 60 machine_registered kube1 && wait_until 60 inner_active containerd.service kube1 \
    && wait_until 60 inner_active kubelet.service kube1; then
    pass "$(c stock-unit-starts-after-uninstall)"
else
    fail "$(c stock-unit-starts-after-uninstall)" "$(H systemctl status "$u" --no-pager -l 2>&1 | tail -10)"
fi
assert_match "$(c stock-unit-passes-U)" 'argv\[\]=[^;]* -U ' "$(uprop ExecStart kube1)"
leader=$(leader_of kube1)
assert_eq "$(c no-user-namespace-after-uninstall)" "0 0 4294967295" \
    "$(H cat "/proc/$leader/uid_map" 2>/dev/null | tr -s ' ' | sed 's/^ //')"
assert_eq "$(c owners-root-after-uninstall-start)" "$all_root" "$(owners)"
assert_eq "$(c inner-mount-owned-by-root)" 0 "$(M stat -c %u /usr/bin/mount 2>&1)"
stop_unit kube1 >/dev/null 2>&1

# ---- what the issue saw: no .nspawn file, so -U shifts the rootfs ------------------------------
H rm -f /etc/systemd/nspawn/kube1.nspawn
start_unit kube1 >/dev/null 2>&1
wait_until 60 machine_registered kube1
stop_unit kube1 >/dev/null 2>&1
shifted=$(stat -c %u "$R")
info "after a start with -U and no .nspawn file: $(owners)"
assert_ne "$(c negative-control-U-shifts-the-rootfs)" 0 "$shifted"

# ---- install and pre-start refuse, naming the command -------------------------------------------
before=$(H sh -c 'ls -la /etc/systemd/system/ /etc/systemd/nspawn/ 2>&1; ls -la /etc/systemd/system/'"$u"'.d 2>&1')
out=$(H "$COPY" install kube1 2>&1); rc=$?
info "install on the shifted rootfs: $out"
assert_eq "$(c install-refuses-shifted-exit-2)" 2 "$rc"
assert_match "$(c install-names-owner)" "/var/lib/machines/kube1 is owned by UID $shifted GID [0-9]+, not by root" "$out"
assert_match "$(c install-names-command)" '`systemd-nspawn --directory=/var/lib/machines/kube1 --settings=no --private-users=0 --private-users-ownership=chown /bin/true`' "$out"
assert_eq "$(c install-refusal-wrote-nothing)" "$before" \
    "$(H sh -c 'ls -la /etc/systemd/system/ /etc/systemd/nspawn/ 2>&1; ls -la /etc/systemd/system/'"$u"'.d 2>&1')"
out=$(H "$COPY" nspawn-lifecycle pre-start kube1 2>&1); rc=$?
assert_eq "$(c pre-start-refuses-shifted-exit-2)" 2 "$rc"
assert_match "$(c pre-start-names-command)" 'private-users-ownership=chown' "$out"
assert_cmd "$(c pre-start-refusal-wrote-no-nspawn)" H test ! -e /etc/systemd/nspawn/kube1.nspawn

# ---- the command from the message shifts it back ------------------------------------------------
cmd=$(printf '%s\n' "$out" | sed -n 's/.*`\(systemd-nspawn [^`]*\)`.*/\1/p' | head -1)
info "running the command the message gives: $cmd"
if [ -n "$cmd" ]; then
    # shellcheck disable=SC2086
    assert_cmd "$(c shift-back-command-succeeds)" H timeout 300 $cmd
else
    fail "$(c shift-back-command-succeeds)" "no command in the message: $out"
fi
assert_eq "$(c owners-root-after-shift-back)" "$all_root" "$(owners)"
if [ "$shifted" != 0 ]; then
    # UIDs shifted+n and GIDs alike: nothing at or above the range's base may be left
    stray=$(find "$R" -xdev \( -uid +$((shifted - 1)) -o -gid +$((shifted - 1)) \) -print -quit 2>/dev/null)
    assert_eq "$(c no-file-left-in-shifted-range)" "" "$stray"
fi

# ---- install again; the machine runs with our hooks, and root's setuid mount works --------------
out=$(H "$COPY" install kube1 2>&1); rc=$?
assert_eq "$(c reinstall-exit-0)" 0 "$rc"
assert_cmd "$(c reinstall-puts-the-helper-back)" H cmp "$COPY" "$HP"
if start_unit kube1 && wait_machine_up kube1 120; then pass "$(c machine-up-after-reinstall)"
else fail "$(c machine-up-after-reinstall)" "$(H systemctl status "$u" --no-pager -l 2>&1 | tail -10)"; fi
assert_cmd "$(c setuid-mount-works-inside)" M /bin/sh -c 'd=$(mktemp -d) && mount -t tmpfs e2e "$d" && umount "$d" && rmdir "$d"'
scenario_end
