#!/usr/bin/env python3
"""Digest of `ncu --csv --print-units base --metrics ...` (tools/ncu_stalls.sh): per kernel launch, the
warp-stall reasons largest first, duration / instructions / cycles, and the memory-request counters."""
import csv
import sys

MEMORY = ("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
          "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
          "lts__t_sector_hit_rate.pct", "dram__bytes_read.sum.per_second",
          "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum")


def main():
    # ncu's CSV rows start with a quote; the benchmark's own output is left out before parsing
    rows = [r for r in csv.reader(line for line in sys.stdin if line.startswith('"')) if len(r) > 10]
    if not rows:
        sys.exit("ncu_stalls: no profile rows (kernel regex, filter, or ncu permissions?)")
    col = {n: i for i, n in enumerate(rows[0])}
    launches = {}
    for r in rows[1:]:
        key = (r[col["ID"]], r[col["Kernel Name"]])
        launches.setdefault(key, {})[r[col["Metric Name"]]] = r[col["Metric Value"]]
    for (lid, name), m in launches.items():
        def num(k):
            try:
                return float(m.get(k, "nan").replace(",", ""))
            except ValueError:
                return float("nan")
        stalls = sorted(((num(k), k.split("stalled_")[1].split("_per_issue")[0]) for k in m
                         if "issue_stalled_" in k and "not_issued" not in k), reverse=True)
        print(f"launch {lid}: {name[:110]}")
        print("  stalls per issued instruction: " + ", ".join(f"{n} {v:.2f}" for v, n in stalls[:8]))
        print(f"  {num('gpu__time_duration.sum') / 1e3:.1f} us, {num('smsp__inst_executed.sum') / 1e6:.2f} M warp "
              f"instructions, {num('sm__cycles_elapsed.avg'):.0f} cycles per SM")
        for k in MEMORY:
            print(f"  {k} = {m.get(k, 'n/a')}")


if __name__ == "__main__":
    main()
