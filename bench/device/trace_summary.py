#!/usr/bin/env python3
"""Summarises a kernel timeline written by a PD_KERNEL_TRACE build (src/puredrive/backend/cuda/trace.cuh).

Usage: trace_summary.py pd_trace.bin [--rows 1] [--steps N]

A step starts at an embed launch. Of the last steps whose launches all have the given rows, it prints the
median over steps of each launch's start (from the step's start), duration (first block start to last block
end), the gap since the previous launch ended (negative: overlap) and the block count, then the sum per
kernel, and the phase stamps of the stream kernels (SM cycles converted with the clock seen in the records).
"""
import argparse
import statistics
import struct
import sys
from collections import defaultdict

NAMES = {1: "embed", 2: "rms_norm", 3: "gemv_stream", 4: "gemv_stream_affine", 5: "moe_up", 6: "moe_down",
         7: "gdn_conv", 8: "gdn_recurrent", 9: "qk_norm_rope", 10: "attn_decode", 11: "attn_merge",
         12: "argmax_slices", 13: "argmax_merge"}
# moe_up: since 43e8f33 the producer warp stamps "barrier" and routes row 0, and the consumers make their
# fragments ("x_loaded") before "route_row" (every row routed).
PHASES = {5: ["pdl_wait", "router", "barrier", "route_row", "used_list", "route_done", "slots", "x_loaded",
              "tile1", "tile2", "last_tile"],
          6: ["pdl_wait", "slots"], 3: ["pdl_wait", "x_loaded", "first_tile"]}
REC = struct.Struct("<QQQIIII14I")
END = 13  # the stamp of the block's end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    data = open(a.file, "rb").read()
    launches = defaultdict(list)
    for off in range(0, len(data) - REC.size + 1, REC.size):
        grid, t0, t1, kernel, block, smid, rows, *stamp = REC.unpack_from(data, off)
        launches[grid].append((t0, t1, kernel, block, smid, rows, stamp))
    print(f"{len(data) // REC.size} records, {len(launches)} grids")
    # A graph's kernel node keeps its %gridid over replays: a launch is a run of one grid's blocks that start
    # within 1 ms of each other (replays of a step are milliseconds apart).
    ls = []
    for grid, recs in launches.items():
        recs.sort()
        run = [recs[0]]
        for r in recs[1:] + [None]:
            if r is not None and r[0] - run[-1][0] < 1_000_000:
                run.append(r)
                continue
            ls.append({"t0": run[0][0], "t1": max(x[1] for x in run), "kernel": run[0][2], "rows": run[0][5],
                       "blocks": len(run), "recs": run})
            run = [r]
    ls.sort(key=lambda l: l["t0"])
    # Cycles per ns, from the blocks long enough to measure.
    rates = [r[6][END] / (r[1] - r[0]) for l in ls for r in l["recs"] if r[1] - r[0] > 5000 and r[6][END] > 0]
    ghz = statistics.median(rates) if rates else 1.98
    print(f"SM clock seen: {ghz:.3f} GHz (median of {len(rates)} blocks)")
    steps, cur = [], None
    for l in ls:
        if l["kernel"] == 1:
            cur = [l]
            steps.append(cur)
        elif cur is not None:
            cur.append(l)
    rowk = {3, 4, 5, 6, 7, 8, 10}
    keep = [s for s in steps[:-1] if all(l["rows"] == a.rows for l in s if l["kernel"] in rowk)]
    if not keep:
        print("no complete step with those rows")
        return
    n = statistics.mode(len(s) for s in keep)
    keep = [s for s in keep if len(s) == n][-a.steps:]
    print(f"{len(steps)} steps, {len(keep)} used ({n} launches each, rows {a.rows})")
    spans = [s[-1]["t1"] - s[0]["t0"] for s in keep]
    print(f"step span (first block start to last block end): median {statistics.median(spans) / 1e3:.1f} us")
    med = lambda xs: statistics.median(xs)
    per_kernel = defaultdict(lambda: [0, 0.0, 0.0])
    # adds_us: how much later this launch ends than every launch before it (its share of the step's critical path).
    print(f"{'#':>4} {'kernel':<20} {'blocks':>6} {'start_us':>9} {'dur_us':>7} {'gap_us':>7} {'blk_us':>7} "
          f"{'adds_us':>7}")
    for i in range(n):
        k = keep[0][i]["kernel"]
        start = med([s[i]["t0"] - s[0]["t0"] for s in keep]) / 1e3
        dur = med([s[i]["t1"] - s[i]["t0"] for s in keep]) / 1e3
        gap = med([s[i]["t0"] - max(l["t1"] for l in s[:i]) if i else 0 for s in keep]) / 1e3
        blk = med([med([r[1] - r[0] for r in s[i]["recs"]]) for s in keep]) / 1e3
        adds = med([s[i]["t1"] - max(l["t1"] for l in s[:i]) if i else s[0]["t1"] - s[0]["t0"] for s in keep]) / 1e3
        per_kernel[k][0] += 1
        per_kernel[k][1] += dur
        per_kernel[k][2] += adds
        print(f"{i:>4} {NAMES.get(k, k):<20} {keep[0][i]['blocks']:>6} {start:>9.1f} {dur:>7.2f} {gap:>7.2f} "
              f"{blk:>7.2f} {adds:>7.2f}")
    print("per kernel: launches, sum of durations (us), sum of critical-path shares (adds_us)")
    for k, (c, d, g) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"  {NAMES.get(k, k):<20} {c:>4} {d:>9.1f} {g:>9.1f}")
    for k, names in PHASES.items():
        vals = defaultdict(list)
        for s in keep:
            for l in s:
                if l["kernel"] != k:
                    continue
                for r in l["recs"]:
                    for j, nm in enumerate(names):
                        if 0 < r[6][j] < 2_000_000_000:
                            vals[nm].append(r[6][j] / ghz / 1e3)
                    vals["end"].append(r[6][END] / ghz / 1e3)
                vals["start_spread"].append((max(r[0] for r in l["recs"]) - l["t0"]) / 1e3)
        if vals:
            print(f"{NAMES[k]} phases (us since each block's start; median / p90 over blocks and launches):")
            for nm in names + ["end", "start_spread"]:
                v = sorted(vals[nm])
                if v:
                    print(f"  {nm:<13} {med(v):7.2f} {v[int(0.9 * (len(v) - 1))]:7.2f}")


if __name__ == "__main__":
    sys.exit(main())
