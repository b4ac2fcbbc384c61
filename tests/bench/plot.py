#!/usr/bin/env python3
"""Plot hook cost against the number of driver library files from the benchmark's results file.

Usage: plot.py RESULTS.json OUT.png [BEFORE.json]
(needs matplotlib; tests/bench/run.sh sets up a venv). A run with --compare OLD_HELPER shows
that helper's pre-start medians too; BEFORE.json, a separate run of an older helper (e.g. with
--no-in-process), adds its pre-start medians as a faded line.

Uses the hosts marked fileSeries (8 GPUs, 23/50/200/800 driver files): medians with p10-p90
bars, on linear axes and on log-log axes with a slope-1 (linear growth) guide.
"""
import json
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [
    ("prestart", "pre-start, steady (process)", "tab:blue", "o-"),
    ("prestart_first", "pre-start, first write (process)", "tab:cyan", "o--"),
    ("rewire_cold", "rewiring, fresh machine (in-process)", "tab:red", "s-"),
    ("rewire_steady", "rewiring, nothing changes (in-process)", "tab:orange", "s--"),
    ("discover", "discovery alone (in-process)", "tab:green", "^:"),
    ("ldconfig_p", "ldconfig -p (process)", "tab:gray", "d-"),
    ("floor", "floor: --version (process)", "black", "x:"),
]


def file_series(res):
    return sorted((h for h in res["hosts"] if h["fileSeries"]), key=lambda h: h["driverFiles"])


def main(src, dst, before_src=None):
    with open(src) as f:
        res = json.load(f)
    before = None
    if before_src:
        with open(before_src) as f:
            before = json.load(f)
    hosts = file_series(res)
    if not hosts:
        sys.exit("no fileSeries hosts in " + src)
    xs = [h["driverFiles"] for h in hosts]
    facts = res["facts"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for ax, log in zip(axes, (False, True)):
        for key, label, color, style in SERIES:
            s = [h["series"][key]["summary"] for h in hosts]
            med = [x["median"] / 1000 for x in s]
            lo = [(x["median"] - x["p10"]) / 1000 for x in s]
            hi = [(x["p90"] - x["median"]) / 1000 for x in s]
            ax.errorbar(xs, med, yerr=[lo, hi], fmt=style, color=color, label=label,
                        capsize=3, markersize=5, linewidth=1.4)
        ch = [h for h in hosts if "prestart_compare" in h["series"]]
        if ch:
            name = facts.get("compareHelper", "").rsplit("/", 1)[-1] or "--compare helper"
            ax.plot([h["driverFiles"] for h in ch],
                    [h["series"]["prestart_compare"]["summary"]["median"] / 1000 for h in ch],
                    "o-", color="tab:purple", alpha=0.45,
                    label=f"pre-start, steady, {name} (same runs, interleaved)")
        if before:
            bh = [h for h in file_series(before) if "prestart" in h["series"]]
            ax.plot([h["driverFiles"] for h in bh],
                    [h["series"]["prestart"]["summary"]["median"] / 1000 for h in bh],
                    "o-", color="tab:blue", alpha=0.3,
                    label=f"pre-start, steady, before ({before['facts'].get('label') or 'older helper'})")
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
            # Slope-1 guide through pre-start's first point: linear growth runs parallel to it.
            base = hosts[0]["series"]["prestart"]["summary"]["median"] / 1000
            ax.plot(xs, [base * x / xs[0] for x in xs], color="tab:blue", alpha=0.25,
                    linewidth=6, label="linear growth (slope 1)")
            ax.set_title("log-log: slope 1 = linear in files")
            ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(xs))
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        else:
            ax.axhline(5, color="tab:blue", alpha=0.4, linestyle=":")
            ax.text(xs[-1], 5.2, "pre-start target 5 ms", color="tab:blue", fontsize=8,
                    ha="right", va="bottom")
            ax.set_title("hook cost vs driver library files (8 GPUs)")
            ax.set_ylim(bottom=0)
        ax.set_xlabel("driver library files on the host")
        ax.set_ylabel("wall time, ms (median, p10-p90)")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7.5, loc="upper left")
    fig.suptitle(
        f"nspawn-lifecycle hooks · {facts.get('cpuModel')} · {facts.get('cpus')} CPUs · "
        f"Linux {facts.get('kernel')} · {facts.get('date')} · {facts.get('runs')} runs/point · "
        f"load {facts.get('loadAvgBefore', '').split(' ')[0]}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("plot:", dst)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
