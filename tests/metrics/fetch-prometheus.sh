#!/bin/bash
# Prometheus's own tools for the metrics tests, from Debian 12: `promtool` (package prometheus)
# and the node exporter (prometheus-node-exporter), fetched with `apt-get download` through a
# PRIVATE apt configuration (the machine's sources are never touched) and extracted once, never
# installed: no service starts, nothing of this machine changes.
#
#   fetch-prometheus.sh        print the extracted tree (…/root: usr/bin/promtool,
#                              usr/bin/prometheus-node-exporter)
#
# Cache: /var/tmp/nspawn-lifecycle-prometheus (PROMETHEUS_CACHE). Offline once cached.
set -euo pipefail

CACHE=${PROMETHEUS_CACHE:-/var/tmp/nspawn-lifecycle-prometheus}
PKGS=(prometheus prometheus-node-exporter)

die() { echo "fetch-prometheus.sh: $*" >&2; exit 1; }
done_already() { [ -x "$CACHE/root/usr/bin/promtool" ] && [ -x "$CACHE/root/usr/bin/prometheus-node-exporter" ]; }

# shellcheck source=../lib/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/debian-mirror.sh"
# shellcheck source=../lib/private-apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/private-apt.sh"

if done_already; then echo "$CACHE/root"; exit 0; fi
mkdir -p "$(dirname "$CACHE")"
# Tests run in parallel: one fetch at a time.
exec 9>"$CACHE.lock"
flock 9
if done_already; then echo "$CACHE/root"; exit 0; fi
private_apt_download "$CACHE/apt" bookworm "$CACHE/debs" "${PKGS[@]}" || die "fetching ${PKGS[*]} failed"
rm -rf "$CACHE/root.tmp"
for deb in "$CACHE"/debs/*.deb; do dpkg-deb -x "$deb" "$CACHE/root.tmp"; done
[ -x "$CACHE/root.tmp/usr/bin/promtool" ] || die "the prometheus package has no usr/bin/promtool"
[ -x "$CACHE/root.tmp/usr/bin/prometheus-node-exporter" ] || die "no usr/bin/prometheus-node-exporter"
rm -rf "$CACHE/root"
mv "$CACHE/root.tmp" "$CACHE/root"
echo "$CACHE/root"
