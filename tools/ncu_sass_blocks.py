#!/usr/bin/env python3
"""Where a kernel's instructions go: Nsight Compute's per-SASS-instruction source page (the
sass.csv that tools/ncu_sass.sh leaves, plain or .gz) summed into straight-line blocks (runs of
consecutive instructions executed equally often), by opcode, and into named address regions.
Instruction counts, not stall samples (tools/ncu_sass.py reads those): the tool for an
instruction-bound kernel, e.g. the top-k's instructions per key.
  python3 tools/ncu_sass_blocks.py <sass.csv[.gz]> [--keys N] [--min-share F] [--regions OFF:NAME,...]
--keys N: also report thread instructions per key (warp instructions x 32 / N).
--min-share F: list blocks holding at least F of the warp instructions (default 0.01).
--regions: hex offsets from the kernel's first instruction where named regions start (read them off
the block listing), e.g. 0:prologue,c30:staging,22d0:passes; each region's share is printed."""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_sass import num, read_source_table  # noqa: E402  (the stall digest's table reader)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--keys", type=float, default=0.0)
    ap.add_argument("--min-share", type=float, default=0.01)
    ap.add_argument("--regions", default="")
    args = ap.parse_args()
    table = read_source_table(args.csv, "Instructions Executed")
    if table is None:
        return 1
    _, ci, body = table
    if not body:
        print("empty source table in", args.csv)
        return 1
    base = int(body[0][ci["Address"]], 16)
    ex = [num(r[ci["Instructions Executed"]]) for r in body]
    src = [r[ci["Source"]].strip() for r in body]
    off = [int(r[ci["Address"]], 16) - base for r in body]
    tot = sum(ex)
    if tot == 0:
        print("no instruction executed")
        return 1
    per_key = f", {tot * 32 / args.keys:.1f} thread instructions per key" if args.keys > 0 else ""
    print(f"{tot / 1e6:.2f} M warp instructions over {len(body)} SASS instructions{per_key}")
    ops = collections.Counter()
    for e, s in zip(ex, src):
        words = [w for w in s.split() if not w.startswith("@")]
        ops[words[0].split(".")[0] if words else "?"] += e
    print("by opcode: " + ", ".join(f"{k} {100 * v / tot:.1f}%" for k, v in ops.most_common(16)))
    if args.regions:
        cuts = sorted((int(o, 16), name) for o, name in (x.split(":", 1) for x in args.regions.split(",")))
        acc = collections.OrderedDict((name, 0.0) for _, name in cuts)
        for o, e in zip(off, ex):
            names = [name for c, name in cuts if o >= c]
            if names:
                acc[names[-1]] += e
        for name, v in acc.items():
            extra = f"  {v * 32 / args.keys:6.1f} per key" if args.keys > 0 else ""
            print(f"  region {name:16s} {100 * v / tot:5.1f}%{extra}")
    print("blocks (offset, instructions, executions each, share):")
    i = 0
    while i < len(body):
        j = i
        while j + 1 < len(body) and abs(ex[j + 1] - ex[i]) <= 2:
            j += 1
        share = ex[i] * (j - i + 1) / tot
        if share >= args.min_share:
            print(f"  {off[i]:6x} {j - i + 1:4d} x {int(ex[i]):10d}  {100 * share:5.1f}%  | " +
                  " ; ".join(s[:36] for s in src[i:min(j + 1, i + 4)]))
        i = j + 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
