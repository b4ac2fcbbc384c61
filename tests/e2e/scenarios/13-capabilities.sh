# shellcheck shell=bash
# Scenario 13 (issue 10 item 10): which capabilities containerd, runc and a container start need,
# measured, and the dropCapabilities setting proven under a real systemd.
# 1. Measure: with kube1 under Capability=all, for each capability in the machine's bounding set,
#    containerd.service is restarted with only that one taken from its bounding set (which
#    containerd-shim, runc and the container inherit), and a container is started with ctr (a
#    static program in a plain rootfs: it prints its capability sets and chowns a file, i.e. uses
#    CAP_CHOWN from the default OCI set). INFO lines list what each start needed.
# 2. Prove: the config's dropCapabilities = RECOMMENDED (tests/README.md "Threat model"), each of which the
#    measurement must have found unneeded; kube1 restarted through pre-start; the machine's PID 1
#    bounding set (CapBnd in /proc/<leader>/status, decoded) lacks every dropped capability and
#    keeps the rest; post-start brought containerd and the kubelet stand-in up; a container runs
#    and its bounding set lacks them too.
# And perf_event_open, which the .nspawn file's SystemCallFilter= allows, works in the machine.
scenario "capabilities containerd, runc and a container need; dropCapabilities" --needs-helper
baseline

CAPS=(CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_KILL CAP_SETGID
      CAP_SETUID CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE CAP_NET_BROADCAST CAP_NET_ADMIN
      CAP_NET_RAW CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE CAP_SYS_RAWIO CAP_SYS_CHROOT
      CAP_SYS_PTRACE CAP_SYS_PACCT CAP_SYS_ADMIN CAP_SYS_BOOT CAP_SYS_NICE CAP_SYS_RESOURCE
      CAP_SYS_TIME CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE CAP_AUDIT_WRITE CAP_AUDIT_CONTROL
      CAP_SETFCAP CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG CAP_WAKE_ALARM CAP_BLOCK_SUSPEND
      CAP_AUDIT_READ CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE)
# The set the README recommends dropping (keep in step with tests/README.md "Threat model").
RECOMMENDED="CAP_SYS_MODULE CAP_SYS_RAWIO CAP_SYS_TIME CAP_SYS_PACCT CAP_MAC_ADMIN CAP_MAC_OVERRIDE CAP_SYSLOG CAP_WAKE_ALARM CAP_BLOCK_SUSPEND CAP_AUDIT_READ CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE"
decode_caps() { # decode_caps <hex>: the names of the bits set, space-separated
    local hex=$1 i out=""
    for i in "${!CAPS[@]}"; do
        if (( (16#$hex >> i) & 1 )); then out+="${CAPS[$i]} "; fi
    done
    echo "${out% }"
}
capbnd_of() { awk '/^CapBnd:/ {print $2}' "$@"; }
has_word() { case " $2 " in *" $1 "*) return 0;; esac; return 1; }

u=$(unit_of kube1)
R=$(mroot kube1)

# ---- the container: a static program in a plain rootfs inside the machine -----------------------
tmp=$(mktemp -d)
cat > "$tmp/capcheck.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) { perror("/proc/self/status"); return 1; }
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Cap", 3)) fputs(line, stdout);
    fclose(f);
    FILE *t = fopen("/tmp/owned", "w");
    if (!t) { perror("create /tmp/owned"); return 1; }
    fclose(t);
    if (chown("/tmp/owned", 1234, 1234)) { perror("chown /tmp/owned"); return 1; }
    puts("capcheck ok");
    return 0;
}
EOF
if gcc -static -O2 -o "$tmp/capcheck" "$tmp/capcheck.c"; then pass "$(c capcheck-built)"
else fail "$(c capcheck-built)" "gcc -static failed"; fi
CROOT=/var/lib/e2e-capcheck/rootfs
mkdir -p "$R$CROOT/bin" "$R$CROOT/tmp" "$R$CROOT/proc" "$R$CROOT/dev" "$R$CROOT/sys" "$R$CROOT/etc"
install -m 0755 "$tmp/capcheck" "$R$CROOT/bin/capcheck"
rm -rf "$tmp"
# run_container <id>: start the container once through containerd; prints its output.
# --cpu-shares 0: ctr's default of 1024 makes runc write cpu.weight, and the rig's cgroup tree
# has no cpu controller (the outer machine delegates none); nothing else is changed from ctr's
# default spec (its 14 default capabilities, new pid/ipc/uts/mount/network namespaces).
run_container() {
    M timeout 60 ctr -n e2e-caps run --rm --cpu-shares 0 --rootfs "$CROOT" "capcheck-$1" /bin/capcheck 2>&1
    M ctr -n e2e-caps containers rm "capcheck-$1" >/dev/null 2>&1
}
out=$(run_container all)
if printf '%s' "$out" | grep -q 'capcheck ok'; then pass "$(c container-runs-with-all-capabilities)"
else fail "$(c container-runs-with-all-capabilities)" "$out"; fi

# ---- perf_event_open: allowed by the .nspawn file's SystemCallFilter= (nspawn's default filter
# answers EPERM), as eBPF agents (Cilium's perf ring buffers) and profilers need it --------------
tmp=$(mktemp -d)
cat > "$tmp/perfcheck.c" <<'EOF'
#include <errno.h>
#include <linux/perf_event.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_SOFTWARE;
    a.size = sizeof a;
    a.config = PERF_COUNT_SW_TASK_CLOCK;
    a.disabled = 1;
    long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    if (fd < 0) { printf("perf_event_open: errno %d (%s)\n", errno, strerror(errno)); return 1; }
    printf("perf_event_open ok\n");
    return 0;
}
EOF
if gcc -static -O2 -o "$tmp/perfcheck" "$tmp/perfcheck.c"; then
    mkdir -p "$R/usr/local/bin" && install -m 0755 "$tmp/perfcheck" "$R/usr/local/bin/e2e-perfcheck"
    assert_match "$(c perf-event-open-allowed-in-machine)" '^perf_event_open ok$' "$(M /usr/local/bin/e2e-perfcheck 2>&1)"
    assert_match "$(c nspawn-file-allows-perf-event-open)" '^SystemCallFilter=.*perf_event_open' "$(nspawn_file kube1)"
    rm -f "$R/usr/local/bin/e2e-perfcheck"
