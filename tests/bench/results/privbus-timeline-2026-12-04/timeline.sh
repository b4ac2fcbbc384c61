#!/bin/bash
# Run on 2026-12-04 as: N=8 flock /var/tmp/nspawn-lifecycle-e2e.lock <this script>
# with HELPER = the release build of 9efc653 (main), from /tmp; body unchanged. Output: timeline.txt.
# Timeline of N restarts of kube1 with the main build's hooks (machine journal, monotonic µs).
set -uo pipefail
cd /work/wt-privbus
export HELPER=/var/tmp/privbus-old-helper E2E_REQUIRE_HELPER=1 E2E_GPUS=8 E2E_EXTRA_LIBS=192
trap 'tests/e2e/harness.sh down >/dev/null 2>&1' EXIT
tests/e2e/harness.sh up >/tmp/privbus-floor-up.log 2>&1 || { tail -20 /tmp/privbus-floor-up.log; exit 1; }
L=$(cat /var/tmp/nspawn-lifecycle-e2e/run/host.leader)
H() { nsenter -t "$L" -a "$@"; }
H systemctl start systemd-nspawn@kube1.service || { H systemctl status systemd-nspawn@kube1.service --no-pager | tail -20; exit 1; }
for i in $(seq 1 ${N:-8}); do
  sleep 2
  s=$(date +%s%6N); H systemctl restart systemd-nspawn@kube1.service; e=$(date +%s%6N)
  sleep 1.5
  echo "== restart $i returned after $(( (e - s) / 1000 )) ms"
  H journalctl -M kube1 -b --no-pager -o short-monotonic 2>/dev/null | grep -E "systemd 252 running|Reached target basic.target|Started dbus.service|Starting containerd|Started containerd|Started kubelet|skipped because of an unmet" | sed 's/ - .*//'
done
