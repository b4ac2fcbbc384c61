#!/bin/bash
# tests/bench/e2e-bench.sh -- issue 6, items 3 and 4, measured in the real-systemd e2e harness.
# Run on demand; never part of the test suite. Needs what tests/e2e/harness.sh needs (root,
# overlayfs, systemd-nspawn, a Debian mirror or the cached rootfs).
#
#   sudo HELPER=target/x86_64-unknown-linux-gnu/release/nspawn-lifecycle-helper tests/bench/e2e-bench.sh
#
# It brings the harness up (`harness.sh deps build up`) with E2E_GPUS=8 fake GPUs and a fake driver
# of 8 + E2E_EXTRA_LIBS=192 = 200 library files, starts kube1, measures, and always takes the
# harness down again. The harness uses fixed paths, so the whole run holds
# /var/tmp/nspawn-lifecycle-e2e.lock (the script re-executes itself under flock).
#
# rewire (item 3): the per-file approach of the older agent, reproduced from the host container:
#     systemd-run --machine=kube1 --pipe --wait --quiet  find <multiarch> -lname '../../../run/nvidia/driver/*' -delete
#     per library file:  ... rm -f <multiarch>/<file>   and   ... ln -s ../../../run/nvidia/driver/usr/lib/<triplet>/<file> <multiarch>/<file>
#   (the older agent linked into /run/host-nvidia/lib/0, which no longer exists: the driver root
#   is nspawn's per-file binds now; a relative target to the same file, so ours replaces each)
#     ... ldconfig
#   timed as a whole, against our rewiring on the same machine: the file steps of
#   `nspawn-lifecycle post-start kube1` (driver root, links, ldconfig, CDI spec; services
#   excluded), read from its per-step `step timing` debug lines. Ours is measured
#     after-perfile  right after each per-file run (its 200 links must all be replaced),
#     steady         nothing changed since the last run,
#     upgrade        the driver version flipped before each run (every file name changes).
# reconcile (item 4): wall time of `nspawn-lifecycle reconcile kube1` against `systemctl restart`
#   of the same unit with a drop-in lacking our ExecStartPre=/ExecStartPost= (the rest identical)
#   and a .nspawn file lacking the unit gate (src/apply/gate.rs; nothing would release it),
#   both timed inside the host container until they return (unit active) and until kubelet is
#   active in the machine ("serving", read from its ActiveEnterTimestamp), interleaved (ABAB..,
#   order alternating) with a daemon-reload between; plus a per-restart breakdown from the unit's
#   µs timestamps and the hooks' `step timing` lines (NSPAWN_LIFECYCLE_LOG=nspawn_lifecycle=debug
#   through an extra drop-in, present for both variants).
# ordered (issue 12's floor; BENCH_ORDERED=1, the default, 0 leaves it out): a third interleaved
#   variant, "bare, in the required order": exactly bare (no hooks of ours, the bare drop-in and
#   .nspawn, `systemctl restart`), plus one drop-in in the machine for its kubelet unit,
#       [Unit]  After=containerd.service  Requires=containerd.service
#   so that systemd alone starts kubelet only once containerd's start job is done (containerd is
#   Type=notify: active once it sent READY=1). ordered vs bare is the floor the order the issue
#   requires sets, with no hook in the way; ours vs ordered is what our hooks add on top of it.
#   The drop-in is checked after each restart (kubelet's After=/Requires=/DropInPaths over the
#   machine's bus): present in ordered's boots only, or the run dies. For every variant the
#   breakdown also has containerd's and kubelet's start (InactiveExitTimestamp) and active
#   (ActiveEnterTimestamp) times in the machine, in ms after nspawn started (`in:` rows).
#
# HELPER_B (optional): a second binary (e.g. before/after a change). reconcile then interleaves a
#   third variant, oursB (the same drop-in with HELPER_B in the hooks, `HELPER_B reconcile`), and
#   BENCH_PARTS=ab compares post-start alone, A (HELPER) and B alternating, in steady state.
# Knobs: HELPER (required), BENCH_N (10), BENCH_PARTS ("rewire reconcile"; also "ab"), BENCH_OUT (output dir,
#   default target/e2e-bench/<date>), BENCH_SETTLE (seconds before each restart, 2), BENCH_ORDERED (1), E2E_GPUS (8),
#   E2E_EXTRA_LIBS (192), and every harness knob.
# Output in BENCH_OUT: samples.csv (part,variant,iter,metric,ms), facts.json (machine, date,
#   command, load), summary.md (the table: median, min, p90), summary.json. A restart's `stop`
#   segment is the stop of the machine the previous restart started: `stop-by-machine.py BENCH_LOG
#   SAMPLES_CSV` (BENCH_LOG: this script's stderr) re-attributes each stop to that machine.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LOCK=/var/tmp/nspawn-lifecycle-e2e.lock
if [ "${E2E_BENCH_LOCKED:-}" != 1 ]; then
    E2E_BENCH_LOCKED=1 exec flock "$LOCK" "$0" "$@"
