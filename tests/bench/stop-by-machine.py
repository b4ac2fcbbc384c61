#!/usr/bin/env python3
"""Re-attribute e2e-bench.sh's `seg:stop` to the machine that was stopped.

A restart stops the machine the *previous* restart started. With two variants that share one
`.nspawn` file (bare and ours) that does not matter; with a third (oursB, HELPER_B) whose
pre-start renders a different `.nspawn` file (issue 12: per-name binds before, the driver tree
after), a restart's stop segment is the cost of whichever variant ran before it. This reads the
run order from the bench log (`<variant> #<i>: <ms> ms` lines), assigns each stop to the variant
whose machine it stopped, and prints, per variant, medians of:
  start   = wall - stop            (this variant's own start: pre-start, boot, post-start)
  stop    = stop of this variant's machine, by whichever restart stopped it
  steady  = start + stop           (a node that always restarts with this variant)
and the same for `serving` (kubelet active).

    tests/bench/stop-by-machine.py BENCH_LOG SAMPLES_CSV
"""
import csv
import re
import statistics
import sys

log, samples = sys.argv[1], sys.argv[2]
order = []
for line in open(log, errors="replace"):
    m = re.search(r"\] (\w+) #(\d+): [\d.]+ ms", line)
    if m:
        order.append((m.group(1), m.group(2)))
vals = {}
for r in csv.DictReader(open(samples)):
    if r["part"] == "reconcile":
        vals[(r["variant"], r["iter"], r["metric"])] = float(r["ms"])

stop_of = {}  # variant -> stops of its machines
start = {}
serve = {}
for k, (v, i) in enumerate(order):
    wall, stop, srv = (vals.get((v, i, m)) for m in ("wall", "seg:stop", "serving"))
    if wall is None or stop is None:
        continue
    start.setdefault(v, []).append(wall - stop)
    if srv is not None:
        serve.setdefault(v, []).append(srv - stop)
    if k > 0:
        stop_of.setdefault(order[k - 1][0], []).append(stop)

med = statistics.median
print("| variant | n | start (wall - stop) | stop of its machine (n) | steady restart returns | start to kubelet active (serving - stop) | steady kubelet active |")
print("|---|---:|---:|---:|---:|---:|---:|")
for v in sorted(start):
    s, st = start[v], stop_of.get(v, [])
    sv = serve.get(v, [])
    if not st:
        continue
    print(
        f"| {v} | {len(s)} | {med(s):.0f} | {med(st):.0f} ({len(st)}) | {med(s) + med(st):.0f} "
        f"| {med(sv):.0f} | {med(sv) + med(st):.0f} |"
    )
