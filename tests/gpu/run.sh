#!/bin/bash
# The proof on a real GPU: the whole wiring run on this NVIDIA host, beside NVIDIA's own tools.
#
#   run.sh --kit KIT --evidence DIR [--runs N]
#
# KIT: the directory tests/gpu/kit.sh built, or that directory packed (`tar czf`), as it travels.
# Run as root on a host with an NVIDIA GPU and its driver loaded. KIT is what tests/gpu/kit.sh
# built on a machine with the package mirror (the helper, its failpoints build, the CDI
# injector, NVIDIA's nvidia-ctk and nvidia-cdi-hook, Debian 12's runc, a glibc image with the
# CUDA probe): this host needs no network and gets nothing installed. Everything happens in a
# private mount namespace over a scratch directory under /var/tmp that is removed at the end;
# the only thing made outside it is the link /run/nspawn-lifecycle-gpu-kit -> KIT while it runs
# (the relinked runc's loader is found through it), removed too.
#
# Checks, one line each ("PASS …" / "FAIL …"), then "N passed, M failed":
#  1. discover finds every GPU nvidia-smi lists (UUID, bus id, minor), the control nodes, the
#     kernel module's version and the driver's files wherever this host keeps them; compared
#     with `nvidia-ctk cdi generate --mode=nvml` (tests/gpu/compare.py): every difference listed
#     and explained
#  2. install + pre-start for the machine `gpuproof` (a rootfs on disk: the kit's image) on a
#     view of this host (tests/gpu/lib.sh host_view: its files, writes into the scratch): the
#     driver tree and the .nspawn file; then the machine's binds made as systemd-nspawn makes
#     them, and post-start's own plan and executor (`rewire-root`) wire it: links, loader cache,
#     CDI spec, which nvidia-ctk lists
#  3. the GPU Operator's validator checks in both driver views: `chroot <machine> nvidia-smi`
#     and `chroot <machine>/run/nvidia/driver nvidia-smi` list every GPU
#  4. CUDA in a container: real runc in the machine creates a container from our CDI spec (the
#     official CDI library applies it) from an image with no driver; tests/gpu/cuda-probe.c
#     dlopens libcuda.so.1, JIT-compiles a PTX kernel and checks its result on every GPU;
#     nvidia-smi -L in such a container lists every GPU. The same with NVIDIA's own spec
#     (nvml mode, nvidia-cdi-hook) on the host, side by side
#  5. the cost of creating a container: a no-op container with our spec, NVIDIA's and none,
#     interleaved, N runs each (15 by default): medians and the difference over none
#
# Exit: 0 every check passed; 1 a check failed; 2 usage or a kit that is not one; 3 this host
# has no NVIDIA GPU (one line says so; nothing was run).
# Evidence: DIR gets every output: discover's, nvidia-smi's, both specs, the .nspawn file, each
# hook's and container's log, the cost table (cost.txt) and the summary (summary.txt).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

usage() {
    echo "usage: run.sh --kit KIT --evidence DIR [--runs N]  (as root, on an NVIDIA GPU host)" >&2
    exit 2
}

