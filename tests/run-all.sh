#!/bin/bash
# The whole test suite: what the README's Quick start runs and what CI runs through .ci/run.
#
# Runs as root on a fresh Debian 12 machine with the pinned Rust toolchain; installs what it needs.
#   1. the floor: cargo fmt --check, cargo clippy -D warnings
#   2. cargo test: unit tests, fixture hosts (mknod: root), CDI validation, hostile rootfs,
#      oversized hosts (GNU time measures peak RSS), fuzz corpus replay
#   3. the static release build, checked with file/ldd
#   4. the end-to-end harness under a real systemd (tests/e2e/harness.sh run) with that binary
# Knobs: SKIP_E2E=1 skips step 4 for a quick local loop (CI never sets it; the summary says so).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { echo "tests/run-all.sh must run as root (mknod, mounts, nspawn)" >&2; exit 1; }

step "installing test dependencies (apt-get)"
need=()
for pair in file:file systemd-nspawn:systemd-container debootstrap:debootstrap gcc:gcc dbus-daemon:dbus \
    /usr/bin/time:time prlimit:util-linux; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings
step "cargo test"
cargo test --locked

step "static release build"
target=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS='-C target-feature=+crt-static' cargo build --locked --release --target "$target"
bin=target/$target/release/nspawn-lifecycle-helper
file "$bin"
file "$bin" | grep -Eq 'static-pie linked|statically linked' || { echo "FAIL: $bin is not statically linked" >&2; exit 1; }
if ldd "$bin" 2>&1 | grep -q '=>'; then echo "FAIL: ldd lists shared libraries for $bin" >&2; exit 1; fi

if [ "${SKIP_E2E:-0}" = 1 ]; then
    step "end-to-end harness SKIPPED (SKIP_E2E=1): this run is NOT a full test run"
    exit 0
fi
step "end-to-end harness under a real systemd"
HELPER=$PWD/$bin E2E_REQUIRE_HELPER=1 tests/e2e/harness.sh run
