#!/bin/bash
# The lifecycle under a real systemd with the aarch64 helper as the unit's hooks:
#
#   tests/aarch64/e2e.sh AARCH64-BINARY [SCENARIOS]     (default scenarios: 01 14 26)
#
# Registers trixie's qemu-aarch64 (tests/aarch64/build.sh qemu) in binfmt_misc with the F flag
# (tests/aarch64/binfmt.sh: it then runs aarch64 binaries inside the rig's containers, whose trees
# do not have it), runs the e2e harness with HELPER=AARCH64-BINARY, and removes the registration
# on exit, whatever happened. Every hook the rig's systemd runs, post-start's D-Bus
# calls, the gate, the driver tree and the CDI spec, is then the aarch64 binary's work.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: tests/aarch64/e2e.sh AARCH64-BINARY [SCENARIOS]" >&2; exit 2; }
a64=$(realpath "$1")
scenarios=${2:-"01 14 26"}
qemu=$(tests/aarch64/build.sh qemu)
# shellcheck source=binfmt.sh
. tests/aarch64/binfmt.sh
binfmt_register "$qemu"
"$a64" --version >&2 || { echo "FAIL: $a64 does not run through binfmt_misc" >&2; exit 1; }
HELPER=$a64 E2E_REQUIRE_HELPER=1 E2E_SCENARIOS=$scenarios \
    flock /var/tmp/nspawn-lifecycle-e2e.lock tests/e2e/harness.sh run
