#!/bin/bash
# Run fuzz targets one after another (one process, one core), each for SECONDS_PER_TARGET
# (default 240), starting from seeds/<target> and corpus/<target> and growing corpus/<target>;
# then summarize executions and coverage.
#   tests/fuzz/run.sh                 # every target
#   tests/fuzz/run.sh config elf_info # some
#   SECONDS_PER_TARGET=60 tests/fuzz/run.sh
# Needs cargo-fuzz (`cargo install cargo-fuzz`); RUSTC_BOOTSTRAP=1 lets the stable toolchain
# take the nightly-only sanitizer flags. Logs go to tests/fuzz/target/logs/<target>.log.
# Afterwards: tests/fuzz/cmin.sh keeps only the inputs that add coverage.
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
secs=${SECONDS_PER_TARGET:-240}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls fuzz_targets | sed 's/\.rs$//')
mkdir -p target/logs
cargo fuzz build --fuzz-dir . "${targets[@]:0:1}" >/dev/null 2>&1 || cargo fuzz build --fuzz-dir .
for t in "${targets[@]}"; do
    dict=()
    [ -f "dict/$t.dict" ] && dict=("-dict=dict/$t.dict")
    echo "=== $t (${secs}s)" >&2
    # -rss_limit_mb: a parser that needs a GiB for a few KB of input is a finding, not a host.
    # -timeout: one input taking seconds is a hang.
    # New inputs go to corpus/ (the first directory); seeds/ is read as well, never written.
    cargo fuzz run --fuzz-dir . "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=1024 -timeout=5 -print_final_stats=1 \
        "${dict[@]}" >"target/logs/$t.log" 2>&1 || { echo "FAIL: $t, see target/logs/$t.log" >&2; tail -40 "target/logs/$t.log" >&2; exit 1; }
done
for t in "${targets[@]}"; do
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "target/logs/$t.log")
    cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "target/logs/$t.log" | tail -1)
    printf '%-16s execs=%-10s %s\n' "$t" "$execs" "$cov"
done
