#!/bin/bash
# The hook benchmark, run on demand and never by the test suite (tests/run-all.sh does not call
# it; no timed test exists). As root on an idle machine:
#
#   tests/bench/run.sh [bench options]        e.g. tests/bench/run.sh --runs 200
#
#   1. builds the shipped binary: static release build, exactly as tests/run-all.sh does;
#   2. runs `cargo bench --bench hooks -- --helper <that binary> …`: fixture hosts built in a
#      temp dir under $TMPDIR (default /tmp), machine roots on /dev/shm (tmpfs, like the
#      machine's /run); writes tests/bench/results/hooks.json (machine facts, summaries and every
#      sample) and prints Markdown tables, also saved as tests/bench/results/hooks.md;
#   3. draws tests/bench/results/hooks.png (tests/bench/plot.py) with matplotlib from PyPI in a
#      venv at $VENV (default /tmp/nspawn-bench-venv); PLOT=0 skips it; BEFORE=FILE adds the
#      pre-start medians of an earlier results file (e.g. an older helper, run with
#      `cargo bench --bench hooks -- --helper OLD --no-in-process --label … --out FILE`).
#
# COMPARE=PATH runs that older helper's pre-start interleaved with ours (before/after numbers
# from the same runs, so load drift cannot favour either).
# Bench options: --runs N (200), --warmup N (5), --hosts a,b, --work-dir DIR, --machine-dir DIR,
# --keep (leave the fixture hosts and machine roots for profiling), --out FILE.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "tests/bench/run.sh must run as root (fixture hosts need mknod)" >&2; exit 1; }

results=tests/bench/results
mkdir -p "$results"
target=$(rustc -vV | sed -n 's/^host: //p')
# The product binary in a target directory of its own: `cargo bench` builds the package's binary
# with the test kit (its dev-dependency on itself) into target/<triple>/release, over a plain
# `cargo build --release`, and the bench would time that larger binary instead.
cargo build --locked --release --target-dir target/product     # static: .cargo/config.toml
# `status` is measured with the test kit's --machine-root, which the product binary does not have.
cargo build --locked --release --features testkit --target-dir target/testkit
helper=$PWD/target/product/$target/release/nspawn-lifecycle-helper
cargo bench --locked --bench hooks --no-run
refusal=$("$helper" status --machine-root / probe 2>&1 || true)
grep -q "unexpected argument '--machine-root'" <<< "$refusal" \
    || { echo "$helper is not the product binary: it takes the test kit's --machine-root" >&2; exit 1; }

label="static release build of $(git rev-parse --short HEAD)"
git diff --quiet HEAD -- src Cargo.toml Cargo.lock || label+=" (with uncommitted changes)"
echo "load average before: $(cat /proc/loadavg)" >&2
cargo bench --locked --bench hooks -- --helper "$helper" --label "$label" ${COMPARE:+--compare "$COMPARE"} \
    --out "$results/hooks.json" "$@" | tee "$results/hooks.md"

if [ "${PLOT:-1}" = 1 ]; then
    venv=${VENV:-/tmp/nspawn-bench-venv}
    if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q matplotlib
    fi
    "$venv/bin/python" tests/bench/plot.py "$results/hooks.json" "$results/hooks.png" ${BEFORE:+"$BEFORE"}
fi
