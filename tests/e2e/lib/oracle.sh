# shellcheck shell=bash
# NVIDIA's own nvidia-ctk as the oracle of a machine's driver root (issue 11), shared by scenarios
# 17 (stand-in driver) and 18 (real Debian-packaged driver). Sourced by a scenario; uses its
# helpers (M, H, c, pass, fail, info, mroot, helper).
#
# nvidia-ctk comes from $E2E_NVIDIA_CTK, or as tests/lib/nvidia-tools.sh finds it, copied into
# the machine's /usr/local/lib/e2e-oracle for the scenario only (oracle_remove takes it out).

# shellcheck source=../../lib/nvidia-tools.sh
. "$E2E_SRC/../lib/nvidia-tools.sh"

ORACLE=/usr/local/lib/e2e-oracle
ORACLE_DR=/run/nvidia/driver

# oracle_install <machine>: copy nvidia-ctk into the machine; fails the check when it is missing.
oracle_install() { oracle_install_in "$(mroot "$1")"; }
# oracle_install_in <root dir>: the same into any root seen from outside (scenario 23: the host
# container's, "$RUN/host"); inside that root it is $ORACLE/nvidia-ctk.
oracle_install_in() {
    local src=${E2E_NVIDIA_CTK:-} why
    if [ -z "$src" ] && ! src=$(nvidia_tool nvidia-ctk 2>&1); then why=$src; src=""; fi
    if [ -z "$src" ] || [ ! -x "$src" ]; then
        fail "$(c nvidia-ctk-present)" "${why:-no nvidia-ctk at $src (E2E_NVIDIA_CTK)}"
        return 1
    fi
    mkdir -p "$1$ORACLE" && cp "$src" "$1$ORACLE/nvidia-ctk"
    pass "$(c nvidia-ctk-present)"
}

oracle_remove() { rm -rf "$(mroot "$1")$ORACLE"; }

# oracle_want: every driver file our discovery lists on the host, as its standard path.
oracle_want() {
    local disc ver fw_files
    disc=$(helper discover --json 2>/dev/null)
    ver=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["driver"]["version"])' "$disc" 2>/dev/null)
    fw_files=$(H sh -c "cd /lib/firmware/nvidia/$ver 2>/dev/null && ls")
    python3 -c '
import json, sys
d = json.loads(sys.argv[1])["driver"]
for l in d["libDirs"]:
    for f in l["files"]:
        print("/usr/lib/%s/%s" % (l["triplet"], f["name"]))
for b in d["binaries"]:
    print("/usr/bin/" + b.rsplit("/", 1)[1])
for f in sys.argv[2].split():
    print("/lib/firmware/nvidia/%s/%s" % (d["version"], f))
' "$disc" "$fw_files" 2>&1
}

# oracle_compare <name> <driver root as nvidia-ctk saw it> <spec json> <want>: every file of
# <want> is a mount of the spec at its standard path, its hostPath inside the driver root; except
# the file names in $ORACLE_KNOWN_GAPS, which nvidia-ctk's management mode is known not to mount
# (tests/README.md, "Real driver files": the table of differences, each explained).
oracle_compare() {
    local name=$1 root=$2 spec=$3 want=$4 out line
    out=$(python3 -c '
import json, sys
root, want = sys.argv[1], [w for w in sys.argv[3].splitlines() if w]
known = set(sys.argv[4].split())
try:
    spec = json.loads(sys.argv[2])
except ValueError as e:
    print("BAD spec-json: %s: %r" % (e, sys.argv[2][:300])); sys.exit(0)
mounts = {}
edits = [spec.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in spec.get("devices", [])]
for e in edits:
    for m in e.get("mounts", []):
        mounts[m.get("containerPath")] = m.get("hostPath", "")
libs = [p for p in mounts if "/lib/" in p and ".so" in p]
print("INFO %d mounts, %d libraries" % (len(mounts), len(libs)))
gaps = [w for w in want if w not in mounts and w.rsplit("/", 1)[1] in known]
if gaps:
    print("INFO not mounted by nvidia-ctk, as documented: %s" % " ".join(gaps))
missing = [w for w in want if w not in mounts and w not in gaps]
print(("BAD every-driver-file-listed: %d of %d missing: %s" % (len(missing), len(want), " ".join(missing[:12])))
      if missing else "OK every-driver-file-listed")
outside = ["%s <- %s" % (w, mounts[w]) for w in want if w in mounts
           and not (mounts[w] == root + w or mounts[w].startswith(root + "/"))]
print(("BAD host-paths-inside-the-driver-root: %s" % " ".join(outside[:8])) if outside
      else "OK host-paths-inside-the-driver-root")
' "$root" "$spec" "$want" "${ORACLE_KNOWN_GAPS:-}" 2>&1)
    while IFS= read -r line; do
        case "$line" in
            "OK "*)   pass "$(c "$name.${line#OK }")";;
            "BAD "*)  line=${line#BAD }; fail "$(c "$name.${line%%:*}")" "${line#*: }";;
            "INFO "*) info "$name: ${line#INFO }";;
            *)        info "$name: $line";;
        esac
    done <<< "$out"
}

