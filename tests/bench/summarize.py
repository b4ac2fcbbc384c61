#!/usr/bin/env python3
"""Summarize tests/bench/e2e-bench.sh output: samples.csv -> summary.md + summary.json (and stdout).

Statistics over iterations >= 1 (iteration 0 is a warm-up); p90 is the nearest-rank 90th
percentile. Ratios: per-file / ours for the rewiring (item 3, target >= 100), and
reconcile / bare restart - 1 for the cost our hooks add (item 4, target < 10%), both as ratios of
medians and as the median of per-iteration (paired) ratios. With the `ordered` variant (bare plus
kubelet ordered after containerd by systemd alone) also ordered / bare - 1, the floor the
required order sets, and reconcile / ordered - 1, what our hooks add on top of that floor.
"""
import csv
import json
import math
import os
import statistics
import sys
from collections import defaultdict

SKIP_VARIANTS = {"meta", "check", "warmup", "restore"}


def stats(xs):
    xs = sorted(xs)
    n = len(xs)
    return {
        "n": n,
        "median": statistics.median(xs),
        "min": xs[0],
        "p90": xs[max(0, math.ceil(0.9 * n) - 1)],
        "max": xs[-1],
    }


def fmt(x):
    if x is None:
        return "-"
    if abs(x) >= 100:
        return "%.0f" % x
    if abs(x) >= 10:
        return "%.1f" % x
    return "%.2f" % x