if [ "${1:-}" != --inner ]; then
    KIT="" EVIDENCE="" RUNS=15
    while [ $# -gt 0 ]; do
        case $1 in
            --kit) [ $# -ge 2 ] || usage; KIT=$2; shift 2 ;;
            --evidence) [ $# -ge 2 ] || usage; EVIDENCE=$2; shift 2 ;;
            --runs) [ $# -ge 2 ] || usage; RUNS=$2; shift 2 ;;
            -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
            *) echo "run.sh: unknown argument '$1'" >&2; usage ;;
        esac
    done
    [ -n "$KIT" ] && [ -n "$EVIDENCE" ] || usage
    case $RUNS in ''|*[!0-9]*) echo "run.sh: --runs wants a number, not '$RUNS'" >&2; exit 2 ;; esac
    [ "$RUNS" -ge 3 ] || { echo "run.sh: --runs $RUNS: a median needs at least 3" >&2; exit 2; }
    [ "$(id -u)" = 0 ] || { echo "run.sh: must run as root (mounts, chroot, containers)" >&2; exit 2; }
    # A packed kit (`tar czf kit.tar.gz -C target gpu-kit`, what travels to a GPU host) is
    # unpacked into a scratch of its own, removed at the end.
    S=$(mktemp -d /var/tmp/nspawn-lifecycle-gpu.XXXXXX) || exit 2
    made_link=""
    cleanup() { [ -z "$made_link" ] || rm -f "$KIT_LINK"; rm -rf "$S"; }
    trap cleanup EXIT
    if [ -f "$KIT" ]; then
        mkdir "$S/kit"
        tar -xf "$KIT" -C "$S/kit" 2>/dev/null || { echo "run.sh: --kit: $KIT is neither a directory nor a tar archive" >&2; exit 2; }
        top=("$S"/kit/*)
        [ ${#top[@]} = 1 ] && [ -d "${top[0]}" ] || { echo "run.sh: --kit: $KIT holds more than the one kit directory" >&2; exit 2; }
        KIT=${top[0]}
    fi
    abs=$(cd "$KIT" 2>/dev/null && pwd) || { echo "run.sh: --kit: no directory '$KIT'" >&2; exit 2; }
    KIT=$abs
    for f in MANIFEST runc-template.json image/cuda-probe bin/nspawn-lifecycle-helper \
        bin/nspawn-lifecycle-helper-fp bin/cdi_inject bin/nvidia-ctk bin/nvidia-cdi-hook bin/runc \
        lib/ld-linux-x86-64.so.2; do
        [ -e "$KIT/$f" ] || { echo "run.sh: $KIT is not a kit: no $f (tests/gpu/kit.sh builds one)" >&2; exit 2; }
    done

    # A GPU, or one line saying why not.
    smi=$(command -v nvidia-smi || true)
    for c in /usr/local/nvidia/bin/nvidia-smi /usr/bin/nvidia-smi; do
        [ -n "$smi" ] || { [ -x "$c" ] && smi=$c; }
    done
    why=""
    if [ ! -r /proc/driver/nvidia/version ]; then
        why="no NVIDIA kernel driver (/proc/driver/nvidia/version is missing)"
    elif [ -z "$smi" ]; then
        why="no nvidia-smi on PATH, in /usr/local/nvidia/bin or /usr/bin"
    elif ! "$smi" -L 2>/dev/null | grep -q '^GPU [0-9]'; then
        why="nvidia-smi -L lists no GPU"
    fi
    if [ -n "$why" ]; then
        echo "run.sh: no NVIDIA GPU on this host ($why): the GPU proof was not run"
        exit 3
    fi

    if ! err=$(unshare -m --propagation private true 2>&1); then
        echo "run.sh: no private mount namespace here (unshare -m: $err): root with CAP_SYS_ADMIN is needed" >&2
        exit 2
    fi
    mkdir -p "$EVIDENCE" || exit 2
    EVIDENCE=$(cd "$EVIDENCE" && pwd)
    if [ -L "$KIT_LINK" ] && [ ! -e "$KIT_LINK" ]; then
        rm -f "$KIT_LINK"   # left by a run that was killed: its kit is gone
    elif [ -e "$KIT_LINK" ] || [ -L "$KIT_LINK" ]; then
        echo "run.sh: $KIT_LINK exists (another run.sh is running?); not touching it" >&2; exit 2
    fi
    ln -s "$KIT" "$KIT_LINK" && made_link=1
    rc=0
    unshare -m --propagation private "$0" --inner "$KIT" "$EVIDENCE" "$S" "$RUNS" "$smi" || rc=$?
    exit $rc
fi

# ---- inside a private mount namespace ------------------------------------------------------------
KIT=$2 E=$3 S=$4 RUNS=$5 SMI=$6
H=$KIT/bin/nspawn-lifecycle-helper
HFP=$KIT/bin/nspawn-lifecycle-helper-fp
CTK=$KIT/bin/nvidia-ctk
passed=0 failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
# ok NAME EVIDENCE-FILE CMD...: run CMD with its output in EVIDENCE-FILE; one line either way.
ok() {
    local name=$1 log=$2
    shift 2
    local rc=0
    "$@" >"$log" 2>&1 || rc=$?
    if [ $rc = 0 ]; then pass "$name"; return 0; fi
    fail "$name (exit $rc; $(tail -3 "$log" | tr '\n' ' ' | cut -c1-300))"
    return 1
}
finish() {
    echo "$passed passed, $failed failed" | tee "$E/summary.txt"
    [ "$failed" = 0 ]
    exit $?
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "kernel: $(uname -srm)"
    echo "driver: $(head -1 /proc/driver/nvidia/version)"
    "$SMI" --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total --format=csv
    echo "kit:"; head -6 "$KIT/MANIFEST"
} >"$E/host.txt" 2>&1
sed -n 's/^/HOST /p' "$E/host.txt"

# 1. Discovery beside nvidia-smi and nvidia-ctk's nvml mode.
"$SMI" -q >"$E/nvidia-smi-q.txt" 2>&1
"$SMI" -L >"$E/nvidia-smi-L.txt" 2>&1
mapfile -t UUIDS < <(sed -n 's/.*(UUID: \(GPU-[0-9a-fA-F-]*\)).*/\1/p' "$E/nvidia-smi-L.txt")
ok "discover --json on the host" "$E/discover.err" sh -c '"$1" discover --json >"$2"' sh "$H" "$E/discover.json"
"$H" discover >"$E/discover.txt" 2>&1
ok "nvidia-ctk cdi generate --mode=nvml on the host" "$E/nvidia-ctk-nvml.log" \
    "$CTK" cdi generate --mode=nvml --format=json --nvidia-cdi-hook-path="$KIT_LINK/bin/nvidia-cdi-hook" \
    --output="$E/nvidia-ctk-nvml.json"
if [ -s "$E/discover.json" ] && [ -s "$E/nvidia-ctk-nvml.json" ]; then
    python3 "$HERE/compare.py" "$E/discover.json" "$E/nvidia-smi-q.txt" "$E/nvidia-ctk-nvml.json" >"$E/compare.txt" 2>&1
    cat "$E/compare.txt"
    passed=$((passed + $(grep -c '^PASS' "$E/compare.txt")))
    failed=$((failed + $(grep -c '^FAIL' "$E/compare.txt")))
    grep -q '^PASS\|^FAIL' "$E/compare.txt" || fail "compare.py printed no check: $(tail -2 "$E/compare.txt")"
else
    fail "discover and nvidia-ctk compared (one of them has no output)"
fi

# 2. install, pre-start and post-start for a machine on disk, on a view of this host.
if ! host_view "$S" 2>"$E/host-view.err"; then
    fail "a writable view of this host under $S (mounts): $(tail -2 "$E/host-view.err" | tr '\n' ' ')"
    finish
fi
HR=$S/host
M=$HR/var/lib/machines/$MACHINE
mkdir -p "$(dirname "$M")" && cp -a "$KIT/image" "$M"
mkdir -p "$M/var" && ln -sfn ../run "$M/var/run"
ok "install $MACHINE (on the view of this host)" "$E/install.txt" "$H" --host-root "$HR" install "$MACHINE"
ok "pre-start $MACHINE" "$E/pre-start.txt" "$H" --host-root "$HR" nspawn-lifecycle pre-start "$MACHINE"
NSPAWN=$HR/etc/systemd/nspawn/$MACHINE.nspawn
cp "$NSPAWN" "$E/$MACHINE.nspawn" 2>/dev/null || fail "pre-start wrote no $NSPAWN"
for minor in $(sed -n 's/^ *Minor Number *: *\([0-9]*\)$/\1/p' "$E/nvidia-smi-q.txt"); do
    grep -qx "Bind=/dev/nvidia$minor" "$E/$MACHINE.nspawn" 2>/dev/null &&
        pass "the .nspawn file binds /dev/nvidia$minor" || fail "the .nspawn file does not bind /dev/nvidia$minor"
done
grep -q '^BindReadOnly=.*:/run/nvidia/driver$' "$E/$MACHINE.nspawn" 2>/dev/null &&
    pass "the .nspawn file binds the driver tree at /run/nvidia/driver" ||
    fail "the .nspawn file binds no driver tree at /run/nvidia/driver"
if ! machine_view "$M" 2>"$E/machine-view.err" || ! nspawn_binds "$NSPAWN" "$HR" "$M" >"$E/binds.txt" 2>&1; then
    fail "the machine's binds, made as systemd-nspawn makes them: $(tail -2 "$E/machine-view.err" "$E/binds.txt" | tr '\n' ' ')"
    finish
fi
ok "post-start's plan and executor wire the machine (rewire-root)" "$E/post-start.txt" \
    "$HFP" --host-root "$HR" rewire-root "$MACHINE" --machine-root "$M"
[ -L "$M/usr/bin/nvidia-smi" ] && pass "the machine has /usr/bin/nvidia-smi -> $(readlink "$M/usr/bin/nvidia-smi")" ||
    fail "the machine has no /usr/bin/nvidia-smi link"
chroot "$M" /sbin/ldconfig -p >"$E/machine-ldconfig-p.txt" 2>&1
grep -q 'libcuda\.so\.1 ' "$E/machine-ldconfig-p.txt" && pass "the machine's loader cache lists libcuda.so.1" ||
    fail "the machine's loader cache lacks libcuda.so.1"
spec=$(ls "$M"/run/cdi/*.json "$M"/etc/cdi/*.json 2>/dev/null | head -1)
if [ -n "$spec" ]; then
    cp "$spec" "$E/cdi-ours.json"
    "$CTK" cdi list --spec-dir "$(dirname "$spec")" >"$E/nvidia-ctk-list-ours.txt" 2>&1
    for u in "${UUIDS[@]}" all; do
        grep -q "=$u\$" "$E/nvidia-ctk-list-ours.txt" && pass "nvidia-ctk lists our device nvidia.com/gpu=$u" ||
            fail "nvidia-ctk does not list nvidia.com/gpu=$u in our spec"
    done
else
    fail "post-start wrote no CDI spec in the machine (/var/run/cdi, /etc/cdi)"
fi

# 3. The GPU Operator's validator checks, both views.
for view in / /run/nvidia/driver; do
    log=$E/chroot$(echo "$view" | tr / -)-nvidia-smi.txt
    chroot "$M$view" nvidia-smi >"$log" 2>&1; rc=$?
    chroot "$M$view" nvidia-smi -L >>"$log" 2>&1 || rc=$?
    missing=$(for u in "${UUIDS[@]}"; do grep -q "$u" "$log" || echo "$u"; done)
    if [ $rc = 0 ] && [ -z "$missing" ]; then
        pass "chroot <machine>$view nvidia-smi lists every GPU"
    else
        fail "chroot <machine>$view nvidia-smi (exit $rc, missing ${missing:-none}): $(tail -2 "$log" | tr '\n' ' ')"
    fi
done

# 4. CUDA in containers: ours in the machine, NVIDIA's on the host.
smi_in() { python3 -c 'import json,sys
s=json.load(open(sys.argv[1]))
e=[s.get("containerEdits") or {}]+[d.get("containerEdits") or {} for d in s["devices"]]
print(next((m["containerPath"] for x in e for m in x.get("mounts") or [] if m["containerPath"].endswith("/nvidia-smi")), "/usr/bin/nvidia-smi"))' "$1"; }
# prepare WHERE SPEC-DIR NAME ARGS_JSON: a bundle for one container, our spec or NVIDIA's applied
# to its config by the CDI library (what a CDI runtime does before it calls runc), or none.
# WHERE is "machine" (runc in the machine, from the machine's spec dir) or "host". Sets RUN_IN,
# BUNDLE, STATE for launch.
prepare() {
    local where=$1 specs=$2 name=$3 args=$4
    # In the machine: its own /var/lib and /run. On the host: the scratch only.
    if [ "$where" = machine ]; then RUN_IN=$M BUNDLE=/var/lib/gpuproof/$name STATE=/run/gpuproof-runc
    else RUN_IN="" BUNDLE=$S/bundles/$name STATE=$S/runc-state; fi
    bundle "$RUN_IN$BUNDLE" "$args" || return 1
    if [ -n "$specs" ]; then
        ${RUN_IN:+chroot "$RUN_IN"} "$KIT_LINK/bin/cdi_inject" --spec-dir "$specs" --device nvidia.com/gpu=all \
            "$BUNDLE/template.json" "$BUNDLE/config.json"
    else
        mv "$RUN_IN$BUNDLE/template.json" "$RUN_IN$BUNDLE/config.json"
    fi
}
# launch NAME: runc creates, starts and waits for the prepared container; its output on stdout.
launch() {
    ${RUN_IN:+chroot "$RUN_IN"} "$KIT_LINK/bin/runc" --root "$STATE" run -b "$BUNDLE" "gpuproof-$1"
}
container() { prepare "$@" && launch "$3"; }
mkdir -p "$S/nvidia-cdi" && cp "$E/nvidia-ctk-nvml.json" "$S/nvidia-cdi/nvidia.json" 2>/dev/null
# Our spec's directory as the machine sees it (the default when post-start wrote none: the
# containers then fail, each saying so).
ours_dir=/var/run/cdi
[ -z "${spec:-}" ] || ours_dir=$(dirname "${spec#"$M"}")
for side in ours nvidia; do
    if [ $side = ours ]; then where=machine dir=$ours_dir; sp=$E/cdi-ours.json
    else where=host dir=$S/nvidia-cdi; sp=$E/nvidia-ctk-nvml.json; fi
    log=$E/container-$side-cuda.txt
    container $where "$dir" "$side-cuda" '["/cuda-probe"]' >"$log" 2>&1
    grep -q "^CUDA-PROBE OK ${#UUIDS[@]}\$" "$log" &&
        pass "$side spec: a CUDA kernel ran and checked out on every GPU in a container ($(grep -c 'kernel OK' "$log") GPUs)" ||
        fail "$side spec: CUDA in a container: $(tail -3 "$log" | tr '\n' ' ' | cut -c1-300)"
    log=$E/container-$side-nvidia-smi.txt
    container $where "$dir" "$side-smi" "[\"$(smi_in "$sp" 2>/dev/null)\", \"-L\"]" >"$log" 2>&1
    missing=$(for u in "${UUIDS[@]}"; do grep -q "$u" "$log" || echo "$u"; done)
    [ -z "$missing" ] && pass "$side spec: nvidia-smi -L in a container lists every GPU" ||
        fail "$side spec: nvidia-smi -L in a container: $(tail -3 "$log" | tr '\n' ' ' | cut -c1-300)"
done

# 5. Creation cost: no-op containers, interleaved (none, ours, NVIDIA's), RUNS each.
: >"$E/cost-raw.txt"
for _ in $(seq 1 "$RUNS"); do
    for side in none ours nvidia; do
        case $side in
            none) where=machine dir="" ;;
            ours) where=machine dir=$ours_dir ;;
            nvidia) where=host dir=$S/nvidia-cdi ;;
        esac
        # Only runc's run is timed (create, hooks, start, wait, delete): the bundle and the
        # injection are what the engine does before, the same for every run.
        if prepare $where "$dir" "noop-$side" '["/cuda-probe", "noop"]' >>"$E/cost-log.txt" 2>&1 &&
            t0=$(now_us) && launch "noop-$side" >>"$E/cost-log.txt" 2>&1; then
            echo "$side $(( $(now_us) - t0 ))" >>"$E/cost-raw.txt"
        else
            echo "$side failed" >>"$E/cost-raw.txt"
        fi
    done
done
python3 - "$E/cost-raw.txt" "$RUNS" >"$E/cost.txt" <<'EOF'
import statistics, sys
runs = {}
bad = 0
for line in open(sys.argv[1]):
    side, v = line.split()
    if v == "failed":
        bad += 1
        continue
    runs.setdefault(side, []).append(int(v) / 1000)
med = {s: statistics.median(v) for s, v in runs.items()}
print("| spec | runs | median ms | over none ms |")
print("|---|---|---|---|")
for s in ("none", "ours", "nvidia"):
    if s in med:
        print(f"| {s} | {len(runs[s])} | {med[s]:.1f} | {med[s] - med.get('none', 0):+.1f} |")
if bad or any(len(runs.get(s, [])) != int(sys.argv[2]) for s in ("none", "ours", "nvidia")):
    print(f"INCOMPLETE: {bad} creations failed")
EOF
cat "$E/cost.txt"
grep -q INCOMPLETE "$E/cost.txt" && fail "creation cost: some no-op containers failed (cost-log.txt)" ||
    pass "creation cost measured: $RUNS no-op containers each with our spec, NVIDIA's and none"
finish