# oracle_both_views <want>: nvidia-ctk in the machine (kube1) against the driver root, and from a
# mount namespace where the driver root is bound at /driver-root, the original path covered and
# /run/host-nvidia absent (what the device plugin and GPU Operator pods see). Lists are compared,
# not exit codes: nvidia-ctk found 0 libraries, silently, in the driver root of absolute links the
# helper built before.
oracle_both_views() {
    local want=$1 spec rc
    spec=$(M "$ORACLE/nvidia-ctk" --debug cdi generate --mode=management --driver-root="$ORACLE_DR" \
        --dev-root=/ --format=json 2>/tmp/e2e-oracle-ctk.err); rc=$?
    info "nvidia-ctk in the machine: rc=$rc; $(grep -i 'driver version\|gsp' /tmp/e2e-oracle-ctk.err | cut -c1-200 | tr '\n' ' ')"
    oracle_compare machine "$ORACLE_DR" "$spec" "$want"
    # unshare -m in the machine: a private mount namespace of the machine's; /run/nvidia is
    # covered with an empty tmpfs after the rbind, so nothing can resolve through the original path.
    spec=$(M unshare -m --propagation private /bin/sh -c '
        set -e
        mkdir -p /driver-root
        mount --rbind /run/nvidia/driver /driver-root
        mount -t tmpfs e2e-empty /run/nvidia
        test ! -e /run/host-nvidia
        test ! -e /run/nvidia/driver
        '"$ORACLE"'/nvidia-ctk --debug cdi generate --mode=management --driver-root=/driver-root \
            --dev-root=/ --format=json' 2>/tmp/e2e-oracle-ctk.err); rc=$?
    info "nvidia-ctk at /driver-root: rc=$rc; $(grep -i 'driver version\|gsp' /tmp/e2e-oracle-ctk.err | cut -c1-200 | tr '\n' ' ')"
    M rmdir /driver-root 2>/dev/null
    oracle_compare driver-root /driver-root "$spec" "$want"
}

# oracle_gpu_operator <name> <driver root> [systemd-run property…]: what NVIDIA's GPU Operator
# runs on a driver root, in the order its code runs it (validator and MIG manager: chroot
# <root> nvidia-smi; then nvidia-ctk system create-device-nodes --control-devices; then cdi
# generate --mode=management | cdi transform root to the machine's path of that root), each in a
# transient unit of the machine with the given properties (a pod's view: the root bound
# elsewhere). The dev root is the machine's / (the driver root has no dev/, which is how the
# validator's GetDevRoot decides), on a tmpfs of the unit's own, with NVIDIA's majors in the
# unit's /proc/devices (the rig has no kernel module): nothing of the machine changes. NVIDIA's
# real nvidia-smi must run and fail only for want of the kernel driver.
oracle_gpu_operator() {
    local name=$1 root=$2 out to=$2 p; shift 2
    [ "$root" = /driver-root ] && to=$ORACLE_DR
    local run=(H systemd-run -M "$MACHINE" --wait --pipe --quiet --collect "$@" --)
    for args in "" -L; do
        out=$("${run[@]}" chroot "$root" nvidia-smi $args </dev/null 2>&1)
        assert_match "$(c "$name.chroot-nvidia-smi$args")" "couldn't communicate with the NVIDIA driver" "$out"
    done
    # The majors of the machine's own nodes (the ones its device policy allows).
    local ctl uvm
    ctl=$(M stat -c %t /dev/nvidiactl 2>/dev/null) uvm=$(M stat -c %t /dev/nvidia-uvm 2>/dev/null)
    printf 'Character devices:\n%d nvidia\n%d nvidia-uvm\n\nBlock devices:\n' \
        "0x${ctl:-0}" "0x${uvm:-0}" > "$(mroot)$ORACLE/proc-devices"
    local devrun=(H systemd-run -M "$MACHINE" --wait --pipe --quiet --collect "$@"
        -p TemporaryFileSystem=/dev -p BindReadOnlyPaths="$ORACLE/proc-devices:/proc/devices" --)
    out=$("${devrun[@]}" /bin/bash -c '
        set -o pipefail
        "$0/nvidia-ctk" system create-device-nodes --control-devices --driver-root="$1" --dev-root=/ \
            >/tmp/nodes.log 2>&1 || { echo "NODES-FAILED"; cat /tmp/nodes.log; exit 1; }
        ls /dev | sed "s/^/NODE /"
        "$0/nvidia-ctk" cdi generate --mode=management --driver-root="$1" --dev-root=/ --format=json \
            --vendor=management.nvidia.com --class=gpu 2>/tmp/gen.log \
        | sed "s/^{\"cdiVersion\":\"0\.3\.0\"/{\"cdiVersion\":\"0.5.0\"/" \
        | "$0/nvidia-ctk" cdi transform root --from="$1" --to="$2" 2>>/tmp/gen.log \
        || { echo "GENERATE-FAILED"; tail -5 /tmp/gen.log; exit 1; }' \
        "$ORACLE" "$root" "$to" </dev/null 2>&1)
    assert_no_match "$(c "$name.create-device-nodes")" "NODES-FAILED" "$out"
    assert_match "$(c "$name.control-nodes-made")" "^NODE nvidiactl$" "$out"
    assert_no_match "$(c "$name.cdi-generate-transform")" "GENERATE-FAILED" "$out"
    local paths missing=""
    paths=$(printf '%s\n' "$out" | sed -n 's/^[ -]*hostPath: //p' | grep -v '^/dev/')
    info "$name: the validator's spec names $(printf '%s\n' "$paths" | grep -c .) files"
    for p in $paths; do M test -e "$p" || missing="$missing $p"; done
    assert_cmd "$(c "$name.spec-has-files")" test "$(printf '%s\n' "$paths" | grep -c .)" -gt 10
    assert_eq "$(c "$name.spec-paths-exist")" "" "$missing"
}