def main(out):
    rows = list(csv.DictReader(open(os.path.join(out, "samples.csv"))))
    facts = json.load(open(os.path.join(out, "facts.json")))
    data = defaultdict(list)          # (part, variant, metric) -> [value]
    by_iter = defaultdict(dict)       # (part, variant, metric) -> {iter: value}
    meta = {}
    for r in rows:
        key = (r["part"], r["variant"], r["metric"])
        v = float(r["ms"])
        if r["variant"] in ("meta", "check"):
            meta["%s.%s" % (r["part"], r["metric"])] = v
            continue
        if r["variant"] in SKIP_VARIANTS or int(r["iter"]) < 1:
            continue
        data[key].append(v)
        by_iter[key][int(r["iter"])] = v
    S = {"%s/%s/%s" % k: stats(v) for k, v in sorted(data.items())}

    def med(part, variant, metric):
        s = S.get("%s/%s/%s" % (part, variant, metric))
        return s["median"] if s else None

    def paired(a, b, f, ratio=True):
        ia, ib = by_iter.get(a, {}), by_iter.get(b, {})
        xs = [f(ia[i], ib[i]) for i in sorted(set(ia) & set(ib)) if ib[i] > 0 or not ratio]
        return statistics.median(xs) if xs else None

    lines = []
    w = lines.append
    w("Machine: %s, %s CPUs, kernel %s, PID 1 %s; %s. Date %s; helper %s (%s), git %s."
      % (facts["cpu"], facts["nproc"], facts["kernel"], facts["pid1"], facts["host_systemd"],
         facts["date"], facts["helper"], facts["helper_sha256"], facts["git"]))
    w("Fake driver: %d GPUs, %d library files (driver %s). N=%d per variant."
      % (facts["fake_gpus"], facts["driver_library_files"], facts["driver_version"], facts["n"]))
    loads = ", ".join("%s %.2f" % (k, v) for k, v in sorted(meta.items()) if "load" in k)
    if loads:
        w("Load average (1 min) at part start/end: " + loads)
    w("")
    summary = {"facts": facts, "stats": S, "meta": meta, "ratios": {}}

    if any(k[0] == "rewire" for k in data):
        w("### Rewiring (item 3): per-file approach vs ours, ms")
        w("")
        w("| what | n | median | min | p90 | load1 median |")
        w("|---|---:|---:|---:|---:|---:|")
        for variant, metric, label in [
            ("perfile", "wall", "per-file: find + %d x (rm -f, ln -s) + ldconfig, each via systemd-run"
             % int(med("rewire", "perfile", "files") or 0)),
            ("after-perfile", "rewiring", "ours after each per-file run: driver root + links + ldconfig + CDI"),
            ("after-perfile", "rewiring-without-ldconfig", "  of which file steps (driver root, links, CDI)"),
            ("after-perfile", "step:ldconfig", "  of which ldconfig (transient unit in the machine)"),
            ("steady", "rewiring", "ours, nothing changed"),
            ("upgrade", "rewiring", "ours, driver version flipped before each run"),
            ("upgrade", "rewiring-without-ldconfig", "  of which file steps"),
            ("after-perfile", "post-start-wall", "ours: whole post-start incl. services (context)"),
        ]:
            s = S.get("rewire/%s/%s" % (variant, metric))
            if not s:
                continue
            ld = S.get("rewire/%s/load1" % variant)
            w("| %s | %d | %s | %s | %s | %s |" % (label, s["n"], fmt(s["median"]), fmt(s["min"]),
                                                fmt(s["p90"]), fmt(ld["median"]) if ld else "-"))
        w("")
        pf = med("rewire", "perfile", "wall")
        for variant in ("after-perfile", "steady", "upgrade"):
            o = med("rewire", variant, "rewiring")
            if pf and o:
                r = pf / o
                pr = paired(("rewire", "perfile", "wall"), ("rewire", variant, "rewiring"), lambda a, b: a / b)
                summary["ratios"]["perfile/ours-" + variant] = {"of_medians": r, "paired_median": pr}
                w("Ratio per-file / ours (%s): **%.0fx** (median of paired ratios %s); target >= 100x: %s"
                  % (variant, r, "%.0fx" % pr if pr else "-", "met" if r >= 100 else "MISSED"))
        w("")

    if any(k[0] == "reconcile" for k in data):
        w("### Restart (item 4): `nspawn-lifecycle reconcile` vs bare `systemctl restart`, ms")
        w("")
        w("| what | n | median | min | p90 | load1 median |")
        w("|---|---:|---:|---:|---:|---:|")
        rows = [("wall", "bare", "bare restart (drop-in without our hooks)"),
                ("wall", "ordered", "ordered: bare, kubelet After=/Requires=containerd"),
                ("wall", "ours", "reconcile (our hooks)"),
                ("wall", "oursB", "reconcile, HELPER_B in the hooks"),
                ("serving", "bare", "bare restart: until kubelet is active in the machine"),
                ("serving", "ordered", "ordered: until kubelet is active in the machine"),
                ("serving", "ours", "reconcile: until kubelet is active in the machine"),
                ("serving", "oursB", "reconcile with HELPER_B: until kubelet is active")]
        for metric, variant, label in rows:
            s = S.get("reconcile/%s/%s" % (variant, metric))
            ld = S.get("reconcile/%s/load1" % variant)
            if s:
                w("| %s | %d | %s | %s | %s | %s |" % (label, s["n"], fmt(s["median"]), fmt(s["min"]),
                                                    fmt(s["p90"]), fmt(ld["median"]) if ld else "-"))
        w("")
        # (variant, base, sentence, against the target?)
        comparisons = [
            ("ours", "bare", "Hooks add **%s** to a restart, %s", True),
            ("oursB", "bare", "Hooks of HELPER_B add **%s** to a restart, %s", True),
            ("ordered", "bare", "The required order alone (ordered vs bare, the floor) adds **%s**, %s", False),
            ("ours", "ordered", "Hooks add **%s** on top of that floor (ours vs ordered), %s", False),
            ("oursB", "ordered", "Hooks of HELPER_B add **%s** on top of that floor, %s", False),
        ]
        for metric, what in [("wall", "until the restart returns"),
                             ("serving", "until kubelet is active in the machine")]:
            for variant, base, sentence, target in comparisons:
                b, o = med("reconcile", base, metric), med("reconcile", variant, metric)
                if b and o:
                    r = o / b - 1
                    pr = paired(("reconcile", variant, metric), ("reconcile", base, metric), lambda a, c: a / c - 1)
                    key = "reconcile-%s/%s-1" % (variant, base) + ("" if metric == "wall" else "/" + metric)
                    summary["ratios"][key] = {"of_medians": r, "paired_median": pr}
                    w((sentence % ("%+.1f%%" % (100 * r), what))
                      + " (median of paired: %s)" % ("%+.1f%%" % (100 * pr) if pr is not None else "-")
                      + ("; target < 10%%: %s" % ("met" if r < 0.10 and (pr is None or pr < 0.10) else "MISSED")
                         if target else ""))
        w("")
        w("A restart's `stop` segment is the stop of the machine the previous restart started; "
          "`stop-by-machine.py` gives each variant's steady figures.")
        w("")
        w("Breakdown (medians, ms; from the unit's µs timestamps and the hooks' step timings):")
        w("")
        cols = [v for v in ("bare", "ordered", "ours", "oursB") if any(k[:2] == ("reconcile", v) for k in data)]
        w("| segment | " + " | ".join("ours B" if v == "oursB" else v for v in cols) + " |")
        w("|---|" + "---:|" * len(cols))
        segs = []
        for k in data:
            if k[0] == "reconcile" and k[2].startswith(("seg:", "post:", "in:")) and k[2] not in segs:
                segs.append(k[2])
        order = ["seg:call-to-stop-begin", "seg:stop", "seg:inactive-to-start"]
        rest = [s for s in segs if s not in order and s.startswith("seg:")]
        tail = ["seg:nspawn-boot-to-ready", "seg:exec post-start", "seg:post-start-exit-to-active",
                "seg:active-to-return"]
        rest = [s for s in rest if s not in tail]
        inner = ["in:containerd start begins", "in:containerd active", "in:kubelet start begins",
                 "in:kubelet active", "in:containerd's own start-up", "in:kubelet active after containerd active"]
        for s in order + rest + tail + [s for s in segs if s.startswith("post:")] + inner:
            ms = [med("reconcile", v, s) for v in cols]
            if all(m is None for m in ms):
                continue
            if s.startswith("seg:"):
                label = s[4:]
            elif s.startswith("post:"):
                label = "  post-start: " + s[5:]
            elif s in inner[:4]:
                label = "in the machine, after nspawn started: " + s[3:]
            else:
                label = "in the machine: " + s[3:]
            w("| %s | %s |" % (label, " | ".join(fmt(m) for m in ms)))
        w("")

    if any(k[0] == "rewire" and k[1] in ("A", "B") for k in data):
        w("### post-start alone, A (HELPER) vs B (HELPER_B), steady state, alternating; ms")
        w("")
        w("| step | A median | A p90 | B median | B p90 | B - A (median of paired) |")
        w("|---|---:|---:|---:|---:|---:|")
        steps = sorted({k[2] for k in data if k[0] == "rewire" and k[1] in ("A", "B")
                        and k[2] not in ("load1",)})
        for m in steps:
            a, b = S.get("rewire/A/" + m), S.get("rewire/B/" + m)
            if not a or not b:
                continue
            d = paired(("rewire", "B", m), ("rewire", "A", m), lambda x, y: x - y, ratio=False)
            w("| %s | %s | %s | %s | %s | %s |" % (m, fmt(a["median"]), fmt(a["p90"]), fmt(b["median"]),
                                                 fmt(b["p90"]), "%+.2f" % d if d is not None else "-"))
        w("")

    text = "\n".join(lines)
    open(os.path.join(out, "summary.md"), "w").write(text + "\n")
    json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1])