fi

BENCH_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_SRC/../.." && pwd)
E2E_SRC=$REPO/tests/e2e
[ -n "${HELPER:-}" ] || { echo "HELPER=/path/to/nspawn-lifecycle-helper is required" >&2; exit 2; }
HELPER=$(readlink -f "$HELPER")
if [ -n "${HELPER_B:-}" ]; then HELPER_B=$(readlink -f "$HELPER_B"); fi

N=${BENCH_N:-10}
PARTS=${BENCH_PARTS:-rewire reconcile}
SETTLE=${BENCH_SETTLE:-2}
ORDERED=${BENCH_ORDERED:-1}
case "$ORDERED" in 0|1) ;; *) echo "BENCH_ORDERED must be 0 or 1, not '$ORDERED'" >&2; exit 2;; esac
OUT=${BENCH_OUT:-$REPO/target/e2e-bench/$(date +%Y%m%dT%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
CSV=$OUT/samples.csv

export HELPER E2E_REQUIRE_HELPER=1
export E2E_GPUS=${E2E_GPUS:-8} E2E_EXTRA_LIBS=${E2E_EXTRA_LIBS:-192}
export E2E_DIR=${E2E_DIR:-/var/tmp/nspawn-lifecycle-e2e}
export RUN=$E2E_DIR/run LOGS=$E2E_DIR/logs MACHINE=kube1
export RESULTS=$OUT/harness-results.txt       # not the shared logs/results.txt
export DRIVER_VERSION=${E2E_DRIVER_VERSION:-580.82.07}
OTHER_VERSION=${E2E_EXTRA_DRIVER_VERSIONS:-580.95.05}; OTHER_VERSION=${OTHER_VERSION%% *}

# shellcheck source=../e2e/lib/common.sh
. "$E2E_SRC/lib/common.sh"
set --     # scenario.sh names itself after $1
# shellcheck source=../e2e/lib/scenario.sh
. "$E2E_SRC/lib/scenario.sh"

UNIT=systemd-nspawn@kube1.service
DROPIN=/etc/systemd/system/$UNIT.d/50-nspawn-lifecycle.conf
DEBUG_DROPIN=/etc/systemd/system/$UNIT.d/90-e2e-bench-debug.conf
BENCHDIR=/run/e2e-bench           # in the host container
HPB=${HELPER_B:+/usr/local/lib/e2e-bench/nspawn-lifecycle-helper-b}   # HELPER_B in the host
MULTIARCH=/usr/lib/x86_64-linux-gnu

harness() { "$E2E_SRC/harness.sh" "$@"; }
teardown() { harness down >/dev/null 2>&1 || true; }
trap teardown EXIT
trap 'exit 130' INT TERM

sample() { # sample <part> <variant> <iter> <metric> <ms>
    echo "$1,$2,$3,$4,$5" >> "$CSV"
}
load() { cut -d' ' -f1-3 /proc/loadavg; }
us_to_ms() { awk -v u="$1" 'BEGIN { printf "%.3f", u / 1000 }'; }

# step_timings <text>: "step<TAB>us" for every `step timing` line of the helper's log
step_timings() {
    printf '%s\n' "$1" | sed -n 's/.*step timing.* step="\{0,1\}\([^"]*\)"\{0,1\} us=\([0-9]*\).*/\1\t\2/p'
}

# ---------------------------------------------------------------------------------------------
up() {
    echo "part,variant,iter,metric,ms" > "$CSV"
    log "harness up: E2E_GPUS=$E2E_GPUS, E2E_EXTRA_LIBS=$E2E_EXTRA_LIBS (results of the harness in $RESULTS)"
    harness deps
    harness build
    harness up
    start_unit kube1 >/dev/null 2>&1 || true
    wait_machine_up kube1 180 || die "kube1 did not come up: $(uprop ActiveState kube1)/$(uprop SubState kube1)"
    H mkdir -p "$BENCHDIR"
    if [ -n "${HELPER_B:-}" ]; then
        # a second binary to compare against (before/after a change), in the host's rootfs
        mkdir -p "$RUN/host/usr/local/lib/e2e-bench"
        install -m755 "$HELPER_B" "$RUN/host$HPB"
    fi
    # a GPU node image with libvdpau has the dir; without it ours skips vdpau/ and ln -s would fail
    M mkdir -p "$MULTIARCH/vdpau"
    # every hook logs its per-step timings (debug), for both variants of the reconcile part
    H tee "$DEBUG_DROPIN" >/dev/null <<'EOF'
[Service]
Environment=NSPAWN_LIFECYCLE_LOG=nspawn_lifecycle=debug
EOF
    H systemctl daemon-reload
}

facts() {
    local libs gpus hv sysv
    libs=$(H sh -c "ls $MULTIARCH/*.so.$DRIVER_VERSION $MULTIARCH/vdpau/*.so.$DRIVER_VERSION 2>/dev/null | wc -l")
    gpus=$(H sh -c 'ls -d /proc/driver/nvidia/gpus/* | wc -l')
    hv=$("$HELPER" --version 2>&1 | head -1)
    sysv=$(H systemctl --version | head -1)
    python3 - "$OUT/facts.json" <<EOF
import json, os, platform, subprocess, sys
def sh(c):
    try: return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception as e: return str(e)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
mem = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")), "?")
json.dump({
  "date": sh("date -Iseconds"),
  "command": "HELPER=$HELPER${HELPER_B:+ HELPER_B=$HELPER_B} BENCH_N=$N BENCH_ORDERED=$ORDERED BENCH_PARTS='$PARTS' tests/bench/e2e-bench.sh",
  "git": sh("git -C '$REPO' rev-parse HEAD") + (" (dirty)" if sh("git -C '$REPO' status --porcelain -- src tests") else ""),
  "helper": "$hv", "helper_sha256": sh("sha256sum '$HELPER' | cut -c1-16"),
  "helper_b_sha256": sh("sha256sum '${HELPER_B:-}' | cut -c1-16") if "${HELPER_B:-}" else None,
  "kernel": platform.release(), "cpu": cpu, "nproc": os.cpu_count(), "mem_kb": int(mem),
  "pid1": open("/proc/1/comm").read().strip(), "host_systemd": "$sysv",
  "fake_gpus": int("$gpus"), "driver_version": "$DRIVER_VERSION", "driver_library_files": int("$libs"),
  "n": $N,
}, open(sys.argv[1], "w"), indent=1)
EOF
    log "facts: $(tr -d '\n' < "$OUT/facts.json")"
}

# ---------------------------------------------------------------------------------------------
# Item 3. The per-file script runs in the host container, as the older agent ran on the host.
write_perfile() {
    # the host lib dir as the machine sees it (the .nspawn bind), and the driver's library files
    local bind
    bind=$(nspawn_file kube1 | sed -n "s|^BindReadOnly=\(.*\)/libcuda\.so\.[0-9.]*:/run/nvidia/driver\(/usr/lib/[^/]*\)/libcuda\.so\.[0-9.]*$|\1 ../../../run/nvidia/driver\2|p" | head -1)
    [ -n "$bind" ] || die "no libcuda bind into /run/nvidia/driver in kube1.nspawn"
    local src dst
    read -r src dst <<< "$bind"
    log "per-file: host $src is $dst in the machine"
    H tee "$BENCHDIR/perfile.sh" >/dev/null <<EOF
#!/bin/bash
# the older agent's per-file rewiring, one systemd-run per command; prints wall µs and the count
set -eu
m=kube1; ver=\$1; src=$src; bind=$dst; dir=$MULTIARCH
cd "\$src"
files=\$(ls *.so."\$ver" vdpau/*.so."\$ver" 2>/dev/null)
run() { systemd-run --machine="\$m" --pipe --wait --quiet "\$@" </dev/null; }
n=0
t0=\$(date +%s%N)
run find "\$dir" -lname '../../../run/nvidia/driver/*' -delete
for f in \$files; do
    run rm -f "\$dir/\$f"
    run ln -s "\$bind/\$f" "\$dir/\$f"
    n=\$((n + 1))
done
run ldconfig
t1=\$(date +%s%N)
echo "\$(( (t1 - t0) / 1000 )) \$n"
EOF
    H chmod 755 "$BENCHDIR/perfile.sh"
}

perfile() { # perfile <iter> [variant]: one timed run of the per-file sequence
    local out us n
    out=$(H "$BENCHDIR/perfile.sh" "$(cur_version)" 2>&1) || die "per-file run failed: $out"
    read -r us n <<< "$(printf '%s\n' "$out" | tail -1)"
    [ "$n" -ge 1 ] || die "per-file run found no library files"
    sample rewire "${2:-perfile}" "$1" wall "$(us_to_ms "$us")"
    sample rewire "${2:-perfile}" "$1" files "$n"
    sample rewire "${2:-perfile}" "$1" load1 "$(load | cut -d' ' -f1)"
    log "per-file #$1: $(us_to_ms "$us") ms for $n files (load $(load))"
}

CUR_VERSION=$DRIVER_VERSION
cur_version() { echo "$CUR_VERSION"; }

# Each post-start restarts containerd and kubelet in the machine, whose start limit is systemd's
# default 5 starts in 10 s (the boot's start counts too): back-to-back runs would trip it, so
# runs are BENCH_PACE_MS (3500) apart.
LAST_OURS=0
pace() {
    local wait_ms=$(( LAST_OURS + ${BENCH_PACE_MS:-3500} - $(date +%s%3N) ))
    if [ "$wait_ms" -gt 0 ]; then sleep "$(us_to_ms "$wait_ms")"; fi
    LAST_OURS=$(date +%s%3N)
}

ours() { # ours <variant> <iter>: one `post-start` by hand; samples its step timings
    local v=$1 i=$2 out rc=0 t0 t1 step us rew=0 files=0 line
    pace
    t0=$(date +%s%N)
    out=$(H env NSPAWN_LIFECYCLE_LOG=nspawn_lifecycle=debug "$HP" nspawn-lifecycle post-start kube1 2>&1) || rc=$?
    t1=$(date +%s%N)
    [ $rc = 0 ] || die "post-start failed ($rc): $(printf '%s' "$out" | tail -5)"
    while IFS=$'\t' read -r step us; do
        [ -n "$step" ] || continue
        case "$step" in
            "driver root"|"library and /dev/char links"|ldconfig|"CDI spec")
                rew=$((rew + us))
                [ "$step" = ldconfig ] || files=$((files + us));;
        esac
        sample rewire "$v" "$i" "step:$step" "$(us_to_ms "$us")"
    done < <(step_timings "$out")
    [ "$rew" -gt 0 ] || die "no step timing lines from post-start (built without them?): $(printf '%s' "$out" | tail -3)"
    sample rewire "$v" "$i" rewiring "$(us_to_ms "$rew")"
    sample rewire "$v" "$i" rewiring-without-ldconfig "$(us_to_ms "$files")"
    sample rewire "$v" "$i" post-start-wall "$(( (t1 - t0) / 1000000 ))"
    sample rewire "$v" "$i" load1 "$(load | cut -d' ' -f1)"
    line=$(printf '%s\n' "$out" | grep -o 'links: [0-9]* created, [0-9]* replaced, [0-9]* removed' | head -1)
    log "ours/$v #$i: rewiring $(us_to_ms "$rew") ms (files $(us_to_ms "$files") ms); $line (load $(load))"
    LAST_LINKS=$line
}

links_into() { # links_into <prefix>: symlinks in the machine's multiarch dir (and vdpau) pointing there
    M find "$MULTIARCH" -lname "$1*" 2>/dev/null | wc -l
}

part_rewire() {
    write_perfile
    log "== rewire: per-file vs ours, alternating, N=$N; load $(load)"
    sample rewire meta 0 load-start "$(load | cut -d' ' -f1)"
    ours warmup 0
    local i
    for ((i = 1; i <= N; i++)); do
        perfile "$i"
        if [ "$i" = 1 ]; then
            local hn; hn=$(links_into ../../../run/nvidia/driver/)
            log "after per-file: $hn relative links into the driver root in $MULTIARCH"
            sample rewire check 1 perfile-relative-links "$hn"
        fi
        ours after-perfile "$i"
        if [ "$i" = 1 ]; then
            sample rewire check 1 ours-links-into-driver-root "$(links_into /run/nvidia/driver/)"
            sample rewire check 1 ours-relative-links-left "$(links_into ../../../run/nvidia/driver/)"
            log "after ours: $LAST_LINKS"
        fi
    done
    for ((i = 1; i <= N; i++)); do ours steady "$i"; done
    local v
    for ((i = 1; i <= N; i++)); do
        if [ "$CUR_VERSION" = "$DRIVER_VERSION" ]; then v=$OTHER_VERSION; else v=$DRIVER_VERSION; fi
        fake_driver_version "$v"; CUR_VERSION=$v
        ours upgrade "$i"
    done
    if [ "$CUR_VERSION" != "$DRIVER_VERSION" ]; then
        fake_driver_version "$DRIVER_VERSION"; CUR_VERSION=$DRIVER_VERSION
        ours restore 0
    fi
    sample rewire meta 0 load-end "$(load | cut -d' ' -f1)"
}

# ---------------------------------------------------------------------------------------------
# Item 4.
NSPAWN=/etc/systemd/nspawn/kube1.nspawn
# The ordered variant's drop-in for kubelet, in the machine's rootfs (/etc, which persists across
# its boots), written just before ordered's restart and removed before any other's. The running
# machine does not see it (nothing reloads it) and its next boot does. Not a bind in a .nspawn
# file of its own (as the unit gate is): that would add a mount to ordered's machine, and a
# machine's stop and boot cost follow its mounts (issue 11), so it would differ from bare by more
# than the order. restart_once checks the result in each booted machine (check_order).
ORDER_DROPIN=/etc/systemd/system/kubelet.service.d/60-e2e-bench-ordered.conf
ordered_dropin() { # ordered_dropin on|off
    local f; f=$(mroot kube1)$ORDER_DROPIN
    if [ "$1" = on ]; then
        mkdir -p "${f%/*}"
        printf '[Unit]\nAfter=containerd.service\nRequires=containerd.service\n' > "$f"
    else
        rm -f "$f"
        if [ -d "${f%/*}" ]; then rmdir --ignore-fail-on-non-empty "${f%/*}"; fi
    fi
}

use_dropin() { # use_dropin ours|oursB|bare|ordered
    case "$1" in ordered) H cp "$BENCHDIR/bare.conf" "$DROPIN"; ordered_dropin on;;
                 *) H cp "$BENCHDIR/$1.conf" "$DROPIN"; ordered_dropin off;; esac
    # the .nspawn file each variant's machine has: ours as pre-start renders it (so pre-start
    # finds it up to date, as on every restart of a node whose host did not change); bare (and
    # ordered) without the unit gate, which only our post-start would ever release; oursB
    # (HELPER_B, a build from before the gate when measuring it) the same as bare, which is what
    # it renders
    case "$1" in ours) H cp "$BENCHDIR/ours.nspawn" "$NSPAWN";; *) H cp "$BENCHDIR/bare.nspawn" "$NSPAWN";; esac
    H systemctl daemon-reload
    local pre post
    pre=$(uprop ExecStartPre kube1); post=$(uprop ExecStartPost kube1)
    case "$1" in
        ours) [[ $pre == *"$HP nspawn-lifecycle pre-start"* && $post == *"$HP nspawn-lifecycle post-start"* ]] \
                  || die "our hooks are not in effect after restoring the drop-in";;
        oursB) [[ $pre == *"$HPB nspawn-lifecycle pre-start"* && $post == *"$HPB nspawn-lifecycle post-start"* \
                  && $pre != *"$HP "* && $post != *"$HP "* ]] \
                  || die "the hooks of HELPER_B are not in effect: $pre $post";;
        bare|ordered) [[ $pre != *nspawn-lifecycle* && $post != *nspawn-lifecycle* ]] \
                  || die "the $1 variant's drop-in still runs our hooks: $pre $post";;
    esac
}

# check_order <variant>: kubelet in the booted machine is ordered after containerd and requires
# it, through ORDER_DROPIN, in the ordered variant's boots, and in no other variant's
check_order() {
    local p=/org/freedesktop/systemd1/unit/kubelet_2eservice out after req paths
    out=$(H busctl -M kube1 get-property org.freedesktop.systemd1 "$p" org.freedesktop.systemd1.Unit \
        After Requires DropInPaths) || die "$1: cannot read kubelet's After=/Requires= in kube1"
    { read -r after; read -r req; read -r paths; } <<< "$out"
    if [ "$1" = ordered ]; then
        [[ $after == *'"containerd.service"'* && $req == *'"containerd.service"'* \
           && $paths == *"\"$ORDER_DROPIN\""* ]] \
            || die "ordered: kubelet in kube1 is not ordered after containerd: After=$after Requires=$req DropInPaths=$paths"
    else
        [[ $after != *'"containerd.service"'* && $paths != *"$ORDER_DROPIN"* ]] \
            || die "$1: kubelet in kube1 is ordered after containerd (the ordered drop-in leaked): After=$after DropInPaths=$paths"
    fi
}

# props: the unit's timestamps (µs, realtime) and its exec records, as JSON lines
props() {
    # shellcheck disable=SC2016  # expanded by the shell in the host container
    H sh -c '
        p=$(busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager GetUnit s "$1" | cut -d" " -f2 | tr -d "\"")
        for x in ActiveExitTimestamp InactiveEnterTimestamp InactiveExitTimestamp ActiveEnterTimestamp; do
            printf "%s " "$x"; busctl --json=short get-property org.freedesktop.systemd1 "$p" org.freedesktop.systemd1.Unit "$x"; echo
        done
        for x in ExecMainStartTimestamp ExecStartPre ExecStartPost NRestarts; do
            printf "%s " "$x"; busctl --json=short get-property org.freedesktop.systemd1 "$p" org.freedesktop.systemd1.Service "$x"; echo
        done' sh "$UNIT"
}

# inner_ts <unit>: "<InactiveExitTimestamp> <ActiveEnterTimestamp>" (µs, realtime) of a unit in
# kube1: when its last start began and when it became active
inner_ts() {
    local p=/org/freedesktop/systemd1/unit/${1//./_2e}
    H busctl -M kube1 get-property org.freedesktop.systemd1 "$p" org.freedesktop.systemd1.Unit \
        InactiveExitTimestamp ActiveEnterTimestamp 2>/dev/null | awk '$1 == "t" { printf "%s ", $2 }'
}

restart_once() { # restart_once ours|oursB|bare|ordered <iter>
    local v=$1 i=$2 out rc t_start t_end since
    wait_machine_up kube1 120 || die "kube1 is not up before $v #$i"
    sleep "$SETTLE"
    since=$(date +%s)
    local cmd
    case "$v" in
        ours) cmd="\"$HP\" nspawn-lifecycle reconcile kube1";;
        oursB) cmd="\"$HPB\" nspawn-lifecycle reconcile kube1";;
        *) cmd="systemctl restart $UNIT";;
    esac
    out=$(H bash -c "l=\$(cut -d' ' -f1 /proc/loadavg); s=\$(date +%s%6N); $cmd >/dev/null 2>&1; rc=\$?; e=\$(date +%s%6N); echo \$rc \$s \$e \$l")
    read -r rc t_start t_end l1 <<< "$out"
    [ "$rc" = 0 ] || die "$v restart #$i failed ($rc)"
    unit_active kube1 || die "$v #$i: unit not active after the restart returned"
    # "serving": from the restart call until kubelet is active in the machine, read from its
    # ActiveEnterTimestamp (the kernel's realtime clock, like t_start). A bare boot starts
    # containerd and kubelet in parallel with the rest of the boot (in the 2026-12-02 run its
    # kubelet was active ~100 ms before the unit); ours has post-start start them after it.
    local k_us="" w
    for ((w = 0; w < 300; w++)); do
        [ "$(inner_state kubelet.service kube1)" = active ] && [ "$(inner_state containerd.service kube1)" = active ] && break
        sleep 0.1
    done
    local k_begin c_begin c_us
    read -r k_begin k_us <<< "$(inner_ts kubelet.service)"
    if [ -z "$k_us" ] || [ "$k_us" -le "$t_start" ]; then
        die "$v #$i: kubelet in kube1 not active after the restart (ActiveEnterTimestamp '$k_us')"
    fi
    read -r c_begin c_us <<< "$(inner_ts containerd.service)"
    sample reconcile "$v" "$i" serving "$(us_to_ms $((k_us - t_start)))"
    sample reconcile "$v" "$i" wall "$(us_to_ms $((t_end - t_start)))"
    sample reconcile "$v" "$i" load1 "$l1"
    check_order "$v"
    local p; p=$(props)
    # breakdown from the unit's own timestamps, and containerd's and kubelet's in the machine
    python3 - "$v" "$i" "$t_start" "$t_end" "${c_begin:-0}" "${c_us:-0}" "${k_begin:-0}" "$k_us" <<EOF >> "$CSV"
import json, sys
v, i, t0, t1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c_begin, c_active, k_begin, k_active = (int(x) for x in sys.argv[5:9])
P = {}
for line in """$p""".splitlines():
    k, _, j = line.partition(" ")
    if j.strip(): P[k] = json.loads(j)["data"]
def ms(a, b): return "%.3f" % ((b - a) / 1000)
out = []
def seg(name, a, b):
    if a and b and b >= a: out.append("reconcile,%s,%s,%s,%s" % (v, i, name, ms(a, b)))
seg("seg:call-to-stop-begin", t0, P["ActiveExitTimestamp"])
seg("seg:stop", P["ActiveExitTimestamp"], P["InactiveEnterTimestamp"])
seg("seg:inactive-to-start", P["InactiveEnterTimestamp"], P["InactiveExitTimestamp"])
last = P["InactiveExitTimestamp"]
for e in P["ExecStartPre"]:
    name = "pre-start" if "pre-start" in " ".join(e[1]) else e[1][0].rsplit("/", 1)[-1]
    seg("seg:gap-before-" + name, last, e[3]); seg("seg:exec " + name, e[3], e[5]); last = e[5]
seg("seg:gap-before-nspawn", last, P["ExecMainStartTimestamp"])
post = P["ExecStartPost"]
if post:
    seg("seg:nspawn-boot-to-ready", P["ExecMainStartTimestamp"], post[0][3])
    seg("seg:exec post-start", post[0][3], post[0][5])
    seg("seg:post-start-exit-to-active", post[0][5], P["ActiveEnterTimestamp"])
else:
    seg("seg:nspawn-boot-to-ready", P["ExecMainStartTimestamp"], P["ActiveEnterTimestamp"])
seg("seg:active-to-return", P["ActiveEnterTimestamp"], t1)
# in the machine, ms after nspawn started (not after the call: the stop before belongs to the
# previous restart's machine); kubelet minus containerd may be negative (bare starts both at once)
def at(name, a, b):
    if a and b: out.append("reconcile,%s,%s,in:%s,%s" % (v, i, name, ms(a, b)))
n0 = P["ExecMainStartTimestamp"]
at("containerd start begins", n0, c_begin)
at("containerd active", n0, c_active)
at("kubelet start begins", n0, k_begin)
at("kubelet active", n0, k_active)
at("containerd's own start-up", c_begin, c_active)
at("kubelet active after containerd active", c_active, k_active)
print("\n".join(out))
EOF
    if [[ $v == ours* ]]; then
        local j step us
        j=$(H journalctl --no-pager -o cat -u "$UNIT" --since "@$since" 2>/dev/null | grep 'step timing' || true)
        while IFS=$'\t' read -r step us; do
            [ -n "$step" ] && sample reconcile "$v" "$i" "post:$step" "$(us_to_ms "$us")"
        done < <(step_timings "$j")
    fi
    log "$v #$i: $(us_to_ms $((t_end - t_start))) ms (load $l1)"
}

part_reconcile() {
    H cp "$DROPIN" "$BENCHDIR/ours.conf"
    H sh -c "grep -v '$HP nspawn-lifecycle' '$BENCHDIR/ours.conf' > '$BENCHDIR/bare.conf'"
    H cp "$NSPAWN" "$BENCHDIR/ours.nspawn"
    # bare keeps NotifyReady=yes, as in every earlier measurement: without our post-start its
    # restart returns when the machine's boot is done (ours says no: post-start overlaps the boot)
    H sh -c "grep -v -e 'unit-gate.conf' -e ':/run/nspawn-lifecycle/released$' '$BENCHDIR/ours.nspawn' | sed 's/^NotifyReady=no$/NotifyReady=yes/' > '$BENCHDIR/bare.nspawn'"
    local variants=(bare ours)
    [ "$ORDERED" = 0 ] || variants=(bare ordered ours)
    if [ -n "$HPB" ]; then
        # the same drop-in with HELPER_B in the hooks
        H sh -c "sed 's|$HP nspawn-lifecycle|$HPB nspawn-lifecycle|' '$BENCHDIR/ours.conf' > '$BENCHDIR/oursB.conf'"
        variants+=(oursB)
    fi
    log "== reconcile vs bare restart, N=$N each, interleaved (${variants[*]}); load $(load)"
    log "bare drop-in drops: $(H diff "$BENCHDIR/ours.conf" "$BENCHDIR/bare.conf" | grep '^<' | tr '\n' ' ')"
    log "bare .nspawn drops: $(H diff "$BENCHDIR/ours.nspawn" "$BENCHDIR/bare.nspawn" | grep '^<' | tr '\n' ' ')"
    sample reconcile meta 0 load-start "$(load | cut -d' ' -f1)"
    local i k n=${#variants[@]} v
    # iteration 0 is an unrecorded warm-up; the order rotates every iteration
    for ((i = 0; i <= N; i++)); do
        for ((k = 0; k < n; k++)); do
            v=${variants[$(( (i + k) % n ))]}
            use_dropin "$v"; restart_once "$v" "$i"
        done
    done
    use_dropin ours     # also removes the ordered variant's drop-in from the machine's rootfs
    sample reconcile meta 0 load-end "$(load | cut -d' ' -f1)"
}

# A/B of post-start alone (steady state, no change to rewire), HELPER vs HELPER_B, alternating.
part_ab() {
    [ -n "$HPB" ] || die "BENCH_PARTS=ab needs HELPER_B"
    log "== post-start A (HELPER) vs B (HELPER_B), steady, alternating, N=$N; load $(load)"
    local i save=$HP
    for ((i = 0; i <= N; i++)); do
        HP=$save; ours A "$i"
        HP=$HPB; ours B "$i"
    done
    HP=$save
}

# ---------------------------------------------------------------------------------------------
up
facts
for part in $PARTS; do "part_$part"; done
python3 "$BENCH_SRC/summarize.py" "$OUT"
log "raw numbers and table in $OUT"
