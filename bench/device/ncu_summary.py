#!/usr/bin/env python3
# Sums an ncu CSV log (gpu__time_duration and DRAM bytes per kernel launch, as compare.sh collects them) per
# kernel name: launches, mean time, total time and achieved DRAM bandwidth.
# Usage: ncu_summary.py LOG.csv LABEL
import collections
import csv
import sys

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print(f"ncu {sys.argv[2]}: no data")
    sys.exit()
head, rows = rows[0], rows[1:]
name_i, metric_i, value_i = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
kernels = collections.defaultdict(lambda: [0, 0.0, 0.0])  # name -> [launches, seconds, DRAM bytes]
for r in rows:
    name = r[name_i].split("(")[0].split("<")[0].replace("void ", "").strip()
    value = float(r[value_i].replace(",", "")) if r[value_i] else 0.0
    if r[metric_i] == "gpu__time_duration.sum":
        kernels[name][0] += 1
        kernels[name][1] += value * 1e-9
    elif r[metric_i].startswith("dram__bytes"):
        kernels[name][2] += value
total_s = sum(k[1] for k in kernels.values())
total_b = sum(k[2] for k in kernels.values())
print(f"ncu {sys.argv[2]}: {sum(k[0] for k in kernels.values())} kernels, {total_s * 1e3:.3f} ms, "
      f"{total_b / 1e9:.2f} GB, {total_b / total_s / 1e12:.2f} TB/s")
for name, (count, secs, nbytes) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
    bw = nbytes / secs / 1e12 if secs else 0.0
    print(f"    {name:<34} {count:4d} x {secs / count * 1e6:6.1f} us = {secs * 1e3:6.3f} ms  {bw:5.2f} TB/s")
