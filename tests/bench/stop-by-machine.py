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

Then the comparisons of the steady figures, as the ratio of the medians above and as the median
of per-iteration (paired) ratios, where a restart's steady figure is its start plus the stop of
its own machine by the next restart (the last restart of the run has none and is left out):
  ours vs bare      what our hooks cost (issue 12's targets, each at most +10%)
  ordered vs bare   the floor the required order sets: bare with kubelet After=/Requires=
                    containerd in the machine, systemd alone (BENCH_ORDERED, the default)
  ours vs ordered   what our hooks add on top of that floor
(and oursB against both, when the run had HELPER_B).

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
steady = {}  # (variant, metric) -> {iter: start (or serving - stop) + the stop of its machine}
prev = None  # (variant, iter, start, serving - stop) of the restart before, if measured
for v, i in order:
    wall, stop, srv = (vals.get((v, i, m)) for m in ("wall", "seg:stop", "serving"))
    if wall is None or stop is None:
        prev = None
        continue
    start.setdefault(v, []).append(wall - stop)
    if srv is not None:
        serve.setdefault(v, []).append(srv - stop)
    if prev is not None:
        pv, pi, ps, psv = prev
        stop_of.setdefault(pv, []).append(stop)
        steady.setdefault((pv, "wall"), {})[pi] = ps + stop
        if psv is not None:
            steady.setdefault((pv, "serving"), {})[pi] = psv + stop
    prev = (v, i, wall - stop, None if srv is None else srv - stop)

med = statistics.median
print("| variant | n | start (wall - stop) | stop of its machine (n) | steady restart returns | start to kubelet active (serving - stop) | steady kubelet active |")
print("|---|---:|---:|---:|---:|---:|---:|")
steady_med = {}  # (variant, metric) -> sum of the medians, as in the table
for v in sorted(start):
    s, st = start[v], stop_of.get(v, [])
    sv = serve.get(v, [])
    if not st:
        continue
    steady_med[(v, "wall")] = med(s) + med(st)
    print(f"| {v} | {len(s)} | {med(s):.0f} | {med(st):.0f} ({len(st)}) | {med(s) + med(st):.0f} ", end="")
    if sv:
        steady_med[(v, "serving")] = med(sv) + med(st)
        print(f"| {med(sv):.0f} | {med(sv) + med(st):.0f} |")
    else:
        print("| - | - |")


def compare(a, b, metric):
    """'+x.x% (paired +y.y%, n)': steady a vs steady b, ratio of medians and paired median."""
    ma, mb = steady_med.get((a, metric)), steady_med.get((b, metric))
    if not ma or not mb:
        return None
    ia, ib = steady.get((a, metric), {}), steady.get((b, metric), {})
    xs = [ia[i] / ib[i] - 1 for i in sorted(set(ia) & set(ib)) if ib[i] > 0]
    paired = "%+.1f%%" % (100 * med(xs)) if xs else "-"
    return "%+.1f%% (paired %s, n=%d)" % (100 * (ma / mb - 1), paired, len(xs))


rows = [("ours", "bare", "ours vs bare (our hooks)"),
        ("ordered", "bare", "ordered vs bare (the floor the required order sets)"),
        ("ours", "ordered", "ours vs ordered (what our hooks add on top of that floor)"),
        ("oursB", "bare", "oursB vs bare"),
        ("oursB", "ordered", "oursB vs ordered")]
lines = []
for a, b, label in rows:
    w, s = compare(a, b, "wall"), compare(a, b, "serving")
    if w or s:
        lines.append(f"| {label} | {w or '-'} | {s or '-'} |")
if lines:
    print()
    print("| steady, ratio of medians (median of paired ratios) | until the restart returns | until kubelet is active |")
    print("|---|---:|---:|")
    print("\n".join(lines))
