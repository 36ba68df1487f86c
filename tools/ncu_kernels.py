"""Reads `ncu --csv` metric rows (stdin) and prints one line per kernel launch, then the median
duration per kernel name (tools/ncu_kernels.sh)."""
import csv
import statistics
import sys

rows = list(csv.reader(line for line in sys.stdin if line.startswith('"')))
if not rows:
    sys.exit("no ncu rows")
hdr, body = rows[0], rows[1:]
ix = {h: i for i, h in enumerate(hdr)}
launches = {}
for r in body:
    key = (int(r[ix["ID"]]), r[ix["Kernel Name"]])
    launches.setdefault(key, {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
per_name = {}
for (i, name), v in sorted(launches.items()):
    us = float(v.get("gpu__time_duration.sum", "0").replace(",", "")) / 1000.0
    per_name.setdefault(name, []).append(us)
    print(f"{i:>5} {us:9.2f} us grid {v.get('launch__grid_size', '?'):>7} block {v.get('launch__block_size', '?'):>4}  {name[:120]}")
print("\nmedian us  launches  kernel")
for name, ds in per_name.items():
    print(f"{statistics.median(ds):9.2f} {len(ds):9d}  {name[:120]}")
