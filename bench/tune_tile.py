"""Tile size of variant 4 (fp32x4_tile): rows per thread, swept on issue 4's workloads.

    python bench/tune_tile.py

A tile holds rows_per_thread x blockDim.y rows. Small tiles: more blocks, a short tail
after the last full wave, but more sin/cos per row (the table is per tile) and more
block starts. Large tiles: the reverse. Same timer as bench/run.py (L2 flushed)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from rope_ext._ops import ops  # noqa: E402


def workloads():
    dev = "cuda"
    w = []
    for name, shape, layout in [("W1", (4, 4096, 32, 128), "bshd"), ("W2a", (4096, 1, 128, 128), "sbhd"),
                                ("W2b", (512, 32, 24, 128), "sbhd")]:
        x = torch.randn(*shape, device=dev).bfloat16()
        x4 = x.permute(1, 0, 2, 3) if layout == "sbhd" else x
        w.append((name, 4 * x.numel(), lambda i, x4=x4: ops.rope(x4, *bench.op_opts(False, i))))
    x = torch.randn(128, 8192, 128, device=dev)
    w.append(("W3", 8 * x.numel(), lambda i, x=x: rope_ext.rope(x, impl=i)))
    cache = ref.cos_sin_table(128, 10000.0, 131072, dev)
    for T, name in ((8192, "W4"), (16, "W5")):
        q = torch.randn(T, 32, 128, device=dev).bfloat16()
        k = torch.randn(T, 8, 128, device=dev).bfloat16()
        pos = torch.randint(0, 131072, (T,), device=dev)
        n = 4 * (q.numel() + k.numel())
        w.append((name, n, lambda i, q=q, k=k, pos=pos: rope_ext.apply_rope_qk(q, k, pos, layout="thd", impl=i,
                                                                                 inplace=True)))
        w.append((name + " cache", n, lambda i, q=q, k=k, pos=pos: rope_ext.apply_rope_qk(
            q, k, pos, layout="thd", impl=i, inplace=True, cos_sin_cache=cache)))
    return w


def main():
    timer = bench.Timer(reps=50)
    bw = bench.copy_bandwidth(timer)
    settings = [("fp32x4", 0)] + [("fp32x4_tile", r) for r in (1, 2, 4, 8, 16)]
    ws = workloads()
    print(f"{torch.cuda.get_device_name()}, copy {bw:.0f} GB/s; us (and % of copy) per workload")
    print(f"{'variant':<22}" + "".join(f"{n:>14}" for n, _, _ in ws))
    for impl, rpt in settings:
        rope_ext._C.set_tile_rows_per_thread(rpt)
        cells = []
        for _, nbytes, fn in ws:
            us = timer(lambda: fn(impl))
            cells.append(f"{us:8.1f} {100 * nbytes / us / 1e3 / bw:4.0f}%")
        label = impl if impl == "fp32x4" else f"tile rows/thread {rpt}"
        print(f"{label:<22}" + "".join(f"{c:>14}" for c in cells))
    rope_ext._C.set_tile_rows_per_thread(0)


if __name__ == "__main__":
    main()
