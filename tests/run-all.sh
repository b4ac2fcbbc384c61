#!/bin/bash
# The whole test suite: what the README's Quick start runs and what CI runs through .ci/run.
#
# Runs as root on a fresh Debian 12 machine with the pinned Rust toolchain; installs what it needs.
#   1. the floor: cargo fmt --check, cargo clippy -D warnings
#   2. cargo test: unit tests, fixture hosts (mknod: root; the real-driver hosts are built from
#      the .debs tests/realdriver/fetch.sh caches under /var/tmp), CDI validation, hostile rootfs,
#      oversized hosts (GNU time measures peak RSS), fuzz corpus replay; then again with
#      --features failpoints: the binary killed at each crash point, concurrent callers
#   3. the static release build (plain `cargo build --release` and `cargo install --path .`),
#      checked with file/ldd, and the same with --features failpoints; the GPU proof's kit and
#      what of tests/gpu/run.sh runs without a GPU (tests/gpu/selftest.sh); the adversarial CDI-hook
#      suite with that binary (tests/attack/run.sh: real runc and crun of Debian bookworm and
#      trixie, hostile images, racing sidecars, ~5 min); the Debian package built from it and
#      checked (tests/deb.sh: deterministic, contents, lintian)
#   4. the aarch64 binary (tests/aarch64/run.sh): cross-compiled static, the same answers as the
#      x86_64 one on every example host under qemu-user, the cargo suite built for aarch64 and run
#      under qemu-user, its CDI hooks (the adversarial suite's static cases), its arm64 package
#   5. the end-to-end harness under a real systemd (tests/e2e/harness.sh run) with that binary;
#      its crash scenario (8) runs the failpoints build, scenario 15 the Debian package; then
#      scenarios 01, 14 and 26 with the aarch64 binary as the hooks (tests/aarch64/e2e.sh)
# Knobs: SKIP_E2E=1 skips step 5 for a quick local loop (CI never sets it; the summary says so).
set -euo pipefail
cd "$(dirname "$0")/.."

# The environment never narrows a CI run: under CI (CI=true, as .ci/run sets it) every knob the
# suite reads to select, shorten, resize or rewrite checks (UPDATE_GOLDEN rewrites goldens,
# SKIP_E2E, E2E_*, ATTACK_*, the download caches and mirror the fetch scripts take, where cargo
# puts what it builds, the package's timestamps, the file every bash child sources first:
# BASH_ENV, ...) is cleared first, and so are the shell functions the environment exports (every
# bash child would run them in place of a command). Elsewhere they are a developer's to use, and
# a run they narrowed says so in its last line.
knobs=$(compgen -v | grep -E '^(UPDATE_GOLDEN|SKIP_E2E|REBUILD|ORACLE_KNOWN_GAPS|HELPER|HELPER_FAILPOINTS|RESULTS|MACHINE|RUNTIMES_CACHE|GPU_KIT_CACHE|PROMETHEUS_CACHE|NVIDIA_DEBS_CACHE|NVIDIA_DEBS_MIRROR|CDIHOOKS_CACHE|CARGO_TARGET_DIR|SOURCE_DATE_EPOCH|BASH_ENV|NVIDIA_CTK|NVIDIA_CTK_DIR|E2E_[A-Z0-9_]*|ATTACK_[A-Z0-9_]*|CROSS_[A-Z0-9_]*|CDI_HOOK_[A-Z_]*|AARCH64_CACHE)$' || true)
narrowed=""
for v in $knobs; do
    if [ "${CI:-}" = true ]; then
        echo "tests/run-all.sh: CI: ignoring $v=${!v} from the environment" >&2
        unset "$v"
    else
        narrowed="$narrowed $v=${!v}"
    fi
done
for f in $(compgen -A function); do
    if [ "${CI:-}" = true ]; then
        echo "tests/run-all.sh: CI: ignoring the shell function $f from the environment" >&2
        unset -f "$f"
    else
        narrowed="$narrowed function:$f"
    fi
done
if [ -n "$narrowed" ]; then
    # shellcheck disable=SC2064 # the list is fixed now
    trap "echo; echo 'NARROWED: this run was shaped by the environment ($narrowed ): NOT a full test run'" EXIT
fi

