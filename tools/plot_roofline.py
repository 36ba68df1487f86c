#!/usr/bin/env python3
"""Plots achieved vs floor (SPEC.md §9) from Google Benchmark JSON files.

Input: bench_layer's JSON (``bench_layer --benchmark_out=bench_layer.json
--benchmark_out_format=json``) and, optionally, the per-op JSON files of bench_gemm /
bench_attention / bench_indexer (their points are added to the roofline when an entry carries
both a FLOP/s and a GB/s counter).

Output: one PNG with two panels
  left  -- per layer benchmark, two stacked horizontal bars, in units of the layer's floor (sum of
           the stage floors = 1): the measured stage times and the stage floors
           (max(bytes / copy BW, flops / GEMM rate)); the label gives layer us / floor us;
  right -- roofline: x = arithmetic intensity (FLOP per byte of minimum traffic), y = achieved
           TFLOP/s, with the copy-bandwidth slope and the bf16 GEMM-rate ceiling (the ceilings are
           read from the JSON: bench_layer's copy_GBps / gemm_TFLOPs counters, or the
           copy/d2d and cublas/bf16_gemm/8192 entries; --copy-gbps / --gemm-tflops override).
           Stages without FLOPs (prepare, summaries) appear only in the left panel.

Usage: tools/plot_roofline.py bench_layer.json [bench_gemm.json ...] -o roofline.png
Needs matplotlib (Debian: apt-get install python3-matplotlib). Errors: exits with a message
naming the file when a JSON file cannot be read or holds no benchmark the plot can use.
"""
import argparse
import json
import re
import sys

STAGES = ["fused_gemm", "prepare", "summaries", "select", "attention", "o_proj_gemm"]
COLORS = ["#4477aa", "#66ccee", "#228833", "#ccbb44", "#ee6677", "#aa3377"]


def base_name(entry):
    """The benchmark name without Google Benchmark's /iterations:N, /manual_time suffixes."""
    name = entry.get("run_name") or entry.get("name", "")
    return re.sub(r"/(iterations:\d+|manual_time|real_time|repeats:\d+)", "", name)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"plot_roofline: cannot read {path}: {e}")
    benches = data.get("benchmarks")
    if not isinstance(benches, list):
        sys.exit(f"plot_roofline: {path} has no 'benchmarks' list (expected Google Benchmark JSON)")
    # keep iterations (run_type 'iteration'), skip aggregates other than the median
    out = []
    for b in benches:
        if b.get("error_occurred"):
            print(f"plot_roofline: {path}: {b.get('name')} skipped: {b.get('error_message')}", file=sys.stderr)
            continue
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        out.append(b)
    return out


def ceilings(entries, copy_override, gemm_override):
    copy = gemm = None
    for b in entries:
        if copy is None and "copy_GBps" in b:
            copy = float(b["copy_GBps"])
        if gemm is None and "gemm_TFLOPs" in b:
            gemm = float(b["gemm_TFLOPs"])
    for b in entries:
        n = base_name(b)
        if copy is None and n.startswith("copy/d2d"):
            for k in ("GBps", "GB/s(rd+wr)", "GB/s", "figure"):
                if k in b:
                    copy = float(b[k])
                    break
        if gemm is None and n.startswith("cublas/bf16_gemm"):
            for k in ("TFLOPs", "TFLOP/s", "figure"):
                if k in b:
                    gemm = float(b[k])
                    break
    if copy_override:
        copy = copy_override
    if gemm_override:
        gemm = gemm_override
    return copy, gemm


