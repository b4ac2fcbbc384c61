# shellcheck shell=bash
# Scenario 17 (issue 11 "a driver root NVIDIA's tools accept in both views", issue 16 item 7):
# NVIDIA's own `nvidia-ctk cdi generate --mode=management` is the oracle. Inside the machine,
# against --driver-root=/run/nvidia/driver, it must list every library, binary and firmware file
# our discovery lists, at their standard paths, each found inside the driver root; and the same
# from a mount namespace where the driver root is bound at /driver-root, the original path is
# covered and /run/host-nvidia is absent (what the device plugin and GPU Operator pods see).
# Lists are compared, not exit codes: nvidia-ctk found 0 libraries, silently, in the driver root
# of absolute links the helper built before.
# Then nvidia-smi is on the machine's PATH, and its link goes when the GPUs go.
#
# nvidia-ctk comes from ../shared/tools/nvidia-container-toolkit/ (or $E2E_NVIDIA_CTK), copied
# into the machine's /usr/local/lib/e2e-oracle for this scenario only and removed at its end.
scenario "driver root: nvidia-ctk finds every driver file, in the machine and at /driver-root" --needs-helper
baseline

CTK_SRC=${E2E_NVIDIA_CTK:-$E2E_SRC/../../../shared/tools/nvidia-container-toolkit/nvidia-ctk}
ORACLE=/usr/local/lib/e2e-oracle
DR=/run/nvidia/driver
if [ ! -x "$CTK_SRC" ]; then
    fail "$(c nvidia-ctk-present)" "no nvidia-ctk at $CTK_SRC (set E2E_NVIDIA_CTK)"
    exit 0
fi
mkdir -p "$(mroot kube1)$ORACLE" && cp "$CTK_SRC" "$(mroot kube1)$ORACLE/nvidia-ctk"
pass "$(c nvidia-ctk-present)"

# ---- what our discovery lists, as standard paths ---------------------------------------------
disc=$(helper discover --json 2>/dev/null)
fw_files=$(H sh -c "cd /lib/firmware/nvidia/$DRIVER_VERSION 2>/dev/null && ls")
want=$(python3 -c '
import json, sys
d = json.loads(sys.argv[1])["driver"]
for l in d["libDirs"]:
    for f in l["files"]:
        print("/usr/lib/%s/%s" % (l["triplet"], f["name"]))
for b in d["binaries"]:
    print("/usr/bin/" + b.rsplit("/", 1)[1])
for f in sys.argv[2].split():
    print("/lib/firmware/nvidia/%s/%s" % (d["version"], f))
' "$disc" "$fw_files" 2>&1)
info "discovery lists $(printf '%s\n' "$want" | grep -c .) driver files"
assert_match "$(c discovery-lists-libcuda)" "/usr/lib/x86_64-linux-gnu/libcuda\.so\.$DRIVER_VERSION" "$want"

# compare <name> <driver root as nvidia-ctk saw it> <spec json>: every file of $want is a mount
# of the spec at its standard path, its hostPath inside the driver root.
compare() {
    local name=$1 root=$2 spec=$3 out line
    out=$(python3 -c '
import json, sys
root, want = sys.argv[1], [w for w in sys.argv[3].splitlines() if w]
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
missing = [w for w in want if w not in mounts]
print(("BAD every-driver-file-listed: %d of %d missing: %s" % (len(missing), len(want), " ".join(missing[:12])))
      if missing else "OK every-driver-file-listed")
outside = ["%s <- %s" % (w, mounts[w]) for w in want if w in mounts
           and not (mounts[w] == root + w or mounts[w].startswith(root + "/"))]
print(("BAD host-paths-inside-the-driver-root: %s" % " ".join(outside[:8])) if outside
      else "OK host-paths-inside-the-driver-root")
' "$root" "$spec" "$want" 2>&1)
    while IFS= read -r line; do
        case "$line" in
            "OK "*)   pass "$(c "$name.${line#OK }")";;
            "BAD "*)  line=${line#BAD }; fail "$(c "$name.${line%%:*}")" "${line#*: }";;
            "INFO "*) info "$name: ${line#INFO }";;
            *)        info "$name: $line";;
        esac
    done <<< "$out"
}

# ---- in the machine --------------------------------------------------------------------------
assert_cmd "$(c no-host-nvidia-in-machine)" M test ! -e /run/host-nvidia
info "firmware in the driver root: $(M ls "$DR/lib/firmware/nvidia/$DRIVER_VERSION" 2>&1 | tr '\n' ' ')"
spec=$(M "$ORACLE/nvidia-ctk" --debug cdi generate --mode=management --driver-root="$DR" \
    --dev-root=/ --format=json 2>/tmp/e2e-s17-ctk.err); rc=$?
info "nvidia-ctk in the machine: rc=$rc; $(grep -i 'driver version\|gsp' /tmp/e2e-s17-ctk.err | cut -c1-200 | tr '\n' ' ')"
compare machine "$DR" "$spec"

# ---- as a pod sees it: the driver root bound at /driver-root, the original covered ------------
# unshare -m in the machine: a private mount namespace of the machine's; /run/nvidia is covered
# with an empty tmpfs after the rbind, so nothing can resolve through the original path.
spec=$(M unshare -m --propagation private /bin/sh -c '
    set -e
    mkdir -p /driver-root
    mount --rbind /run/nvidia/driver /driver-root
    mount -t tmpfs e2e-empty /run/nvidia
    test ! -e /run/host-nvidia
    test ! -e /run/nvidia/driver
    '"$ORACLE"'/nvidia-ctk --debug cdi generate --mode=management --driver-root=/driver-root \
        --dev-root=/ --format=json' 2>/tmp/e2e-s17-ctk.err); rc=$?
info "nvidia-ctk at /driver-root: rc=$rc; $(grep -i 'driver version\|gsp' /tmp/e2e-s17-ctk.err | cut -c1-200 | tr '\n' ' ')"
M rmdir /driver-root 2>/dev/null
compare driver-root /driver-root "$spec"

# ---- issue 16 item 7: the driver's tools on the machine's PATH ---------------------------------
assert_match "$(c nvidia-smi-on-path)" "Driver Version: $DRIVER_VERSION" \
    "$(M /bin/sh -c 'command -v nvidia-smi && nvidia-smi' 2>&1)"
assert_match "$(c machinectl-shell-nvidia-smi)" "Driver Version: $DRIVER_VERSION" \
    "$(H timeout 30 machinectl shell -q kube1 /bin/sh -lc nvidia-smi </dev/null 2>&1)"
assert_eq "$(c nvidia-smi-link-into-driver-root)" "$DR/usr/bin/nvidia-smi" "$(M readlink /usr/bin/nvidia-smi 2>&1)"

fake_gpus 0
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-0-gpus)" 0 "$rc"
assert_cmd "$(c machine-up-0-gpus)" wait_machine_up kube1 60
assert_cmd "$(c nvidia-smi-link-gone-with-the-gpus)" M test ! -e /usr/bin/nvidia-smi
assert_cmd "$(c driver-root-gone-with-the-gpus)" M test ! -e "$DR"

# ---- back to the baseline ----------------------------------------------------------------------
rm -rf "$(mroot kube1)$ORACLE"
fake_gpus "$E2E_GPUS"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-back)" 0 "$rc"
assert_cmd "$(c machine-up-again)" wait_machine_up kube1 60
