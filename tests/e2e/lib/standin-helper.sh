#!/bin/bash
# Minimal stand-in for nspawn-lifecycle-helper, used ONLY while HELPER is unset (the real binary
# does not exist yet). It speaks the product's CLI so the drop-in and the scenarios are the same
# either way, but implements just enough for the rig-sanity scenario:
#   nspawn-lifecycle pre-start <m>   render /etc/systemd/nspawn/<m>.nspawn: PrivateUsers=no,
#                                    NotifyReady=yes and a Bind= for every fake NVIDIA/DRM node
#   nspawn-lifecycle post-start <m>  nothing (logs that it ran)
#   nspawn-lifecycle reconcile <m>   systemctl restart (the product uses D-Bus; this is a test double)
#   install <m>                      refused (exit 64): the harness then writes the drop-in itself
# Every scenario that needs real behaviour is skipped while this stand-in is in use.
set -u
log=/var/log/e2e-standin-helper.log
echo "$(date +%T.%N) standin $* (pid $$)" >> "$log"
case "${1:-} ${2:-}" in
"nspawn-lifecycle pre-start")
    m=$3
    mkdir -p /etc/systemd/nspawn
    {
        echo "[Exec]"
        echo "Capability=all"
        echo "PrivateUsers=no"
        echo "SystemCallFilter=@keyring bpf perf_event_open"
        echo "NotifyReady=yes"
        echo "[Network]"
        echo "VirtualEthernet=no"
        echo "[Files]"
        for d in /dev/nvidia[0-9]* /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/dri/card* /dev/dri/renderD*; do
            [ -c "$d" ] && echo "Bind=$d"
        done
    } > "/etc/systemd/nspawn/$m.nspawn.tmp"
    mv "/etc/systemd/nspawn/$m.nspawn.tmp" "/etc/systemd/nspawn/$m.nspawn"
    ;;
"nspawn-lifecycle post-start")
    ;;
"nspawn-lifecycle reconcile")
    systemctl reset-failed "systemd-nspawn@$3.service" 2>/dev/null
    exec systemctl restart "systemd-nspawn@$3.service"
    ;;
"install "*)
    echo "stand-in: install is not implemented" >&2; exit 64
    ;;
*)
    echo "stand-in: unsupported arguments: $*" >&2; exit 2
    ;;
esac
