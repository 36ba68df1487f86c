#!/usr/bin/env python3
"""Turns Google Benchmark JSON files (bench/*.cu with --benchmark_out) into Markdown tables for
bench/RESULTS.md: one table per file, one row per benchmark, the real time (µs) and every
user counter. Usage: tools/bench_table.py bench_gemm.json [...] > tables.md"""
import json
import sys


def fmt(v):
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    return str(v)


def table(path):
    with open(path) as f:
        data = json.load(f)
    ctx = data.get("context", {})
    rows = [b for b in data.get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"
            or b.get("aggregate_name") == "median"]
    skip = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads", "iterations",
            "real_time", "cpu_time", "time_unit", "family_index", "per_family_instance_index",
            "aggregate_name", "aggregate_unit", "label", "error_occurred", "error_message"}
    keys = []
    for b in rows:
        for k in b:
            if k not in skip and k not in keys:
                keys.append(k)
    out = [f"### {path.split('/')[-1]} ({ctx.get('date', '')}, {ctx.get('host_name', '')})", "",
           "| benchmark | time (µs) | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    for b in rows:
        name = b["name"].replace("/manual_time", "")
        if b.get("error_occurred"):
            out.append(f"| {name} | skipped: {b.get('error_message', '')} |" + " |" * len(keys))
            continue
        t = b.get("real_time", 0) * scale.get(b.get("time_unit", "ns"), 1e-3)
        out.append(f"| {name} | {fmt(t)} | " + " | ".join(fmt(b.get(k, "")) for k in keys) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        try:
            print(table(p))
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"bench_table.py: cannot read {p}: {e}")
