# shellcheck shell=bash
# Scenario 18 (issue 11): a REAL NVIDIA userspace driver, laid into the host as Debian's packages
# lay it (tests/realdriver/fetch.sh install deb: nvidia-graphics-drivers 550.163.01 from trixie,
# /usr/lib/x86_64-linux-gnu/nvidia/current reached through /etc/alternatives, the rest of the
# libraries straight in the multiarch directory). The fake kernel module says 550.163.01 too. After
# a restart the .nspawn file binds each real file (links resolved on the host: alternatives, then
# nvidia/current) into the driver root, and inside the machine the driver root and the CDI spec
# carry the real files, including those the old discovery missed (names without the version,
# files outside libcuda's directory), each with the host file's bytes; NVIDIA's nvidia-ctk finds
# every one of them in the driver root, in the machine and bound at /driver-root (lib/oracle.sh).
# Cleans up (fetch.sh uninstall deb, the stand-in driver back) and restarts kube1.
scenario "real driver files (Debian packages) reach the machine" --needs-helper
baseline

REAL=550.163.01
FETCH=$E2E_SRC/../realdriver/fetch.sh
ROOT=/run/nvidia/driver
LIB=/usr/lib/x86_64-linux-gnu

# Fetched (or cached) outside the timing of the machine start.
if ! out=$("$FETCH" fetch 2>&1); then
    fail "$(c fetch)" "$(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
    exit 0
fi
pass "$(c fetch)"

# The stand-in libraries out, the module at the real version, then the real files (after the
# version change: fakehw rewrites /usr/bin/nvidia-smi when one exists, and the real one wins).
remove_libs
fake_driver_version "$REAL"
if ! out=$("$FETCH" install deb "$RUN/host" 2>&1); then
    fail "$(c install-real-driver)" "$(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
else
    pass "$(c install-real-driver)"
fi
H ldconfig
assert_match "$(c host-ldcache-has-real-libcuda)" "libcuda\.so\.1 .*=> /lib/x86_64-linux-gnu/libcuda\.so\.1" \
    "$(H ldconfig -p)"

out=$(reconcile kube1 2>&1); rc=$?
info "reconcile with the real driver: rc=$rc $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
assert_eq "$(c reconcile)" 0 "$rc"
assert_cmd "$(c machine-up)" wait_machine_up kube1 120

nf=$(nspawn_file kube1)
# Issue 12: each file is a hard link in pre-start's host tree (the host file's inode), not a bind.
tree=/var/lib/nspawn-lifecycle/driver-root/kube1
assert_eq "$(c tree-links-libcuda-from-nvidia-current)" "$(H stat -c %d:%i "$LIB/nvidia/current/libcuda.so.$REAL" 2>&1)" \
    "$(H stat -c %d:%i "$tree$LIB/libcuda.so.$REAL" 2>&1)"
assert_eq "$(c tree-links-companion-from-multiarch)" "$(H stat -c %d:%i "$LIB/libnvidia-gpucomp.so.$REAL" 2>&1)" \
    "$(H stat -c %d:%i "$tree$LIB/libnvidia-gpucomp.so.$REAL" 2>&1)"
assert_no_match "$(c nspawn-binds-no-driver-file)" ":$ROOT$LIB/lib(cuda|nvidia)[^/]*\.so[^/]*\$" "$nf"
assert_match "$(c nspawn-binds-real-firmware)" "^BindReadOnly=(/usr)?/lib/firmware/nvidia/$REAL:$ROOT/lib/firmware/nvidia/$REAL\$" "$nf"
assert_no_match "$(c nspawn-binds-no-directory-of-libraries)" "^BindReadOnly=$LIB(/nvidia/current)?:" "$nf"

# Each file: in the machine's driver root at its standard path, with the host file's bytes.
same_bytes() { # same_bytes <host path> <machine path>
    local h m
    h=$(H sha256sum "$1" 2>/dev/null | cut -d' ' -f1)
    m=$(M sha256sum "$2" 2>/dev/null | cut -d' ' -f1)
    [ -n "$h" ] && [ "$h" = "$m" ]
}
for f in "libcuda.so.$REAL" "libnvidia-ml.so.$REAL" "libnvidia-ptxjitcompiler.so.$REAL" \
    "libnvidia-nvvm.so.$REAL" libnvidia-api.so.1; do
    assert_cmd "$(c "driver-root-$f")" same_bytes "$LIB/nvidia/current/$f" "$ROOT$LIB/$f"
done
for f in "libnvidia-gpucomp.so.$REAL" "libnvidia-eglcore.so.$REAL" libnvidia-egl-gbm.so.1.1.2 \
    libnvidia-egl-wayland.so.1.1.18; do
    assert_cmd "$(c "driver-root-$f")" same_bytes "$LIB/$f" "$ROOT$LIB/$f"
