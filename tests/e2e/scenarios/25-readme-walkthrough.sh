# shellcheck shell=bash
# Scenario 25: the README is tested. The commands of its node walkthrough ("Installing on a node",
# between the walkthrough markers) run verbatim in the systemd host, in order, from a directory
# holding the helper as an operator downloads it, each exiting 0; after them kube1 is uninstalled
# and the helper is in /usr/local/sbin. Then the rig is put back: install, restart, in sync.
scenario "the README's node walkthrough runs verbatim" --needs-helper
baseline

README=$E2E_SRC/../../README.md
WORK=/root/e2e-walkthrough
steps=$(sed -n '/<!-- walkthrough:begin/,/<!-- walkthrough:end/p' "$README" | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d')
count=$(printf '%s\n' "$steps" | grep -c .)
info "the README's walkthrough: $count commands"
assert_cmd "$(c walkthrough-found)" test "$count" -ge 6

# The rig bind-mounts the helper read-only at its stable path, which the walkthrough's uninstall
# removes (EBUSY on a mount point): a plain copy there instead, as a package would leave it.
if H mountpoint -q "$HP"; then
    H cp "$HP" /root/e2e-helper-copy && H umount "$HP" && H install -m 0755 /root/e2e-helper-copy "$HP"
    H rm -f /root/e2e-helper-copy
fi
H mkdir -p "$WORK"
H sh -c "cat > $WORK/nspawn-lifecycle-helper && chmod 0755 $WORK/nspawn-lifecycle-helper" <"$HELPER"
n=0
while IFS= read -r line; do
    [ -n "$line" ] || continue
    n=$((n + 1))
    out=$(H sh -c "cd $WORK && PATH=/usr/local/sbin:\$PATH && $line" </dev/null 2>&1); rc=$?
    info "walkthrough $n: ${line%%  #*} -> exit $rc"
    if [ "$rc" = 0 ]; then pass "$(c "step-$n")"
    else fail "$(c "step-$n")" "'$line' exited $rc: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"; fi
done <<< "$steps"
assert_cmd "$(c helper-in-usr-local-sbin)" H test -x /usr/local/sbin/nspawn-lifecycle-helper
assert_cmd "$(c uninstalled-at-the-end)" H test ! -e /etc/systemd/system/systemd-nspawn@kube1.service.d/50-nspawn-lifecycle.conf

# ---- the rig as it was: kube1 installed and started through its hooks, the copies gone ----------
out=$(H /usr/local/sbin/nspawn-lifecycle-helper install kube1 2>&1); rc=$?
assert_eq "$(c reinstall)" 0 "$rc"
assert_cmd "$(c helper-back-at-its-stable-path)" H test -x "$HP"
H rm -rf "$WORK" /usr/local/sbin/nspawn-lifecycle-helper
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c restart-with-hooks)" 0 "$rc"
assert_cmd "$(c machine-up-again)" wait_machine_up kube1 120
scenario_end
