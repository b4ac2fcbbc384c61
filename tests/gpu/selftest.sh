#!/bin/bash
# What of the GPU proof (tests/gpu/run.sh) runs on a host with no GPU, as .ci/run runs it:
#
#   selftest.sh KIT     KIT built by tests/gpu/kit.sh (which has already assembled the CUDA
#                       probe's kernel with NVIDIA's ptxas)
#
#  - run.sh's argument handling (exit 2, naming the culprit) and, on this host, its one line
#    "no NVIDIA GPU on this host …" with exit 3, leaving nothing behind;
#  - the kit: its relinked runc runs through the kit link, the probe runs in the image;
#  - run.sh's plumbing (tests/gpu/lib.sh) on this host: the writable view of the host (a write
#    into it never reaches the host), install + pre-start + post-start's `rewire-root` for a
#    machine on disk (no GPU: the machine gets none of NVIDIA's state), the machine's binds made
#    from the .nspawn file, real runc in the machine running the probe in a container of the
#    kit's image (which finds no libcuda.so.1 here, and says so), and the official CDI library
#    applying our CDI spec (tests/golden/cdi-1gpu.json) to the runtime config in the machine;
#  - run.sh's checks with a stand-in nvidia-smi on this host as it is (each runs to a verdict),
#    and on this host made to look like a two-GPU host with NVIDIA's real 550.163.01 userspace
#    and no kernel module (tests/gpu/simulate.sh): every check up to the kernel's answer passes,
#    a container from our spec loads libcuda.so.1 and reaches cuInit, nvidia-smi runs in one.
# Prints one line per check and "N passed, M failed" last; the GPU checks themselves are not run
# here, and the last line says so.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
[ $# = 1 ] || [ "${2:-}" = --inner ] || { echo "usage: selftest.sh KIT" >&2; exit 2; }
KIT=$(cd "$1" && pwd) || exit 2
# standin_smi FILE VERSION BUS=UUID...: an nvidia-smi that answers -L and -q (the lines run.sh
# and compare.py read) for those GPUs, minors in order, and one CSV line for anything else.
standin_smi() {
    local file=$1 version=$2 i=0 g list="" query
    shift 2
    query="Driver Version : $version\n"
    for g in "$@"; do
        list+="GPU $i: NVIDIA L4 (UUID: ${g#*=})\n"
        query+="GPU 0000${g%%=*}\n    Product Name : NVIDIA L4\n    GPU UUID : ${g#*=}\n    Minor Number : $i\n"
        i=$((i + 1))
    done
    printf '#!/bin/sh\ncase $1 in\n    -L) printf %%b %q ;;\n    -q) printf %%b %q ;;\n    *) echo "0, NVIDIA L4" ;;\nesac\n' \
        "$list" "$query" >"$file"
    chmod +x "$file"
}
passed=0 failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

if [ "${2:-}" != --inner ]; then
    # run.sh's arguments.
    expect() { # expect RC PATTERN ARGS...: run.sh ARGS exits RC and prints PATTERN
        local want=$1 pat=$2 out rc=0
        shift 2
        out=$("$HERE/run.sh" "$@" 2>&1) || rc=$?
        if [ "$rc" = "$want" ] && grep -q -- "$pat" <<<"$out"; then pass "run.sh $*: exit $rc, '$pat'"
        else fail "run.sh $*: exit $rc (want $want), printed: $out"; fi
    }
    ev=$(mktemp -d /tmp/gpu-selftest-ev.XXXXXX)
    expect 2 "usage: run.sh"
    expect 2 "usage: run.sh" --kit "$KIT"
    expect 2 "unknown argument '--gpu'" --kit "$KIT" --evidence "$ev" --gpu
    expect 2 "no directory '/nonexistent-kit'" --kit /nonexistent-kit --evidence "$ev"
    expect 2 "is not a kit: no MANIFEST" --kit "$HERE" --evidence "$ev"
    expect 2 "wants a number, not '1x'" --kit "$KIT" --evidence "$ev" --runs 1x
    expect 2 "needs at least 3" --kit "$KIT" --evidence "$ev" --runs 2
    printf 'not a tarball\n' >"$ev.notkit"
    expect 2 "is neither a directory nor a tar archive" --kit "$ev.notkit" --evidence "$ev"
    rm -f "$ev.notkit"
    before=$(ls -d /var/tmp/nspawn-lifecycle-gpu.* "$KIT_LINK" 2>/dev/null)
    out=$("$HERE/run.sh" --kit "$KIT" --evidence "$ev" 2>&1); rc=$?
    if [ -e /proc/driver/nvidia/version ]; then
        fail "this host has an NVIDIA driver: run tests/gpu/run.sh itself here"
    elif [ $rc = 3 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q '^run.sh: no NVIDIA GPU on this host (.*): the GPU proof was not run$' <<<"$out"; then
        pass "run.sh on this GPU-free host: exit 3, one line: $out"
    else
        fail "run.sh on this GPU-free host: exit $rc: $out"
    fi
    # The kit as it travels to a GPU host: packed. Unpacked, checked, then the same one line.
    tar czf "$ev.tgz" -C "$(dirname "$KIT")" "$(basename "$KIT")"
    out=$("$HERE/run.sh" --kit "$ev.tgz" --evidence "$ev" 2>&1); rc=$?
    [ $rc = 3 ] && grep -q '^run.sh: no NVIDIA GPU on this host' <<<"$out" &&
        pass "run.sh takes the packed kit ($(du -h "$ev.tgz" | cut -f1)): exit 3, the same line" ||
        fail "run.sh with the packed kit: exit $rc: $out"
    rm -f "$ev.tgz"
    after=$(ls -d /var/tmp/nspawn-lifecycle-gpu.* "$KIT_LINK" 2>/dev/null)
    [ "$before" = "$after" ] && [ -z "$(ls -A "$ev")" ] && pass "run.sh left nothing behind" ||
        fail "run.sh left [$after] (before [$before]), evidence [$(ls -A "$ev")]"
    rmdir "$ev"

    # The rest, as run.sh does it: the kit linked, a scratch, a private mount namespace.
    [ -e "$KIT_LINK" ] && { echo "selftest.sh: $KIT_LINK exists (a run.sh running?)" >&2; exit 1; }
    S=$(mktemp -d /var/tmp/nspawn-lifecycle-gpu.XXXXXX)
    trap 'rm -f "$KIT_LINK"; rm -rf "$S"' EXIT
    ln -s "$KIT" "$KIT_LINK"
    # run.sh's checks themselves, on this host with a stand-in for nvidia-smi (one GPU that is not
    # there): each runs to its verdict and says it, the script runs to its summary and fails.
    S2=$S/stand-in
    ev=$S/evidence
    mkdir -p "$S2/smi" "$ev"
    standin_smi "$S2/smi/nvidia-smi" 580.95.05 0000:3B:00.0=GPU-00000000-0000-4000-8000-000000000001
    rc=0
    out=$(unshare -m --propagation private "$HERE/run.sh" --inner "$KIT" "$ev" "$S2" 3 "$S2/smi/nvidia-smi" 2>&1) || rc=$?
    last=$(tail -1 <<<"$out")
    checks=$(grep -c '^PASS\|^FAIL' <<<"$out")
    if [ $rc = 1 ] && [[ $last =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]] &&
        [ $((BASH_REMATCH[1] + BASH_REMATCH[2])) = "$checks" ] && [ "$checks" -ge 18 ] &&
        grep -q '^PASS pre-start gpuproof$' <<<"$out" && grep -q '^| none | 3 |' <<<"$out" &&
        grep -q '^FAIL ours spec: CUDA in a container' <<<"$out" && [ -s "$ev/summary.txt" ]; then
        pass "run.sh's checks with a stand-in nvidia-smi: all $checks ran to a verdict, '$last', exit 1"
    else
        fail "run.sh's checks with a stand-in nvidia-smi (exit $rc, $checks checks, last '$last'):
$out"
    fi

    # The same checks on this host made to look like a two-GPU host with NVIDIA's real userspace
    # and no kernel module (simulate.sh): everything but the kernel's answer must work.
    S3=$S/simulated
    ev=$S3/evidence
    mkdir -p "$ev"
    # The GPUs of the real-driver fixture host (tests/realdriver/host.rs).
    standin_smi "$S3/nvidia-smi" 550.163.01 0000:3B:00.0=GPU-2f6d1c8e-0b7a-4e39-8c51-d4a7e9b3f120 \
        0000:86:00.0=GPU-a91e4b37-5c2d-4f08-b6e3-17c9d0f8a254
    rc=0
    out=$(unshare -m --propagation private "$HERE/simulate.sh" "$KIT" "$ev" "$S3" "$S3/nvidia-smi" 2>&1) || rc=$?
    printf '%s\n' "$out" | sed 's/^/  simulated: /'
    missing=""
    for line in "PASS discover --json on the host" "PASS install gpuproof (on the view of this host)" \
        "PASS pre-start gpuproof" "PASS the .nspawn file binds /dev/nvidia0" "PASS the .nspawn file binds /dev/nvidia1" \
        "PASS the .nspawn file binds the driver tree at /run/nvidia/driver" \
        "PASS post-start's plan and executor wire the machine (rewire-root)" \
        "PASS the machine has /usr/bin/nvidia-smi -> /run/nvidia/driver/usr/bin/nvidia-smi" \
        "PASS the machine's loader cache lists libcuda.so.1" \
        "PASS nvidia-ctk lists our device nvidia.com/gpu=GPU-2f6d1c8e-0b7a-4e39-8c51-d4a7e9b3f120" \
        "PASS nvidia-ctk lists our device nvidia.com/gpu=GPU-a91e4b37-5c2d-4f08-b6e3-17c9d0f8a254" \
        "PASS nvidia-ctk lists our device nvidia.com/gpu=all"; do
        grep -qxF "$line" <<<"$out" || missing+="[$line] "
    done
    [ $rc = 1 ] && [ -z "$missing" ] &&
        pass "simulated GPU host: install, pre-start, the machine's binds, rewire-root, links, loader cache and our CDI spec as on a GPU host" ||
        fail "simulated GPU host (exit $rc): missing ${missing:-nothing}"
    # In a container from our spec: NVIDIA's libcuda.so.1 loaded by SONAME and cuInit reached
    # (no kernel driver: 100, no device); NVIDIA's nvidia-smi ran to its driver check.
    grep -q '^libcuda.so.1 is /usr/lib/x86_64-linux-gnu/libcuda.so.1$' "$ev/container-ours-cuda.txt" &&
        grep -q '^CUDA-PROBE FAIL: cu_init(0): error 100 ' "$ev/container-ours-cuda.txt" &&
        pass "simulated GPU host: runc ran the probe from our spec: NVIDIA's libcuda.so.1 loaded, cuInit answered 'no device' (no kernel driver here)" ||
        fail "simulated GPU host, the probe from our spec: $(cat "$ev/container-ours-cuda.txt" 2>&1 | tail -3)"
    grep -q "couldn't communicate with the NVIDIA driver" "$ev/container-ours-nvidia-smi.txt" &&
        pass "simulated GPU host: NVIDIA's nvidia-smi ran in a container from our spec, to its driver check" ||
        fail "simulated GPU host, nvidia-smi from our spec: $(cat "$ev/container-ours-nvidia-smi.txt" 2>&1 | tail -3)"
    grep -q '^| ours | 3 | ' "$ev/cost.txt" && grep -q '^| none | 3 | ' "$ev/cost.txt" &&
        pass "simulated GPU host: no-op containers with our spec and none all ran (costs measured)" ||
        fail "simulated GPU host, cost table: $(cat "$ev/cost.txt" 2>&1)"

    rc=0
    unshare -m --propagation private "$0" "$KIT" --inner "$S" "$passed" "$failed" || rc=$?
    exit $rc
fi

S=$3 passed=$4 failed=$5
H=$KIT/bin/nspawn-lifecycle-helper
v=$("$KIT_LINK/bin/runc" --version 2>&1 | head -1)
[[ $v == "runc version "* ]] && pass "the kit's relinked runc runs: $v" || fail "the kit's runc: $v"
chroot "$KIT/image" /cuda-probe noop && pass "the probe runs in the kit's image" || fail "the probe does not run in the image"

if ! host_view "$S" 2>"$S/host-view.err"; then
    fail "host_view: $(cat "$S/host-view.err")"
else
    HR=$S/host
    cmp -s /etc/os-release "$HR/etc/os-release" && pass "the view of the host shows the host's files" ||
        fail "the view's /etc/os-release differs from the host's"
    marker=etc/nspawn-lifecycle-gpu-selftest.$$
    echo x >"$HR/$marker" && [ ! -e "/$marker" ] && pass "a write into the view stays in the scratch" ||
        fail "a write into the view reached the host (/$marker) or failed"
    rm -f "/$marker"
    M=$HR/var/lib/machines/$MACHINE
    mkdir -p "$(dirname "$M")" && cp -a "$KIT/image" "$M" && mkdir -p "$M/var" && ln -s ../run "$M/var/run"
    "$H" --host-root "$HR" install "$MACHINE" >"$S/install.txt" 2>&1 && pass "install $MACHINE on the view" ||
        fail "install: $(tail -2 "$S/install.txt")"
    "$H" --host-root "$HR" nspawn-lifecycle pre-start "$MACHINE" >"$S/pre.txt" 2>&1 && pass "pre-start $MACHINE on the view" ||
        fail "pre-start: $(tail -2 "$S/pre.txt")"
    NSPAWN=$HR/etc/systemd/nspawn/$MACHINE.nspawn
    if machine_view "$M" 2>"$S/mv.err" && nspawn_binds "$NSPAWN" "$HR" "$M" >"$S/binds.txt" 2>&1; then
        pass "the machine's binds from its .nspawn file ($(wc -l <"$S/binds.txt"): $(cut -d' ' -f2 "$S/binds.txt" | paste -sd' '))"
    else
        fail "machine_view/nspawn_binds: $(cat "$S/mv.err" "$S/binds.txt")"
    fi
    "$KIT/bin/nspawn-lifecycle-helper-fp" --host-root "$HR" rewire-root "$MACHINE" --machine-root "$M" >"$S/post.txt" 2>&1 &&
        pass "rewire-root $MACHINE (no GPU here)" || fail "rewire-root: $(tail -3 "$S/post.txt")"
    # A container in the machine, from the kit's image, by the kit's runc.
    b=/var/lib/gpuproof/probe
    bundle "$M$b" '["/cuda-probe"]' && mv "$M$b/template.json" "$M$b/config.json"
    out=$(chroot "$M" "$KIT_LINK/bin/runc" --root /run/gpuproof-runc run -b "$b" gpuproof-probe 2>&1)
    grep -q '^CUDA-PROBE FAIL: dlopen libcuda.so.1: libcuda.so.1: cannot open shared object file' <<<"$out" &&
        pass "runc in the machine ran the probe in a container of the image (no libcuda.so.1 here, as it must say)" ||
        fail "runc in the machine: $out"
    # The official CDI library applies our spec to the runtime config, in the machine.
    mkdir -p "$M/etc/cdi" && cp "$HERE/../golden/cdi-1gpu.json" "$M/etc/cdi/nvidia.json"
    if chroot "$M" "$KIT_LINK/bin/cdi_inject" --spec-dir /etc/cdi --device nvidia.com/gpu=all \
        "$b/config.json" "$b/injected.json" 2>"$S/inject.err"; then
        if python3 - "$M/etc/cdi/nvidia.json" "$M$b/injected.json" <<'EOF'
import json, sys
spec, cfg = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
edits = [spec["containerEdits"]] + [d["containerEdits"] for d in spec["devices"] if d["name"] == "all"]
nodes = {n["path"] for e in edits for n in e.get("deviceNodes", [])}
mounts = {m["containerPath"] for e in edits for m in e.get("mounts", [])}
hooks = [h["args"] for e in edits for h in e.get("hooks", [])]
got_nodes = {d["path"] for d in cfg["linux"].get("devices", [])}
allowed = {(d.get("major"), d.get("minor")) for d in cfg["linux"]["resources"]["devices"] if d["allow"]}
got_mounts = {m["destination"] for m in cfg["mounts"]}
got_hooks = [h["args"] for h in cfg.get("hooks", {}).get("createContainer", [])]
env = set(cfg["process"]["env"])
want_env = {v for e in edits for v in e.get("env", [])}
majmin = {(n["major"], n["minor"]) for e in edits for n in e.get("deviceNodes", [])}
assert nodes <= got_nodes, nodes - got_nodes
assert majmin <= allowed, majmin - allowed
assert mounts <= got_mounts, mounts - got_mounts
assert hooks == got_hooks, (hooks, got_hooks)
assert want_env <= env, want_env - env
print(f"{len(nodes)} nodes, {len(mounts)} mounts, {len(hooks)} hooks, {len(want_env)} env")
EOF
        then pass "the CDI library applied our spec to the runtime config in the machine"
        else fail "the injected config lacks part of our spec"; fi
    else
        fail "cdi_inject: $(cat "$S/inject.err")"
    fi
fi
echo "$passed passed, $failed failed (GPU-free parts only: the GPU checks of tests/gpu/run.sh were NOT run, this host has no GPU)"
[ "$failed" = 0 ]
