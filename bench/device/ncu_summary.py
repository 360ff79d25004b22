#!/usr/bin/env python3
# Sums an ncu CSV log (gpu__time_duration and DRAM bytes per kernel launch, as compare.sh collects them) per
# kernel name: launches, mean time, total time and achieved DRAM bandwidth. With --shapes, per kernel
# instance (its template arguments: the width, code bits and group pieces of a product), launches reading
# over 200 MB (the output head) apart.
# Usage: ncu_summary.py LOG.csv LABEL [--shapes]
import collections
import csv
import re
import sys

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print(f"ncu {sys.argv[2]}: no data")
    sys.exit()
shapes = "--shapes" in sys.argv[3:]
head, rows = rows[0], rows[1:]
name_i, metric_i, value_i = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
id_i = head.index("ID")
launches = collections.OrderedDict()  # launch id -> [name, seconds, DRAM bytes]
for r in rows:
    name = re.sub(r"^void |unnamed>::", "", r[name_i].split("(")[0].strip())  # ncu's names
    name = name if shapes else name.split("<")[0]
    launch = launches.setdefault(r[id_i], [name, 0.0, 0.0])
    value = float(r[value_i].replace(",", "")) if r[value_i] else 0.0
    if r[metric_i] == "gpu__time_duration.sum":
        launch[1] += value * 1e-9
    elif r[metric_i].startswith("dram__bytes"):
        launch[2] += value
kernels = collections.defaultdict(lambda: [0, 0.0, 0.0])  # name -> [launches, seconds, DRAM bytes]
for name, secs, nbytes in launches.values():
    key = name + (" (>200 MB)" if shapes and nbytes > 200e6 else "")
    k = kernels[key]
    k[0] += 1
    k[1] += secs
    k[2] += nbytes
total_s = sum(k[1] for k in kernels.values())
total_b = sum(k[2] for k in kernels.values())
print(f"ncu {sys.argv[2]}: {len(launches)} kernels, {total_s * 1e3:.3f} ms, "
      f"{total_b / 1e9:.2f} GB, {total_b / total_s / 1e12:.2f} TB/s")
width = 62 if shapes else 26
for name, (count, secs, nbytes) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
    bw = nbytes / secs / 1e12 if secs else 0.0
    print(f"    {name:<{width}} {count:4d} x {secs / count * 1e6:6.1f} us = {secs * 1e3:6.3f} ms  "
          f"{nbytes / count / 1e6:7.1f} MB  {bw:5.2f} TB/s")
