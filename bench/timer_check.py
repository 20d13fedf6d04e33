"""How fine graph_us's samples are: the distinct values of its per-replay event times.

    python bench/timer_check.py [--reps 400]

For a few small calls (a same-size copy, rope_ext's lean call, torch.compile's kernel) it
prints the median (graph_us's statistic), the mean, the 10%-trimmed mean, and the most
common sample values with their counts, then the smallest gap between distinct values:
if the event timer ticks coarsely (CUDA documents ~0.5 us for events), medians of
sub-microsecond differences snap to ticks and only the spread of the samples (the mean)
resolves them. Issue 19's study compares kernels 0.1-0.5 us apart (bench/NOTES.md,
session of 2026-11-26).
"""
import argparse
import collections
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from timing import graph_samples, same_size_copy  # noqa: E402


def report(name, ts):
    ts = sorted(ts)
    k = len(ts) // 10
    trimmed = statistics.mean(ts[k:len(ts) - k])
    common = collections.Counter(round(t, 3) for t in ts).most_common(6)
    print(f"{name:<34} median {statistics.median(ts):6.3f}  mean {statistics.mean(ts):6.3f}  trimmed {trimmed:6.3f}  "
          f"min {ts[0]:6.3f}  | " + "  ".join(f"{v:.3f}x{c}" for v, c in common), flush=True)
    return sorted(set(round(t, 4) for t in ts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=400)
    args = ap.parse_args()
    D, H = 128, 32
    distinct = []
    for S in (16, 64):
        x = torch.randn(1, S, H, D, device="cuda").bfloat16()
        distinct += report(f"copy [1,{S},32,128] bf16", graph_samples(same_size_copy(x.numel(), x.dtype), args.reps))
        distinct += report(f"rope_ext bshd [1,{S},32,128]", graph_samples(lambda: rope_ext.apply_rope(x), args.reps))
        emb = torch.arange(S, device="cuda").float()[:, None] * rope_ext.inv_freq(D, device="cuda")
        emb = torch.cat([emb, emb], -1)
        c, s_ = emb.cos().bfloat16().view(1, S, 1, D), emb.sin().bfloat16().view(1, S, 1, D)
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        distinct += report(f"torch.compile [1,{S},32,128]", graph_samples(lambda: comp(x, c, s_), args.reps))
    gaps = sorted({round(b - a, 4) for a, b in zip(distinct, distinct[1:]) if b - a > 1e-4})
    print("smallest gaps between distinct sample values (us):", gaps[:8])


if __name__ == "__main__":
    main()
