#!/bin/bash
# Minimize every target's corpus in place (cargo fuzz cmin): only inputs that add coverage stay.
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls fuzz_targets | sed 's/\.rs$//')
for t in "${targets[@]}"; do
    cargo fuzz cmin --fuzz-dir . "$t" "corpus/$t" -- -rss_limit_mb=1024 -timeout=5 >"target/logs/cmin-$t.log" 2>&1
    printf '%-16s %4s files %6s bytes\n' "$t" "$(ls "corpus/$t" | wc -l)" "$(cat corpus/"$t"/* | wc -c)"
done
