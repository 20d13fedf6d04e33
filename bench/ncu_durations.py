"""Kernel durations from an ncu CSV log, grouped into runs of consecutive launches of the
same kernel and grid (one timing of a bench script is one such run).

    ncu --clock-control none --cache-control all --metrics gpu__time_duration.sum --csv \
        --log-file ncu.csv python bench/small_rope_study.py --reps 5 ...
    python bench/ncu_durations.py ncu.csv

ncu times each kernel alone, its caches flushed first (--cache-control all), to the
nanosecond, without the graph launch around it: the resolution graph_us's event timer
lacks for kernels 0.1-0.5 us apart (bench/timer_check.py). Fill, sleep and reduction
kernels (the bench's L2 flush and spin) are left out.
"""
import csv
import statistics
import sys

SKIP = ("FillFunctor", "fill_kernel", "spin", "sleep", "reduce_kernel")


def main(path):
    rows = []
    with open(path) as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages are not quoted
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"]
        if any(s in name for s in SKIP):
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        us = v / 1e3 if unit.startswith("n") else v * 1e3 if unit.startswith("m") else v
        rows.append((name, r.get("Grid Size", ""), r.get("Block Size", ""), us))
    runs = []
    for name, grid, block, us in rows:
        if runs and runs[-1][0] == (name, grid, block):
            runs[-1][1].append(us)
        else:
            runs.append(((name, grid, block), [us]))
    print(f"{'#':>3} {'n':>3} {'median us':>10} {'min us':>8}  grid / block  kernel")
    for i, ((name, grid, block), ts) in enumerate(runs):
        short = name.split("(")[0][-70:]
        print(f"{i:>3} {len(ts):>3} {statistics.median(ts):>10.3f} {min(ts):>8.3f}  {grid} / {block}  {short}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ncu.csv")
