#!/bin/bash
# The aarch64 proofs (tests/run-all.sh runs this after the x86_64 release build):
#
#   tests/aarch64/run.sh X86_64-BINARY
#
#   1. builds the static aarch64 release binary (tests/aarch64/build.sh) and fetches qemu-aarch64;
#   2. same answers: tests/cross_arch.rs runs both binaries (the aarch64 one under qemu-user) on
#      every example host and a hostile one, comparing `discover`, `plan`, `cdi-spec` and what
#      `install` and `pre-start` write, byte for byte;
#   3. the CDI hooks as aarch64 binaries: the attack suite's static cases under qemu-user
#      (tests/cdi_hooks.rs with CDI_HOOK_HELPER and CDI_HOOK_RUNNER naming them);
#   4. the Debian package for arm64 from the same recipe (tests/deb.sh: deterministic, contents,
#      lintian), beside the amd64 one.
# Prints the aarch64 binary's path on stdout last, for the e2e harness.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# = 1 ] || { echo "usage: tests/aarch64/run.sh X86_64-BINARY" >&2; exit 2; }
x86=$(realpath "$1")
step() { printf '\n=== aarch64: %s\n' "$*" >&2; }

step "static release build for aarch64-unknown-linux-gnu (tests/aarch64/build.sh)"
t0=$(date +%s)
a64=$(tests/aarch64/build.sh)
qemu=$(tests/aarch64/build.sh qemu)
file "$a64" >&2
echo "built in $(( $(date +%s) - t0 )) s; runs under $("$qemu" --version | head -1)" >&2
"$qemu" "$a64" --version >&2

step "same answers as the x86_64 binary on every example host (tests/cross_arch.rs)"
CROSS_X86=$x86 CROSS_AARCH64=$a64 CROSS_QEMU=$qemu \
    cargo test --locked --test cross_arch -- --ignored --nocapture >&2

step "the CDI hooks as the aarch64 binary (tests/cdi_hooks.rs under qemu-user)"
# Two cases pass the hook --host-params, a test-kit flag the product binary has not (they run
# with the x86_64 test build in cargo test); every other case runs here.
for t in privileged_disable_device_node_modification_covers_params_read_only \
    privileged_hooks_take_nothing_from_the_environment_or_working_directory; do
    echo "not run with the aarch64 product binary: $t (needs the test kit's --host-params)" >&2
done
CDI_HOOK_HELPER=$a64 CDI_HOOK_RUNNER=$qemu cargo test --locked --test cdi_hooks -- \
    --skip privileged_disable_device_node_modification_covers_params_read_only \
    --skip privileged_hooks_take_nothing_from_the_environment_or_working_directory >&2

step "the Debian package for arm64 (tests/deb.sh)"
tests/deb.sh "$a64" "$qemu" >&2
echo "$a64"
