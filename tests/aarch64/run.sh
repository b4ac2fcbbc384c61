#!/bin/bash
# The aarch64 proofs (tests/run-all.sh runs this after the x86_64 release build):
#
#   tests/aarch64/run.sh X86_64-BINARY
#
#   1. builds the static aarch64 release binary (tests/aarch64/build.sh) and fetches qemu-aarch64;
#   2. same answers: tests/cross_arch.rs runs both binaries (the aarch64 one under qemu-user) on
#      every example host and a hostile one, comparing `discover`, `plan`, `cdi-spec` and what
#      `install` and `pre-start` write, byte for byte;
#   3. the test suite built for aarch64 and run under qemu-user (cargo's runner; qemu-aarch64
#      registered in binfmt_misc for the binaries the tests start): every cargo test but those
#      listed with the emulator's reason;
#   4. the CDI hooks as the aarch64 product binary: tests/cdi_hooks.rs (CDI_HOOK_HELPER and
#      CDI_HOOK_RUNNER naming it), then the adversarial suite's static cases with real runc and
#      crun (tests/attack/run.sh, no racing sidecars);
#   5. the Debian package for arm64 from the same recipe (tests/deb.sh: deterministic, contents,
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

# From here on the kernel runs every aarch64 binary through qemu (the ones the tests start, a
# runtime's hooks); removed again on exit.
# shellcheck source=binfmt.sh
. tests/aarch64/binfmt.sh
binfmt_register "$qemu"

step "the test suite built for aarch64, run under qemu-user (cargo's runner)"
# Every cargo test of the suite, built for aarch64 as the release binary is (-Zbuild-std), at
# opt-level 1 (the wiring model takes 20 minutes at 0 under qemu, 3 at 1; debug assertions and
# overflow checks stay on). Not run here, each for a reason of the emulator, not of aarch64:
not_here=(
    "apply::driver_tree::tests::privileged_a_file_on_another_filesystem_is_bound_instead|qemu-user's statx passes STATX_MNT_ID in the mask but leaves stx_mnt_id 0, so the plan cannot see the other mount (pre-start still binds the file when the link fails with EXDEV, as it must)"
    "privileged_demo_interrupted_leaves_no_example_host|waits until /proc/PID/syscall shows the demo blocked in write(2), and under qemu-user that file shows the emulator's own x86_64 system call numbers"
)
skips=()
for t in "${not_here[@]}"; do
    echo "not run under qemu-user: ${t%%|*}: ${t#*|}" >&2
    skips+=(--skip "${t%%|*}")
done
echo "not run for aarch64: tests/crash.rs and tests/concurrency.rs (--features failpoints: the binary killed at each crash point, concurrent callers): they run with the x86_64 build; tests/cross_arch.rs is the step above" >&2
t0=$(date +%s)
RUSTC_BOOTSTRAP=1 CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=$qemu CARGO_PROFILE_DEV_OPT_LEVEL=1 \
    CARGO_PROFILE_DEV_DEBUG=line-tables-only \
    cargo test --locked --target aarch64-unknown-linux-gnu -Zbuild-std=std,panic_abort \
    --target-dir target/aarch64 -- --exact "${skips[@]}" >&2
echo "the aarch64 test suite: built and run in $(( $(date +%s) - t0 )) s" >&2

step "the CDI hooks as the aarch64 product binary (tests/cdi_hooks.rs under qemu-user)"
# The test build above ran every case; the release binary, the one the package ships, runs
# every case but the two that pass the hook --host-params, a test-kit flag it has not.
for t in privileged_disable_device_node_modification_covers_params_read_only \
    privileged_hooks_take_nothing_from_the_environment_or_working_directory; do
    echo "not run with the aarch64 product binary: $t (needs the test kit's --host-params; run in the step above)" >&2
done
CDI_HOOK_HELPER=$a64 CDI_HOOK_RUNNER=$qemu cargo test --locked --test cdi_hooks -- \
    --skip privileged_disable_device_node_modification_covers_params_read_only \
    --skip privileged_hooks_take_nothing_from_the_environment_or_working_directory >&2

step "the adversarial suite's static cases with the aarch64 hooks (tests/attack/run.sh, real runc and crun)"
# Every static case and the well-formed image, with each runtime; the racing sidecars stay with
# the x86_64 hooks (tests/run-all.sh): a race against hooks 20 times slower under emulation
# proves less, not more.
t0=$(date +%s)
ATTACK_RACES=0 ATTACK_LIBRACES=0 tests/attack/run.sh "$a64" >&2
echo "the adversarial suite's static cases, aarch64 hooks: $(( $(date +%s) - t0 )) s" >&2

step "the Debian package for arm64 (tests/deb.sh)"
tests/deb.sh "$a64" "$qemu" >&2
echo "$a64"
