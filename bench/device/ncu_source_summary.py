#!/usr/bin/env python3
# Summarises ncu's warp-state sampling (bench/device/ncu_source.sh): per profiled launch, its time and the
# stall reasons by share of the samples (raw page), then the SASS instructions with the most samples (source
# page, one section per launch).
# Usage: ncu_source_summary.py RAW.csv SOURCE.csv LABEL
import csv
import re
import sys

raw_path, source_path, label = sys.argv[1:4]


def rows_of(path):
    with open(path, newline="") as f:
        return [r for r in csv.reader(f)]


raw = [r for r in rows_of(raw_path) if len(r) > 5]
if raw:
    head = raw[0]
    name_i = head.index("Kernel Name") if "Kernel Name" in head else None
    time_i = head.index("gpu__time_duration.sum") if "gpu__time_duration.sum" in head else None
    stall = [(i, h) for i, h in enumerate(head)
             if re.fullmatch(r"smsp__pcsamp_warps_issue_stalled_\w+", h) and not h.endswith("_not_issued")]
    units = raw[1]
    for r in raw[2:]:  # row 1 holds the units
        name = r[name_i].split("(")[0] if name_i is not None else "?"
        counts = []
        for i, h in stall:
            try:
                counts.append((float(r[i].replace(",", "")), h.replace("smsp__pcsamp_warps_issue_stalled_", "")))
            except (ValueError, IndexError):
                pass
        total = sum(c for c, _ in counts) or 1.0
        top = ", ".join(f"{n} {100 * c / total:.0f}%" for c, n in sorted(counts, reverse=True)[:8] if c > 0)
        t = f"{r[time_i]} {units[time_i]}" if time_i is not None else "?"
        print(f"{label}: {name[:70]} time {t}; samples {total:.0f}: {top}")

sections, current, head = [], None, None
for r in rows_of(source_path):
    if any(c.strip() == "Source" for c in r) and any("Address" in c for c in r):
        head = r
        current = []
        sections.append((head, current))
    elif current is not None and len(r) == len(head):
        current.append(r)
for n, (head, lines) in enumerate(sections):
    src_i = head.index("Source")
    all_i = next((i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All")), None)
    if all_i is None:
        continue

    def num(r, i):
        try:
            return float(r[i].replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r, all_i) for r in lines) or 1.0
    print(f"{label}, launch {n}: {len(lines)} instructions, {total:.0f} samples; the most sampled:")
    ranked = sorted(range(len(lines)), key=lambda k: -num(lines[k], all_i))[:30]
    for k in sorted(ranked):
        print(f"  {k:5d} {100 * num(lines[k], all_i) / total:5.1f}%  {lines[k][src_i][:90]}")
