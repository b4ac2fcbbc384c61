# shellcheck shell=bash
# Scenario 15: the Debian package (E2E_DEB, built by assets/debian/build-deb.sh) as a Debian
# package behaves, in the rig's real systemd host. `dpkg -i` of an earlier build (the same package
# repacked as version <v>~previous) adds nothing but its own files (no drop-in, no .nspawn file, no
# copy at the stable path), reloads systemd and leaves the metrics timer disabled; the packaged
# binary, found on PATH, installs kube1 (copying itself to the stable path) and the machine starts
# with its hooks; an operator enables the timer; the upgrade to E2E_DEB reloads systemd, keeps the
# timer enabled and running and does not restart the running machine; bash completion loads and
# completes; the man pages are where man finds them; `dpkg -r` stops the timer and reloads;
# `dpkg --purge` takes away exactly the package's files and the timer's enablement link, nothing
# `install` wrote, and the machine still restarts after it.
#
# The harness bind-mounts HELPER read-only at the stable path $HP. For this scenario a tmpfs
# covers $HP's directory, so `install` has somewhere to copy the packaged binary and the hooks
# systemd runs are that copy; unmounting it at the end brings HELPER back.
scenario "the Debian package: dpkg -i, the lifecycle with the packaged binary, purge" --needs-helper
if [ -z "${E2E_DEB:-}" ] || [ ! -f "$E2E_DEB" ]; then
    skip "$SC_NAME" "needs the .deb (set E2E_DEB=/path/to/nspawn-lifecycle_<version>_<arch>.deb)"
    exit 0
fi
baseline