def op_points(entries):
    """(label, AI, TFLOP/s) of per-op entries that carry a FLOP/s and a GB/s counter."""
    pts = []
    for b in entries:
        n = base_name(b)
        if n.startswith("layer/") or n.startswith("copy/") or n.startswith("cublas/"):
            continue
        tf = next((float(v) for k, v in b.items() if isinstance(v, (int, float)) and re.search(r"TFLOP", k)), None)
        gb = next((float(v) for k, v in b.items()
                   if isinstance(v, (int, float)) and re.search(r"GB/?s", k) and "copy" not in k), None)
        if tf and gb:
            pts.append((n, tf * 1e12 / (gb * 1e9), tf))
    return pts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="Google Benchmark JSON files (bench_layer.json first)")
    ap.add_argument("-o", "--out", default="roofline.png", help="output PNG (default roofline.png)")
    ap.add_argument("--copy-gbps", type=float, default=None, help="copy bandwidth ceiling, GB/s (read+write)")
    ap.add_argument("--gemm-tflops", type=float, default=None, help="bf16 GEMM ceiling, TFLOP/s")
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = []
    for p in args.json:
        entries += load(p)
    layer = [b for b in entries if base_name(b).startswith("layer/") and "layer_us" in b]
    others = op_points(entries)
    if not layer and not others:
        sys.exit("plot_roofline: no layer/... benchmark with a layer_us counter and no per-op FLOP/s+GB/s entry in "
                 + ", ".join(args.json))
    copy, gemm = ceilings(entries, args.copy_gbps, args.gemm_tflops)
    if copy is None or gemm is None:
        sys.exit("plot_roofline: no copy/GEMM ceilings in the JSON (copy_GBps/gemm_TFLOPs counters or the copy/d2d and "
                 "cublas/bf16_gemm entries); pass --copy-gbps and --gemm-tflops")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(18, max(6, 0.55 * len(layer) + 2)),
                                   gridspec_kw={"width_ratios": [1.3, 1]})
    # left: stacked bars, measured vs floor
    names = [base_name(b).replace("layer/", "") for b in layer]
    for i, b in enumerate(layer):
        y = len(layer) - 1 - i
        left_m = left_f = 0.0
        norm = float(b["floor_us"]) or 1.0
        for s, c in zip(STAGES, COLORS):
            m = float(b.get(s + "_us", 0)) / norm
            f = float(b.get(s + "_floor_us", 0)) / norm
            ax1.barh(y + 0.2, m, 0.38, left=left_m, color=c, label=s if i == 0 else None)
            ax1.barh(y - 0.2, f, 0.38, left=left_f, color=c, alpha=0.45, hatch="//")
            left_m += m
            left_f += f
        ax1.text(max(left_m, left_f) + 0.05, y, f"{float(b['layer_us']):.0f} us / {float(b['floor_us']):.0f} us "
                 f"= {float(b['x_floor']):.2f}x", va="center", fontsize=8)
    if layer:
        ax1.set_yticks(range(len(layer)))
        ax1.set_yticklabels(list(reversed(names)), fontsize=8)
        ax1.axvline(1.0, color="k", lw=0.8)
        ax1.axvline(1.4, color="k", lw=0.8, ls="--")
        ax1.set_xlabel("time / sum of the SPEC §9 floors -- upper bar: measured stages; lower hatched bar: floors "
                       "(dashed: 1.4x target)")
        ax1.set_title("one DSA layer on one rank: measured vs floor")
        ax1.legend(fontsize=8, loc="lower right")
        xmax = max(float(b["x_floor"]) for b in layer)
        ax1.set_xlim(0, max(1.5, xmax) * 1.45)

    # right: roofline
    ai_lo, ai_hi = 0.1, 1e5
    knee = gemm * 1e12 / (copy * 1e9)
    xs = [ai_lo, knee, ai_hi]
    ax2.plot(xs, [min(copy * 1e9 * x / 1e12, gemm) for x in xs], "k-", lw=1.5,
             label=f"roof: copy {copy:.0f} GB/s, bf16 GEMM {gemm:.0f} TFLOP/s")
    for si, (s, c) in enumerate(zip(STAGES, COLORS)):
        px, py = [], []
        for b in layer:
            fl, by, t = float(b.get(s + "_flops", 0)), float(b.get(s + "_bytes", 0)), float(b.get(s + "_us", 0))
            if fl > 0 and by > 0 and t > 0:
                px.append(fl / by)
                py.append(fl / (t * 1e-6) / 1e12)
        if px:
            ax2.scatter(px, py, color=c, s=30, label=s, zorder=3)
    if others:
        ax2.scatter([p[1] for p in others], [p[2] for p in others], marker="x", color="grey", s=20,
                    label="per-op benchmarks", zorder=2)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlim(ai_lo, ai_hi)
    ax2.set_xlabel("arithmetic intensity, FLOP / byte of minimum traffic")
    ax2.set_ylabel("achieved TFLOP/s")
    ax2.set_title("roofline (stages with FLOPs)")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot_roofline: wrote {args.out} ({len(layer)} layer benchmarks, {len(others)} per-op points; "
          f"copy {copy:.0f} GB/s, GEMM {gemm:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()