done
assert_cmd "$(c driver-root-nvidia-smi-is-the-real-elf)" same_bytes /usr/lib/nvidia/current/nvidia-smi "$ROOT/usr/bin/nvidia-smi"
assert_cmd "$(c driver-root-gsp-firmware)" same_bytes "/usr/lib/firmware/nvidia/$REAL/gsp_ga10x.bin" \
    "$ROOT/lib/firmware/nvidia/$REAL/gsp_ga10x.bin"
# The C runtime of the tools is in the tree too: the host's loader and C library, each a hard
# link of the host file or, where the host cannot link it as itself (this rig's root is an
# overlay whose lower layer holds glibc: a link copies the file up), a bind of it.
for f in /lib64/ld-linux-x86-64.so.2 "$LIB/libc.so.6" "$LIB/libm.so.6"; do
    assert_cmd "$(c "driver-root-c-runtime-$(basename "$f")")" same_bytes "$f" "$ROOT$f"
done
assert_cmd "$(c driver-root-ld-cache)" M test -s "$ROOT/etc/ld.so.cache"

# The CDI spec mounts the real files from the driver root, the newly found ones included.
spec=$(M cat "$CDI_SPEC" 2>/dev/null)
for f in "libcuda.so.$REAL" libnvidia-api.so.1 "libnvidia-gpucomp.so.$REAL" libnvidia-egl-gbm.so.1.1.2; do
    assert_match "$(c "cdi-mounts-$f")" "\"hostPath\": \"$ROOT$LIB/$f\"" "$spec"
done
assert_no_match "$(c cdi-no-stand-in-version)" "$DRIVER_VERSION" "$spec"
# The machine's loader finds the real libcuda by SONAME.
assert_match "$(c machine-ldcache-libcuda)" 'libcuda\.so\.1 ' "$(M ldconfig -p)"
assert_eq "$(c containerd-active)" active "$(inner_state containerd.service)"
assert_eq "$(c kubelet-active)" active "$(inner_state kubelet.service)"

# NVIDIA's nvidia-ctk finds every file our discovery lists, in the machine and at /driver-root.
# shellcheck source=../lib/oracle.sh
. "$E2E_SRC/lib/oracle.sh"
# Driver files nvidia-ctk's management mode does not mount (tests/README.md "Real driver files", the same
# table tests/realdriver.rs enforces); every other file must be listed.
ORACLE_KNOWN_GAPS="libnvidia-api.so.1 libnvidia-egl-gbm.so.1.1.2 libnvidia-egl-wayland.so.1.1.18"
if oracle_install kube1; then
    want=$(oracle_want)
    info "discovery lists $(printf '%s\n' "$want" | grep -c .) real driver files"
    assert_match "$(c discovery-lists-api)" "$LIB/libnvidia-api\.so\.1" "$want"
    oracle_both_views "$want"
    # The GPU Operator's own checks, in both documented configurations: the machine's root as
    # the host driver root (driver.enabled=false, root /), and the driver root as its install
    # dir, in the machine and as a pod sees it (bound at /driver-root, the original covered).
    oracle_gpu_operator host-root /
    oracle_gpu_operator driver-root-in-machine "$ROOT"
    oracle_gpu_operator driver-root-in-pod /driver-root \
        -p BindReadOnlyPaths="$ROOT:/driver-root" -p TemporaryFileSystem=/run/nvidia
    M rmdir /driver-root 2>/dev/null
    oracle_remove kube1
fi

# A C library upgraded on the host (a new inode at its name, as dpkg installs one) is drift of the
# running machine, named by its driver root; a reconcile rebuilds the tree, and it is in sync.
H sh -c "cp $LIB/libm.so.6 $LIB/libm.so.6.e2e && mv $LIB/libm.so.6.e2e $LIB/libm.so.6"
out=$(helper status kube1 2>&1); rc=$?
assert_eq "$(c status-c-library-upgraded-is-drift)" 5 "$rc"
assert_match "$(c status-c-library-upgraded-names-it)" "driver root.*libm\.so\.6" "$out"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-after-c-library-upgrade)" 0 "$rc"
assert_cmd "$(c machine-up-after-c-library-upgrade)" wait_machine_up kube1 120
out=$(helper status kube1 2>&1); rc=$?
assert_eq "$(c status-in-sync-after-reconcile)" 0 "$rc"

# ---- clean up: the real driver out, the stand-in back, kube1 restarted -------------------------
if ! out=$("$FETCH" uninstall deb "$RUN/host" 2>&1); then
    fail "$(c uninstall-real-driver)" "$(printf '%s' "$out" | tail -3 | tr '\n' ' ')"
fi
H rm -rf "/usr/lib/firmware/nvidia/$REAL"
fake_driver_version "$DRIVER_VERSION"
restore_libs
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-stand-in-again)" 0 "$rc"
assert_cmd "$(c machine-up-stand-in-again)" wait_machine_up kube1 120
assert_no_match "$(c nspawn-no-real-driver-left)" "nvidia/current|$REAL" "$(nspawn_file kube1)"
scenario_end
