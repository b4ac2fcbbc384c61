# shellcheck shell=bash
# Scenario 2 (issue 5 §2): staged image tarballs. A valid OCI tarball in the staged directory
# (default /var/lib/nspawn-lifecycle/images/*.tar in the machine, issue 3) is imported by post-start
# and listed by `ctr -n k8s.io images ls`; a corrupt one is set aside (not deleted) and reported,
# the node does not crash-loop, and kubelet is still active. Then the per-start import bounds.
scenario "staged images: one valid, one corrupt" --needs-helper
baseline

STAGED=/var/lib/nspawn-lifecycle/images
IMG=docker.io/library/e2e-hello:1
r=$(mroot kube1)
mkdir -p "$r$STAGED"
rm -rf "${r:?}$STAGED/"*
cp "$RUN/support/images/e2e-hello.tar" "$RUN/support/images/e2e-corrupt.tar" "$r$STAGED/"
bad_sha=$(sha256sum < "$RUN/support/images/e2e-corrupt.tar" | cut -d' ' -f1)
M ctr -n k8s.io images rm "$IMG" >/dev/null 2>&1        # so a listing proves this start imported it

since="@$(date +%s)"
out=$(reconcile kube1 2>&1); rc=$?
info "reconcile: rc=$rc $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_eq "$(c reconcile-succeeds-despite-corrupt-tarball)" 0 "$rc"
assert_cmd "$(c machine-up)" wait_machine_up kube1 60
n0=$(uprop NRestarts kube1)
assert_match "$(c valid-image-listed)" "^$IMG$" "$(M ctr -n k8s.io images ls -q 2>&1)"
assert_cmd "$(c valid-tarball-stays)" test -f "$r$STAGED/e2e-hello.tar"
assert_cmd "$(c corrupt-tarball-moved-from-staged-dir)" test ! -e "$r$STAGED/e2e-corrupt.tar"
aside=$(find "$r$STAGED" -type f -exec sha256sum {} + 2>/dev/null | awk -v s="$bad_sha" '$1==s{print $2}' | head -1)
if [ -n "$aside" ]; then pass "$(c corrupt-tarball-set-aside-not-deleted)"; info "set aside at ${aside#"$r"}"
else fail "$(c corrupt-tarball-set-aside-not-deleted)" "no file with the corrupt tarball's sha256 under $STAGED: $(find "$r$STAGED" | tr '\n' ' ')"; fi
assert_match "$(c corrupt-tarball-reported)" 'e2e-corrupt\.tar' "$(hook_journal_since kube1 "$since")"
assert_eq "$(c kubelet-active)" active "$(inner_state kubelet.service)"
assert_eq "$(c containerd-active)" active "$(inner_state containerd.service)"
sleep 3
assert_eq "$(c no-crash-loop)" "$n0" "$(uprop NRestarts kube1)"
assert_eq "$(c unit-still-active)" active "$(uprop ActiveState kube1)"

# a second start leaves the set-aside tarball where it is and still imports the valid one
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c second-reconcile)" 0 "$rc"
if [ -n "$aside" ]; then assert_cmd "$(c set-aside-tarball-kept)" test -f "$aside"; fi
assert_match "$(c valid-image-still-listed)" "^$IMG$" "$(M ctr -n k8s.io images ls -q 2>&1)"
assert_cmd "$(c kubelet-active-after-second-start)" wait_until 30 inner_active kubelet.service kube1

# Issue 10 item 4: the per-start bounds. With importMaxImages=1 one tarball (the least recently
# imported: here the older one) is imported, the other stays in place, untouched, and one line
# names it and why.
rm -rf "${r:?}$STAGED/"*
cp "$RUN/support/images/e2e-hello.tar" "$RUN/support/images/e2e-corrupt.tar" "$r$STAGED/"
touch -d '-1 hour' "$r$STAGED/e2e-hello.tar"
M ctr -n k8s.io images rm "$IMG" >/dev/null 2>&1
H sh -c 'mkdir -p /etc/nspawn-lifecycle && echo "{\"defaults\": {\"importMaxImages\": 1}}" > /etc/nspawn-lifecycle/config.json'
since="@$(date +%s)"
out=$(reconcile kube1 2>&1); rc=$?
H rm -f /etc/nspawn-lifecycle/config.json
assert_eq "$(c bounded-reconcile)" 0 "$rc"
hj=$(hook_journal_since kube1 "$since")
assert_match "$(c bounded-imports-valid-one)" "^$IMG$" "$(M ctr -n k8s.io images ls -q 2>&1)"
assert_match "$(c bounded-reports-what-was-left)" 'left 1 staged image\(s\) in /var/lib/nspawn-lifecycle/images for the next start \(importMaxImages = 1 imports per start\): e2e-corrupt\.tar' "$hj"
assert_eq "$(c bounded-left-in-place)" "$bad_sha" "$(sha256sum < "$r$STAGED/e2e-corrupt.tar" | cut -d' ' -f1)"
assert_cmd "$(c bounded-nothing-set-aside)" test ! -e "$r$STAGED/failed"
assert_cmd "$(c kubelet-active-after-bounded-start)" wait_until 30 inner_active kubelet.service kube1

rm -rf "${r:?}$STAGED/"*
scenario_end
