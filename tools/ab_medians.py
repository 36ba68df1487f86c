#!/usr/bin/env python3
"""Median table of an A/B (or A/B/C...) of one Google Benchmark binary: the runs of each side are
DIR/<side>_<round>.json (written with --benchmark_out); per benchmark it prints each side's median
real time (µs) and each later side over the first. tools/device_ab.sh (sides old and new) and the
device call scripts that switch an experiment by environment (sides sideA, sideB, ...) use it.
With --counter NAME (repeatable), the table is of those user counters (e.g. bench_layer's
layer_us, select_us; their own units) instead of the real time.
Usage: tools/ab_medians.py [--counter NAME ...] DIR SIDE [SIDE ...]"""
import glob
import json
import statistics
import sys

SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def side_times(d, side, counters=()):
    """{benchmark name: [real time in µs of each round]} of DIR/<side>_<round>.json; names lose
    Google Benchmark's /iterations:N/manual_time suffix. Unreadable files and errored runs are skipped.
    With `counters`, {name + " " + counter: [the counter's value of each round]} instead."""
    t = {}
    for f in sorted(glob.glob(f"{d}/{side}_*.json")):
        try:
            with open(f) as fh:
                js = json.load(fh)
        except Exception:
            continue
        for b in js.get("benchmarks", []):
            if b.get("error_occurred"):
                continue
            n = b["name"].split("/iterations:")[0].replace("/manual_time", "")
            if not counters:
                t.setdefault(n, []).append(b["real_time"] * SCALE[b.get("time_unit", "us")])
            for c in counters:
                if c in b:
                    t.setdefault(n + " " + c, []).append(float(b[c]))
    return t


def main(argv):
    counters = []
    while len(argv) > 2 and argv[1] == "--counter":
        counters.append(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 3:
        print(__doc__)
        return 2
    d, sides = argv[1], argv[2:]
    t = {s: side_times(d, s, counters) for s in sides}
    names = list(t[sides[-1]])  # the last side's order, then names only the others have
    for s in sides:
        names += [n for n in t[s] if n not in names]
    med = lambda s, n: statistics.median(t[s][n]) if n in t[s] else float("nan")
    unit = "" if counters else " us"
    print(f"{'benchmark':70s} " + " ".join(f"{s + unit:>10s}" for s in sides) + " " +
          " ".join(f"{s + '/' + sides[0]:>8s}" for s in sides[1:]))
    for n in names:
        v = [med(s, n) for s in sides]
        print(f"{n:70s} " + " ".join(f"{x:10.1f}" for x in v) + " " + " ".join(f"{x / v[0]:8.3f}" for x in v[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
