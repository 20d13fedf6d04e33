"""The tiles' L2 hint (evict_last loads, each line demoted after use) against plain loads,
on the latency suite's own workloads (issue 19).

    python bench/tile_hint_ab.py [--reps 150] [--passes 2]

Why: bench/load_hints.py measured the hint 1.3-1.9% faster at W2a / W2b (out of place) on
its own inputs, but the latency suite run after it became the default (run 7 of the
twentieth session) showed no gain at W2a / W2b and 0.9-1.0 us more at 128 MB and W4
against an earlier run's. Here both settings are columns of one row, in turns, on the
suite's inputs (run.py's workload builders): auto out of place and in place, each with the
hint (the default) and with plain loads (set_tile_evict_last(False)), beside torch.compile
and the same-size copy; `--passes` times every row again, to see how far a row moves
between passes.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
import timing  # noqa: E402
from run import Peers, latency_qk_workload, latency_sbhd_workload, latency_x_workload  # noqa: E402
from timing import graph_us_interleaved, switched  # noqa: E402

KEEP = ("rope_ext auto", "rope_ext auto (in place)", "torch.compile", "same-size copy")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=150)
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("tile_hint_ab.py needs a GPU")
    peers = Peers()
    hint = rope_ext._C.set_tile_evict_last
    builders = [lambda: latency_x_workload("bshd", torch.bfloat16, 16384, peers),
                lambda: latency_x_workload("bshd", torch.bfloat16, 65536, peers),
                lambda: latency_sbhd_workload("W2a", (4096, 1, 128, 128), peers),
                lambda: latency_sbhd_workload("W2b", (512, 32, 24, 128), peers),
                lambda: latency_qk_workload(8192, peers)]
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; flush {timing.FLUSH}")
    print(f"us, median of {args.reps} replays per column, columns in turns; plain = set_tile_evict_last(False)")
    cols = ["auto", "auto plain", "auto ip", "auto ip plain", "torch.compile", "copy"]
    print(f"  {'workload':<38}{'pass':>5}" + "".join(f"{c:>15}" for c in cols) + f"{'plain/hint':>12}{'ip plain/hint':>15}")
    for build in builders:
        name, _, fns = build()
        fns = {k: f for k, f in fns.items() if k in KEEP}
        sel = {"auto": fns["rope_ext auto"],
               "auto plain": switched(hint, False, True, fns["rope_ext auto"]),
               "auto ip": fns["rope_ext auto (in place)"],
               "auto ip plain": switched(hint, False, True, fns["rope_ext auto (in place)"]),
               "copy": fns["same-size copy"]}
        if "torch.compile" in fns:
            sel["torch.compile"] = fns["torch.compile"]
        for p in range(args.passes):
            got, errs = graph_us_interleaved(sel, args.reps)
            for col, e in errs.items():
                print(f"  {col} failed: {e}")
            cells = "".join(f"{got[c]:>15.2f}" if c in got else f"{'-':>15}" for c in cols)
            print(f"  {name:<38}{p:>5}{cells}{got['auto plain'] / got['auto']:>11.3f}x"
                  f"{got['auto ip plain'] / got['auto ip']:>14.3f}x", flush=True)


if __name__ == "__main__":
    main()