u=$(unit_of kube1)
pkg=nspawn-lifecycle
exe=nspawn-lifecycle-helper
hp_dir=${HP%/*}
dropin_dir=/etc/systemd/system/$u.d
deb_in_host=/var/tmp/e2e-$pkg.deb
prev_in_host=/var/tmp/e2e-$pkg-previous.deb
timer=nspawn-lifecycle-metrics.timer
timer_link=/etc/systemd/system/timers.target.wants/$timer
# systemd 252 sets this manager timestamp on every daemon-reload, and on nothing else.
loaded_at() { H systemctl show -p UnitsLoadTimestampMonotonic --value; }
# The package's dpkg state and version.
pkg_state() { H dpkg-query -W -f='${Status} ${Version}' "$pkg" 2>&1; }
# kube1's unit run: its invocation, its nspawn process, whether active.
kube1_run() { echo "$(uprop InvocationID kube1) $(uprop MainPID kube1) $(uprop ActiveState kube1)"; }

# Every path of the host's root filesystem except the ones dpkg, the journal and systemd keep
# changing on their own. -xdev: /var/lib/machines and the tmpfs at $hp_dir are other mounts.
host_paths() {
    H find / -xdev \( -path /var/lib/dpkg -o -path /var/log -o -path /var/cache -o -path /tmp \
        -o -path /var/tmp -o -path /var/lib/systemd \) -prune -o -print | LC_ALL=C sort
}
cleanup() {
    H dpkg --purge "$pkg" >/dev/null 2>&1
    H rm -f "$deb_in_host" "$prev_in_host"
    stop_unit kube1 >/dev/null 2>&1
    H umount "$hp_dir" 2>/dev/null
    # the drop-in now names the same stable path, which is HELPER again: baseline state
    start_unit kube1 >/dev/null 2>&1
}
trap cleanup EXIT

# ---- a node without kube1's hooks, the stable path empty ----------------------------------------
stop_unit kube1 >/dev/null 2>&1
H rm -rf "$dropin_dir" /etc/systemd/nspawn/kube1.nspawn
H systemctl daemon-reload
H dpkg --purge "$pkg" >/dev/null 2>&1     # a leftover of an interrupted run
H systemctl reset-failed "$timer" >/dev/null 2>&1
if ! H mount -t tmpfs -o mode=0755 e2e-s15 "$hp_dir"; then
    fail "$(c stable-dir-tmpfs)" "cannot mount a tmpfs over $hp_dir"; exit 0
fi
H sh -c "cat > $deb_in_host" < "$E2E_DEB"
# The build to upgrade from: this package, its version lowered (0.1.0~previous sorts before 0.1.0).
version=$(dpkg-deb -f "$E2E_DEB" Version)
prev_dir=$(mktemp -d)
dpkg-deb -R "$E2E_DEB" "$prev_dir/root"
sed -i "s/^Version: .*/Version: $version~previous/" "$prev_dir/root/DEBIAN/control"
dpkg-deb --root-owner-group -b "$prev_dir/root" "$prev_dir/previous.deb" >/dev/null
H sh -c "cat > $prev_in_host" < "$prev_dir/previous.deb"
rm -rf "$prev_dir"
before=$(host_paths)

# ---- dpkg -i of the earlier build: the package's own files and nothing else ----------------------
reload0=$(loaded_at)
out=$(H dpkg -i "$prev_in_host" 2>&1); rc=$?
info "dpkg -i (previous): $(printf '%s' "$out" | tr '\n' ' ')"
assert_eq "$(c dpkg-install-exit-0)" 0 "$rc"
assert_eq "$(c dpkg-status-installed)" "install ok installed $version~previous" \
    "$(pkg_state)"
assert_cmd "$(c dpkg-install-daemon-reload)" test "$(loaded_at)" != "$reload0"
listed=$(H dpkg -L "$pkg" | LC_ALL=C sort)
# The same paths as find sees them: the host is merged-/usr (/lib -> usr/lib); dpkg lists what
# the package ships where it ships it (its units under /usr/lib/systemd/system).
listed_real=$(printf '%s\n' "$listed" | { if H test -L /lib; then sed 's|^/lib/|/usr/lib/|'; else cat; fi; } | LC_ALL=C sort -u)
after_install=$(host_paths)
added=$(LC_ALL=C comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after_install"))
assert_eq "$(c dpkg-install-adds-only-package-paths)" "" \
    "$(LC_ALL=C comm -23 <(printf '%s\n' "$added") <(printf '%s\n' "$listed_real"))"
assert_eq "$(c dpkg-install-removes-nothing)" "" \
    "$(LC_ALL=C comm -23 <(printf '%s\n' "$before") <(printf '%s\n' "$after_install"))"
for f in "/usr/bin/$exe" "/usr/share/man/man1/$exe.1.gz" "/usr/share/man/man1/$exe-install.1.gz" \
         "/usr/share/bash-completion/completions/$exe" "/usr/share/zsh/vendor-completions/_$exe" \
         "/usr/share/fish/vendor_completions.d/$exe.fish" "/usr/share/doc/$pkg/copyright" \
         "/usr/share/doc/$pkg/README.md.gz" "/usr/share/doc/$pkg/changelog.gz" \
         /usr/lib/systemd/system/nspawn-lifecycle-metrics.service /usr/lib/systemd/system/nspawn-lifecycle-metrics.timer \
         "/usr/share/$pkg/prometheus/nspawn-lifecycle.rules.yml"; do
    assert_match "$(c "ships$f")" "^$f\$" "$listed"
done
# The metrics units as systemd 252 reads them: no warning, and the timer is not enabled.
out=$(H systemd-analyze verify --man=no /usr/lib/systemd/system/nspawn-lifecycle-metrics.service \
    /usr/lib/systemd/system/nspawn-lifecycle-metrics.timer 2>&1); rc=$?
assert_eq "$(c metrics-units-verify)" "0 " "$rc $out"
assert_eq "$(c metrics-timer-not-enabled)" disabled "$(H systemctl is-enabled $timer 2>&1)"
assert_eq "$(c metrics-timer-not-started)" inactive "$(H systemctl is-active $timer 2>&1)"
assert_eq "$(c maintainer-scripts)" "postinst postrm prerm" \
    "$(H sh -c "ls /var/lib/dpkg/info/$pkg.* | sed -n 's|.*/$pkg\\.||p' | grep -Ev '^(list|md5sums)\$' | sort | tr '\\n' ' '" | sed 's/ $//')"
assert_eq "$(c dpkg-install-no-dropin)" absent "$(H test -e "$dropin_dir" && echo present || echo absent)"
assert_eq "$(c dpkg-install-no-nspawn-file)" absent \
    "$(H test -e /etc/systemd/nspawn/kube1.nspawn && echo present || echo absent)"
assert_eq "$(c dpkg-install-no-stable-copy)" "" "$(H ls -A "$hp_dir")"
assert_eq "$(c dpkg-install-machine-stopped)" inactive "$(uprop ActiveState kube1)"
assert_eq "$(c packaged-binary-on-path)" "/usr/bin/$exe" "$(H sh -c "command -v $exe")"
assert_match "$(c packaged-binary-static)" 'statically linked' "$(H ldd "/usr/bin/$exe" 2>&1)"

# ---- the lifecycle with the packaged binary -----------------------------------------------------
out=$(H "$exe" install kube1 2>&1); rc=$?
info "install (packaged): $(printf '%s' "$out" | tail -5 | tr '\n' ' ')"
assert_eq "$(c install-exit-0)" 0 "$rc"
assert_cmd "$(c stable-copy-is-packaged-binary)" H cmp "/usr/bin/$exe" "$HP"
# statfs of the path itself: findmnt --target would name the harness's bind hidden under the tmpfs
assert_eq "$(c stable-copy-in-tmpfs)" tmpfs "$(H stat -f -c %T "$HP")"
assert_eq "$(c stable-copy-not-package-owned)" 1 "$(H dpkg -S "$HP" >/dev/null 2>&1; echo $?)"
assert_match "$(c hooks-use-stable-path)" "argv\[\]=$HP nspawn-lifecycle pre-start" "$(uprop ExecStartPre kube1)"
if start_unit kube1; then pass "$(c unit-start)"
else fail "$(c unit-start)" "$(H systemctl status "$u" --no-pager -l 2>&1 | tail -15)"; fi
assert_eq "$(c pre-start-status)" 0 "$(exec_field kube1 ExecStartPre 'pre-start' status)"
assert_eq "$(c post-start-status)" 0 "$(exec_field kube1 ExecStartPost 'post-start' status)"
assert_cmd "$(c machine-up)" wait_machine_up kube1 60
assert_cmd "$(c cdi-spec-written)" M test -s "$CDI_SPEC"
assert_match "$(c nspawn-file-binds-gpu)" '^Bind=/dev/nvidia0' "$(nspawn_file kube1)"

# ---- the operator enables the timer; the upgrade keeps it and leaves the machine running -------
H systemctl enable --now $timer >/dev/null 2>&1
assert_eq "$(c timer-enabled-by-operator)" "enabled active" \
    "$(H systemctl is-enabled $timer 2>&1) $(H systemctl is-active $timer 2>&1)"
# the run the upgrade, the removal and the purge must leave running
machine_run="$(uprop InvocationID kube1) $(uprop MainPID kube1) active"
stable_copy=$(H sha256sum "$HP")
dropin_before=$(H sha256sum "$dropin_dir/50-nspawn-lifecycle.conf")
reload1=$(loaded_at)
out=$(H dpkg -i "$deb_in_host" 2>&1); rc=$?
info "dpkg -i (upgrade to $version): $(printf '%s' "$out" | tr '\n' ' ')"
assert_eq "$(c upgrade-exit-0)" 0 "$rc"
assert_eq "$(c upgrade-status-installed)" "install ok installed $version" \
    "$(pkg_state)"
assert_cmd "$(c upgrade-daemon-reload)" test "$(loaded_at)" != "$reload1"
assert_eq "$(c upgrade-keeps-timer)" "enabled active" \
    "$(H systemctl is-enabled $timer 2>&1) $(H systemctl is-active $timer 2>&1)"
# the same run of the machine's unit: same invocation, same nspawn process, still active
assert_eq "$(c upgrade-does-not-restart-machine)" "$machine_run" "$(kube1_run)"
assert_eq "$(c upgrade-keeps-stable-copy)" "$stable_copy" "$(H sha256sum "$HP")"
assert_eq "$(c upgrade-keeps-dropin)" "$dropin_before" "$(H sha256sum "$dropin_dir/50-nspawn-lifecycle.conf")"
assert_cmd "$(c upgrade-machine-up)" wait_machine_up kube1 10

# ---- bash completion and man pages --------------------------------------------------------------
comp=/usr/share/bash-completion/completions/$exe
out=$(H bash --norc --noprofile -c "source $comp; complete -p $exe" 2>&1)
assert_match "$(c bash-completion-loads)" "^complete .*-F [^ ]+ .*$exe\$" "$out"
# and it completes: the function `complete -p` names, asked the way bash asks
out=$(H bash --norc --noprofile -c "source $comp
fn=\$(complete -p $exe | sed -n 's/.* -F \\([^ ]*\\) .*/\\1/p')
COMP_WORDS=($exe ins); COMP_CWORD=1; COMP_LINE='$exe ins'; COMP_POINT=\${#COMP_LINE}
\"\$fn\" $exe ins $exe; printf '%s\\n' \"\${COMPREPLY[@]}\"" 2>&1)
assert_match "$(c bash-completion-completes-install)" '^install$' "$out"
# The host image has no man-db: man on the outer machine reads the host's man tree by name.
if command -v man >/dev/null; then
    manpath=$RUN/host/usr/share/man
    assert_eq "$(c man-finds-page)" "$manpath/man1/$exe.1.gz" "$(man --manpath="$manpath" -w "$exe" 2>&1)"
    assert_match "$(c man-renders-page)" "^NAME" "$(MANPAGER=cat MANWIDTH=100 man --manpath="$manpath" "$exe" 2>&1)"
    assert_match "$(c man-renders-install-page)" "$exe-install" \
        "$(MANPAGER=cat MANWIDTH=100 man --manpath="$manpath" "$exe-install" 2>&1)"
else
    fail "$(c man-finds-page)" "needs man (man-db) on the outer machine (tests/run-all.sh installs it)"
fi

# ---- remove: the timer stops, systemd forgets the units; purge: exactly the package's files go ---
after_lifecycle=$(host_paths)
reload2=$(loaded_at)
out=$(H dpkg -r "$pkg" 2>&1); rc=$?
info "dpkg -r: $(printf '%s' "$out" | tr '\n' ' ')"
assert_eq "$(c remove-exit-0)" 0 "$rc"
assert_eq "$(c remove-status-config-files)" "deinstall ok config-files" "$(H dpkg-query -W -f='${Status}' "$pkg" 2>&1)"
assert_eq "$(c remove-stops-timer)" inactive "$(H systemctl is-active $timer 2>&1)"
assert_cmd "$(c remove-daemon-reload)" test "$(loaded_at)" != "$reload2"
assert_eq "$(c remove-leaves-machine-running)" "$machine_run" "$(kube1_run)"
out=$(H dpkg --purge "$pkg" 2>&1); rc=$?
info "dpkg --purge: $(printf '%s' "$out" | tr '\n' ' ')"
assert_eq "$(c purge-exit-0)" 0 "$rc"
assert_eq "$(c purge-status-gone)" "" "$(H dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)"
after_purge=$(host_paths)
gone=$(LC_ALL=C comm -23 <(printf '%s\n' "$after_lifecycle") <(printf '%s\n' "$after_purge"))
# the package's paths, and the enablement link the operator made (deb-systemd-helper purge)
assert_eq "$(c purge-removes-only-package-paths)" "" \
    "$(LC_ALL=C comm -23 <(printf '%s\n' "$gone") <(printf '%s\n%s\n' "$listed_real" "$timer_link" | LC_ALL=C sort -u))"
assert_eq "$(c purge-removes-timer-link)" absent "$(H test -L "$timer_link" && echo present || echo absent)"
assert_eq "$(c purge-leaves-no-dangling-link)" "" \
    "$(H find /etc/systemd/system -xtype l -name "$timer" 2>&1)"
assert_eq "$(c purge-removes-helper-state)" "" \
    "$(H find /var/lib/systemd/deb-systemd-helper-enabled /var/lib/systemd/deb-systemd-helper-masked -name "$timer*" 2>/dev/null)"
assert_eq "$(c purge-removes-every-path-dpkg-added)" "" \
    "$(LC_ALL=C comm -12 <(printf '%s\n' "$added") <(printf '%s\n' "$after_purge"))"
assert_eq "$(c purge-adds-nothing)" "" \
    "$(LC_ALL=C comm -13 <(printf '%s\n' "$after_lifecycle") <(printf '%s\n' "$after_purge"))"
# what install wrote is not the package's: it stays, and the machine still restarts with it
for f in "$dropin_dir/50-nspawn-lifecycle.conf" /etc/systemd/nspawn/kube1.nspawn "$HP"; do
    assert_cmd "$(c "purge-keeps-${f##*/}")" H test -s "$f"
done
assert_eq "$(c purge-leaves-machine-running)" "$machine_run" "$(kube1_run)"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-after-purge-exit-0)" 0 "$rc"
assert_eq "$(c post-start-after-purge-status)" 0 "$(exec_field kube1 ExecStartPost 'post-start' status)"
assert_cmd "$(c machine-up-after-purge)" wait_machine_up kube1 60
scenario_end