else
    fail "$(c perfcheck-built)" "gcc -static failed"
fi
rm -rf "$tmp"

# ---- 1. measure: one capability at a time taken from containerd's bounding set ------------------
leader=$(leader_of kube1)
full=$(H cat "/proc/$leader/status" | capbnd_of)
present=$(decode_caps "$full")
info "machine PID 1 CapBnd under Capability=all: $full = $(wc -w <<<"$present") capabilities"
# Dropping a capability the machine never had proves nothing: the host container must pass them on.
missing=""
for cap in $RECOMMENDED; do has_word "$cap" "$present" || missing+="$cap "; done
assert_eq "$(c capability-all-reaches-the-machine)" "" "${missing% }"
dropin_dir=$R/etc/systemd/system/containerd.service.d
mkdir -p "$dropin_dir"
needed_by_containerd="" needed_by_container="" unneeded=""
for cap in $present; do
    printf '[Service]\nCapabilityBoundingSet=~%s\n' "$cap" > "$dropin_dir/90-e2e-capdrop.conf"
    H systemctl -M kube1 daemon-reload
    if ! H timeout 60 systemctl -M kube1 restart containerd.service || ! inner_active containerd.service kube1; then
        needed_by_containerd+="$cap "
        continue
    fi
    out=$(run_container "$cap")
    if printf '%s' "$out" | grep -q 'capcheck ok'; then
        unneeded+="$cap "
    else
        needed_by_container+="$cap "
        info "without $cap: $(printf '%s' "$out" | tail -2 | tr '\n' ' ' | cut -c1-300)"
    fi
done
rm -f "$dropin_dir/90-e2e-capdrop.conf"; rmdir "$dropin_dir" 2>/dev/null
H systemctl -M kube1 daemon-reload
H timeout 60 systemctl -M kube1 restart containerd.service
info "needed for containerd to start: ${needed_by_containerd:-none}"
info "needed for containerd-shim, runc and the container start: ${needed_by_container:-none}"
info "not needed by containerd, runc or the container: ${unneeded:-none}"
for cap in $RECOMMENDED; do
    if has_word "$cap" "$unneeded"; then pass "$(c "measured-unneeded-$cap")"
    else fail "$(c "measured-unneeded-$cap")" "$cap is recommended for dropping but a container start needed it"; fi
done

# ---- 2. dropCapabilities through the product ----------------------------------------------------
json_list=$(printf '"%s",' $RECOMMENDED); json_list="[${json_list%,}]"
H mkdir -p /etc/nspawn-lifecycle
printf '{"machines": {"kube1": {"dropCapabilities": %s}}}\n' "$json_list" | H tee /etc/nspawn-lifecycle/config.json >/dev/null
stop_unit kube1 >/dev/null 2>&1
if start_unit kube1 && wait_machine_up kube1 120; then pass "$(c machine-up-with-dropped-capabilities)"
else fail "$(c machine-up-with-dropped-capabilities)" "$(H systemctl status "$u" --no-pager -l 2>&1 | tail -10)"; fi
assert_match "$(c nspawn-file-drops)" "^DropCapability=$RECOMMENDED\$" "$(nspawn_file kube1)"
leader=$(leader_of kube1)
bnd=$(H cat "/proc/$leader/status" | capbnd_of)
kept=$(decode_caps "$bnd")
info "machine PID 1 CapBnd with dropCapabilities: $bnd = $kept"
gone="" still=""
for cap in $RECOMMENDED; do has_word "$cap" "$kept" && still+="$cap "; done
assert_eq "$(c dropped-capabilities-gone-from-machine-pid1)" "" "${still% }"
for cap in $present; do has_word "$cap" "$RECOMMENDED" || has_word "$cap" "$kept" || gone+="$cap "; done
assert_eq "$(c other-capabilities-kept)" "" "${gone% }"
assert_cmd "$(c kubelet-standin-active)" inner_active kubelet.service kube1
out=$(run_container dropped)
if printf '%s' "$out" | grep -q 'capcheck ok'; then pass "$(c container-runs-with-dropped-capabilities)"
else fail "$(c container-runs-with-dropped-capabilities)" "$out"; fi
cbnd=$(printf '%s\n' "$out" | capbnd_of)
still=""
for cap in $RECOMMENDED; do has_word "$cap" "$(decode_caps "${cbnd:-0}")" && still+="$cap "; done
assert_ne "$(c container-capbnd-read)" "" "$cbnd"
assert_eq "$(c dropped-capabilities-gone-from-container)" "" "${still% }"
info "container CapBnd: $cbnd = $(decode_caps "${cbnd:-0}")"

# ---- back to the default ------------------------------------------------------------------------
H rm -f /etc/nspawn-lifecycle/config.json
M ctr namespaces rm e2e-caps >/dev/null 2>&1
rm -rf "$R/var/lib/e2e-capcheck"
stop_unit kube1 >/dev/null 2>&1
start_unit kube1 >/dev/null 2>&1 && wait_machine_up kube1 120
assert_match "$(c default-capability-all-again)" '^Capability=all$' "$(nspawn_file kube1)"
assert_no_match "$(c default-drops-nothing)" '^DropCapability=' "$(nspawn_file kube1)"
scenario_end
