"""The floor under a small call in this harness (issues 18, 19: append_kv T = 16 <= 4 us,
small rope ahead of torch.compile): what a launch costs, and what each DRAM round trip
on a kernel's dependent chain adds, timed as the suites time (one call in a CUDA graph,
the L2 flushed before every replay, the median; bench/timing.py's graph_us).

    python bench/latency_floor.py [--reps 200]

Rows (Triton kernels, one warp, 128 B stored):
  store only                 the launch, one store: nothing on the chain
  chain of n loads           n dependent loads, each from another 4 KB line of a cold
                             buffer (load i's value is load i+1's index), then the store
  n independent loads        the same n lines loaded at once, summed, stored
and rope_ext's small calls beside them: append_kv T = 16 (16 sequences of one token,
varlen as the attn suite, and batched [16, 1]) and the rope of [1, 16, 32, 128] bf16.
The marginal cost of one round trip tells how many a call may have on its chain and
stay under a target: a varlen append needs cu_seqlens -> the sequence's cache length
-> its slot before its stores.
"""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from timing import graph_us  # noqa: E402

DEV = "cuda"
STRIDE = 1024  # int32 elements between the lines a chain visits (4 KB)


@triton.jit
def _chain(a_ptr, out_ptr, N: tl.constexpr):
    i = tl.zeros((), dtype=tl.int32)
    for _ in tl.static_range(N):
        i = tl.load(a_ptr + i)
    offs = tl.arange(0, 32)
    tl.store(out_ptr + offs, offs + i)


@triton.jit
def _parallel(a_ptr, out_ptr, N: tl.constexpr, STRIDE: tl.constexpr):
    s = tl.zeros((), dtype=tl.int32)
    for j in tl.static_range(N):
        s += tl.load(a_ptr + j * STRIDE)
    offs = tl.arange(0, 32)
    tl.store(out_ptr + offs, offs + s)


def cases():
    a = torch.zeros(16 * STRIDE, dtype=torch.int32, device=DEV)
    a[torch.arange(15, device=DEV) * STRIDE] = (torch.arange(15, device=DEV, dtype=torch.int32) + 1) * STRIDE
    out = torch.empty(32, dtype=torch.int32, device=DEV)
    rows = [("store only (Triton, 1 warp)", lambda: _chain[(1,)](a, out, N=0, num_warps=1))]
    for n in (1, 2, 3, 4):
        rows.append((f"chain of {n} dependent load{'s' if n > 1 else ''}",
                     lambda n=n: _chain[(1,)](a, out, N=n, num_warps=1)))
    for n in (2, 4):
        rows.append((f"{n} independent loads", lambda n=n: _parallel[(1,)](a, out, N=n, STRIDE=STRIDE, num_warps=1)))
    Hk, D = 8, 128
    k = torch.randn(16, Hk, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc = torch.zeros(16, 4096 + 1, Hk, D, device=DEV, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    before = torch.randint(0, 4096, (16,), dtype=torch.int32, device=DEV)
    cu = torch.arange(17, dtype=torch.int32, device=DEV)
    rows.append(("append_kv T=16 varlen (16 sequences)", lambda: rope_ext.append_kv(k, v, kc, vc, before, cu_seqlens=cu)))
    kb, vb = k.view(16, 1, Hk, D), v.view(16, 1, Hk, D)
    rows.append(("append_kv T=16 batched [16, 1]", lambda: rope_ext.append_kv(kb, vb, kc, vc, before)))
    x = torch.randn(1, 16, 32, 128, device=DEV, dtype=torch.bfloat16)
    rows.append(("rope [1,16,32,128] bf16 out of place", lambda: rope_ext.apply_rope(x)))
    rows.append(("rope [1,16,32,128] bf16 in place", lambda: rope_ext.apply_rope(x, inplace=True)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}")
    print("us: one call in a CUDA graph after the suites' L2 flush, median of", args.reps)
    base = None
    for name, fn in cases():
        try:
            us = graph_us(fn, args.reps)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:<44} n/a: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        base = us if base is None else base
        print(f"  {name:<44}{us:>8.2f}{us - base:>+8.2f} over the store-only kernel")


if __name__ == "__main__":
    main()
