#!/usr/bin/env python3
"""Digest of Nsight Compute's per-SASS-instruction source page (ncu -i <report> --page source --csv
--print-source sass): the warp-stall samples by reason over the whole kernel, the executed code
footprint (distinct SASS instructions that ran; those run at most once per warp), then the `top`
instructions by samples, each with its two largest stall reasons and the `context` SASS lines
before it (a stall is sampled on the instruction that waits, so the producer of the awaited value
is usually a few lines above).  Used by tools/ncu_sass.sh.
  python3 tools/ncu_sass.py <source page csv> [top] [context]"""
import csv
import gzip
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def read_source_table(path, column):
    """The per-SASS-instruction source table of `path` (plain or .gz) that has `column`: (header,
    {column: index}, rows), the rows of one SASS address merged (counters summed); None (after
    printing the file's first lines) when there is none. Several profiled launches of one kernel
    (ncu_sass.sh count > 1) list the same code once per launch: merged, the figures are per
    instruction, not per launch. tools/ncu_sass_blocks.py reads its tables with it too."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as fh:
        rows = list(csv.reader(fh))
    hdr = next((i for i, r in enumerate(rows) if column in r), None)
    if hdr is None:
        print("no source table with", repr(column), "in", path)
        for r in rows[:8]:
            print(",".join(r)[:200])
        return None
    h = rows[hdr]
    ci = {c: i for i, c in enumerate(h)}
    body = [r for r in rows[hdr + 1:] if len(r) == len(h)]
    if "Address" in ci:
        merged = {}
        for r in body:
            m = merged.get(r[ci["Address"]])
            if m is None:
                merged[r[ci["Address"]]] = list(r)
            else:
                for c, i in ci.items():
                    if c not in ("Address", "Source"):
                        m[i] = str(num(m[i]) + num(r[i]))
        body = list(merged.values())
    return h, ci, body


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    context = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    table = read_source_table(path, "Warp Stall Sampling (All Samples)")
    if table is None:
        return 1
    h, ci, body = table
    samples = ci["Warp Stall Sampling (All Samples)"]
    src = ci.get("Source", 1)
    reasons = [c for c in h if c.startswith("stall_") and "(Not" not in c]
    total = sum(num(r[samples]) for r in body) or 1.0
    agg = sorted(((sum(num(r[ci[c]]) for r in body), c) for c in reasons), reverse=True)
    print(f"{len(body)} SASS instructions, {total:.0f} samples; by reason: " +
          ", ".join(f"{c[6:]} {v / total * 100:.1f}%" for v, c in agg if v / total >= 0.005))
    if "Instructions Executed" in ci:
        # the executed code footprint (instruction fetch): distinct SASS instructions that ran, and
        # how many of them ran at most once per warp (the kernel's first instruction runs once per
        # launched warp, so its count is the number of warps)
        ex = [num(r[ci["Instructions Executed"]]) for r in body]
        warps = ex[0] if ex else 0.0
        ran = [e for e in ex if e > 0]
        once = sum(1 for e in ran if e <= warps)
        print(f"executed: {len(ran)} distinct SASS instructions ({len(ran) * 16} bytes), {sum(ex):.0f} warp "
              f"instructions, {warps:.0f} warps launched; {once} distinct instructions ran at most once per warp")
    order = sorted(range(len(body)), key=lambda i: -num(body[i][samples]))[:top]
    for i in sorted(order):
        r = body[i]
        why = sorted(((num(r[ci[c]]), c[6:]) for c in reasons), reverse=True)[:2]
        reasons_txt = ", ".join(f"{n} {v:.0f}" for v, n in why if v > 0)
        print(f"--- {num(r[samples]) / total * 100:.1f}% of samples ({reasons_txt})")
        for j in range(max(0, i - context), i + 1):
            mark = ">" if j == i else " "
            print(f"  {mark} {num(body[j][samples]) / total * 100:5.1f}%  {body[j][src].strip()[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
