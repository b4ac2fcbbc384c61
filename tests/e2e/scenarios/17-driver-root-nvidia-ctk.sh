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
# The oracle's functions: lib/oracle.sh (scenario 18 runs them on a real Debian-packaged driver).
scenario "driver root: nvidia-ctk finds every driver file, in the machine and at /driver-root" --needs-helper
baseline

# shellcheck source=../lib/oracle.sh
. "$E2E_SRC/lib/oracle.sh"
DR=$ORACLE_DR
oracle_install kube1 || exit 0

# ---- what our discovery lists, as standard paths ---------------------------------------------
want=$(oracle_want)
info "discovery lists $(printf '%s\n' "$want" | grep -c .) driver files"
assert_match "$(c discovery-lists-libcuda)" "/usr/lib/x86_64-linux-gnu/libcuda\.so\.$DRIVER_VERSION" "$want"

# ---- in the machine, and as a pod sees it ----------------------------------------------------
assert_cmd "$(c no-host-nvidia-in-machine)" M test ! -e /run/host-nvidia
info "firmware in the driver root: $(M ls "$DR/lib/firmware/nvidia/$DRIVER_VERSION" 2>&1 | tr '\n' ' ')"
oracle_both_views "$want"

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
oracle_remove kube1
fake_gpus "$E2E_GPUS"
out=$(reconcile kube1 2>&1); rc=$?
assert_eq "$(c reconcile-back)" 0 "$rc"
assert_cmd "$(c machine-up-again)" wait_machine_up kube1 60
scenario_end
