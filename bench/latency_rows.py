"""A few rows of the latency suite, built by run.py's own workload builders and timed the
same way (timing.graph_us_interleaved: one call in a CUDA graph, L2 flushed before each
replay, the columns in turns, median): for a run with little device time left, where the
whole suite (`run.py --suite latency --quick`) does not fit.

    python bench/latency_rows.py [--rows W4,W2a,W2b,128] [--reps 100]

Rows: W4 (q [8192, 32, 128] + k [8192, 8, 128] thd), W5 (the same at 16 tokens), W2a / W2b
(sbhd bf16), N (MB of bshd bf16 [1, S, 32, 128])."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402
import timing  # noqa: E402


def builder(name, peers):
    if name in ("W4", "W5"):
        return lambda: run.latency_qk_workload(8192 if name == "W4" else 16, peers)
    if name in ("W2a", "W2b"):
        shape = (4096, 1, 128, 128) if name == "W2a" else (512, 32, 24, 128)
        return lambda: run.latency_sbhd_workload(name, shape, peers)
    S = int(name) * 2**20 // (32 * 128 * 2)
    return lambda: run.latency_x_workload("bshd", torch.bfloat16, S, peers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="W4,W2a,128")
    ap.add_argument("--reps", type=int, default=100)
    args = ap.parse_args()
    peers = run.Peers()
    print(f"device: {torch.cuda.get_device_name()}; flush {timing.FLUSH}; us, median of {args.reps} replays, in turns")
    for name in args.rows.split(","):
        title, _, fns = builder(name, peers)()
        got, errs = timing.graph_us_interleaved(fns, args.reps)
        print(title, flush=True)
        for k, v in got.items():
            print(f"    {k:<34}{v:>9.2f}", flush=True)
        for k, e in errs.items():
            print("   ", k, "failed:", str(e)[:80])
    peers.report()


if __name__ == "__main__":
    main()
