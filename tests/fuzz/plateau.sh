#!/bin/bash
# For each target's last run log: total executions, final cov, and when cov last grew
# (execution number and the share of the run before it): a plateau shows as an early last growth.
cd "$(dirname "$0")"
for log in target/logs/[!c]*.log target/logs/config.log; do
    [ -f "$log" ] || continue
    awk -v name="$(basename "$log" .log)" '
        /^#[0-9]+/ && / cov: / {
            n = substr($1, 2) + 0
            for (i = 1; i <= NF; i++) if ($i == "cov:") c = $(i + 1) + 0
            if (c != last) { last = c; at = n }
        }
        /^stat::number_of_executed_units:/ { total = $2 }
        END { if (total) printf "%-16s execs=%-9d cov=%-5d last cov growth at exec %d (%.0f%% into the run)\n", name, total, last, at, 100 * at / total }
    ' "$log"
done | sort -u
