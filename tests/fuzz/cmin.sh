#!/bin/bash
# Minimize every target's corpus in place (cargo fuzz cmin): only inputs that add coverage stay.
# -use_counters=0 keeps every covered edge but not every hit-count variation of one, which
# shrinks the config corpus from 330 KB to 46 KB; the fuzzers rebuild that variety quickly.
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls fuzz_targets | sed 's/\.rs$//')
for t in "${targets[@]}"; do
    cargo fuzz cmin --fuzz-dir . "$t" "corpus/$t" -- -use_counters=0 -rss_limit_mb=1024 -timeout=5 >"target/logs/cmin-$t.log" 2>&1
    printf '%-16s %4s files %6s bytes\n' "$t" "$(ls "corpus/$t" | wc -l)" "$(cat corpus/"$t"/* | wc -c)"
done