step() { printf '\n=== %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { echo "tests/run-all.sh must run as root (mknod, mounts, nspawn)" >&2; exit 1; }

step "installing test dependencies (apt-get)"
need=()
for pair in file:file systemd-nspawn:systemd-container debootstrap:debootstrap gcc:gcc dbus-daemon:dbus \
    /usr/bin/time:time prlimit:util-linux man:man-db fish:fish zsh:zsh; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
# tests/json_schema.rs validates every JSON output with Python's jsonschema.
python3 -c 'import jsonschema' 2>/dev/null || need+=(python3-jsonschema)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

step "real NVIDIA driver files (tests/realdriver/fetch.sh: Debian trixie non-free .debs, cached)"
tests/realdriver/fetch.sh fetch

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings
step "cargo test"
nodes_before=$(ls -d /dev/nvidia* 2>/dev/null || true)
cargo test --locked
# The README's Quick start, its first command as written there (the demo: its own profile, the
# product's dependencies only), and its default example host shown complete.
quick=$(sed -n '/^## Quick start/,/^## /p' README.md | sed -n '/^```sh/{n;s/ *#.*//;p;q}')
step "the Quick start's first command: $quick"
[ "${quick%% *}" = cargo ] || { echo "FAIL: the README's Quick start does not start with a cargo command: '$quick'" >&2; exit 1; }
demo_out=$($quick)
grep -q '^verdict: complete' <<< "$demo_out" || { echo "FAIL: '$quick' showed no complete verdict:" >&2; echo "$demo_out" >&2; exit 1; }
step "cargo clippy --all-targets --features failpoints -- -D warnings"
cargo clippy --all-targets --locked --features failpoints -- -D warnings
step "cargo test --features failpoints (crash points and concurrent callers: tests/crash.rs, tests/concurrency.rs)"
cargo test --locked --features failpoints
# The tests must leave this machine's /dev as they found it (NVIDIA's real libraries create
# /dev/nvidiactl when they load and it is missing; tests that load them do so in their own /dev).
nodes_after=$(ls -d /dev/nvidia* 2>/dev/null || true)
if [ "$nodes_after" != "$nodes_before" ]; then
    echo "FAIL: the tests changed /dev: before [$nodes_before], after [$nodes_after]" >&2; exit 1
fi

step "static release build: plain cargo build --release and cargo install --path . (.cargo/config.toml)"
target=$(rustc -vV | sed -n 's/^host: //p')
bin=target/$target/release/nspawn-lifecycle-helper
# The path cargo itself reports, so a static binary left by an earlier build cannot stand in.
built=$(cargo build --locked --release --message-format=json-render-diagnostics \
    | sed -n 's/.*"executable":"\([^"]*\/nspawn-lifecycle-helper\)".*/\1/p')
[ "$built" = "$PWD/$bin" ] || { echo "FAIL: cargo build --release built '$built', not $bin (.cargo/config.toml)" >&2; exit 1; }
# cargo install --path reuses this workspace's target/, so this costs no second build.
installed=$(mktemp -d /tmp/nspawn-lifecycle-cargo-install.XXXXXX)
cargo install --locked --path . --root "$installed"
# The demo (a binary of the test kit) is no part of what is installed.
[ "$(ls "$installed/bin")" = nspawn-lifecycle-helper ] || { echo "FAIL: cargo install put more than the helper in bin/: $(ls "$installed/bin")" >&2; exit 1; }
for b in "$bin" "$installed/bin/nspawn-lifecycle-helper"; do
    file "$b"
    file "$b" | grep -Eq 'static-pie linked|statically linked' || { echo "FAIL: $b is not statically linked" >&2; exit 1; }
    if ldd "$b" 2>&1 | grep -q '=>'; then echo "FAIL: ldd lists shared libraries for $b" >&2; exit 1; fi
done
rm -rf "$installed"
# The test kit (example hosts, test-only flags: feature `testkit`) is in test builds only: the
# product binary must not know its flags.
for probe in "status kube1 --machine-root /" "cdi-hook disable-device-node-modification --host-params /"; do
    # shellcheck disable=SC2086 # the probe is split into words on purpose
    rc=0; out=$("$bin" $probe 2>&1) || rc=$?
    if [ "$rc" != 2 ] || ! grep -q "unexpected argument" <<< "$out"; then
        echo "FAIL: $bin accepts a test-kit flag ($probe): exit $rc: $out" >&2; exit 1
    fi
done
# ...nor name them in its messages: status of a machine on a host tree says why it cannot.
probe_host=$(mktemp -d /tmp/nspawn-lifecycle-probe.XXXXXX)
mkdir -p "$probe_host/var/lib/machines/kube1"
"$bin" --host-root "$probe_host" install kube1 >/dev/null
rc=0; out=$("$bin" --host-root "$probe_host" status kube1 2>&1) || rc=$?
if [ "$rc" != 2 ] || grep -q -- "--machine-root" <<< "$out" || ! grep -q "host's own systemd" <<< "$out"; then
    echo "FAIL: $bin status on a host tree: exit $rc: $out" >&2; exit 1
fi
rm -rf "$probe_host"
# The same, with the crash points compiled in, for the crash scenario of the harness. Its own
# target dir, so the two builds do not invalidate each other.
step "static release build with --features failpoints"
cargo build --locked --release --features failpoints --target-dir target/failpoints
fp_bin=target/failpoints/$target/release/nspawn-lifecycle-helper
file "$fp_bin" | grep -Eq 'static-pie linked|statically linked' || { echo "FAIL: $fp_bin is not statically linked" >&2; exit 1; }
# Crash points exist only in the failpoints build: the product binary must not even know the knob.
grep -q NSPAWN_LIFECYCLE_FAILPOINT "$fp_bin" || { echo "FAIL: $fp_bin has no crash points" >&2; exit 1; }
if grep -q NSPAWN_LIFECYCLE_FAILPOINT "$bin"; then echo "FAIL: $bin has crash points compiled in" >&2; exit 1; fi

step "GPU proof script, GPU-free parts: its kit (tests/gpu/kit.sh: ptxas assembles the probe's kernel) and tests/gpu/selftest.sh"
kit=$(mktemp -d /tmp/nspawn-lifecycle-gpu-kit.XXXXXX)
tests/gpu/kit.sh "$kit/kit" >&2
tests/gpu/selftest.sh "$kit/kit"
rm -rf "$kit"

step "adversarial CDI-hook suite (tests/attack/run.sh): runc and crun of bookworm and trixie, hostile images, racing sidecars"
tests/attack/run.sh "$bin"
# Its negative control: hooks that fail every creation must fail the suite (a "0 escapes" of
# creations that never reached the hooks proves nothing), on one runtime, a few creations.
step "adversarial suite, negative control: a helper whose hooks fail every creation"
control=$(mktemp -d /tmp/nspawn-lifecycle-attack-control.XXXXXX)
printf '#!/bin/sh\nexit 1\n' >"$control/nspawn-lifecycle-helper"
chmod 0755 "$control/nspawn-lifecycle-helper"
rc=0
ATTACK_RACES=2 ATTACK_LIBRACES=1 ATTACK_CASES=kmsg ATTACK_RUNTIMES=runc-bookworm \
    tests/attack/run.sh "$control/nspawn-lifecycle-helper" >"$control/log" 2>&1 || rc=$?
if [ "$rc" = 0 ] || ! grep -q '^FAIL runc-bookworm race-root: 0 of 2 well-formed creations beside the sidecar started (2 refused by a hook' "$control/log"; then
    tail -20 "$control/log" >&2
    echo "FAIL: the adversarial suite passed (exit $rc) with hooks that fail every creation" >&2; exit 1
fi
echo "the adversarial suite fails with hooks that fail every creation, as it must: $(tail -1 "$control/log")" >&2
rm -rf "$control"

step "Debian package (assets/debian/build-deb.sh): deterministic, contents, lintian (tests/deb.sh)"
# lintian checks the package; man-db lets scenario 15 find the packaged pages with man.
for pair in lintian:lintian man:man-db; do
    command -v "${pair%%:*}" >/dev/null || {
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pair#*:}" >/dev/null
    }
done
deb=$(tests/deb.sh "$bin")

step "aarch64 (Grace hosts): the static binary cross-compiled, its answers against this one's under qemu-user, the cargo suite built for aarch64, its CDI hooks, its arm64 package (tests/aarch64/run.sh)"
a64=$(tests/aarch64/run.sh "$bin")

if [ "${SKIP_E2E:-0}" = 1 ]; then
    step "end-to-end harness SKIPPED (SKIP_E2E=1): this run is NOT a full test run"
    exit 0
fi
step "end-to-end harness under a real systemd"
# The lock only matters on a shared development machine (the harness uses fixed paths).
HELPER=$PWD/$bin HELPER_FAILPOINTS=$PWD/$fp_bin E2E_DEB=$PWD/$deb E2E_REQUIRE_HELPER=1 E2E_REQUIRE_FAILPOINTS=1 \
    flock /var/tmp/nspawn-lifecycle-e2e.lock tests/e2e/harness.sh run
step "end-to-end harness with the aarch64 helper as the hooks (qemu-user through binfmt_misc): scenarios 01, 14, 26"
tests/aarch64/e2e.sh "$a64" "01 14 26"
