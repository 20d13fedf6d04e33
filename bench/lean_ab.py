"""Issue 19: lean's position-free instance (kPlain) against its general instance, beside
torch.compile and a same-size copy, every column of a size timed in turns
(timing.graph_us_interleaved: one call in a CUDA graph, L2 flushed before each replay).

    python bench/lean_ab.py [--reps 200] [--sizes 16,64,256,1024]

bshd bf16 [1, S, 32, 128] out of place (no position tensor: the plain instance by
default, `set_lean_plain(False)` the general one), in place, and thd with cu_seqlens
(one packed sequence: always the general instance); then W5 (q [16, 32, 128] + k [16, 8,
128] in place at random positions: the general instance).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from run import hf_cos_sin  # noqa: E402
from timing import graph_us_interleaved, same_size_copy, switched  # noqa: E402


def knob(plain, f):
    """f with set_lean_plain(plain) around it (host side: the captured graph keeps the choice)."""
    return switched(rope_ext._C.set_lean_plain, plain, True, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--sizes", default="16,64,256,1024")
    ap.add_argument("--thd-sizes", default="256,1024", help="S of the thd forms' rows ('' = none)")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}; us, median of {args.reps} graph replays per column, "
          "cold L2, columns in turns")
    cols = ["plain", "general", "plain ip", "thd cu", "compile", "copy"]
    print(f"{'S':>6} {'MB':>6}" + "".join(f"{c:>9}" for c in cols))
    for S in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(1, S, 32, 128, device="cuda").bfloat16()
        xt = x.view(S, 32, 128).clone()
        cu = torch.tensor([0, S], dtype=torch.int32, device="cuda")
        cos, sin = hf_cos_sin(S, 128, x.dtype)
        c4, s4 = cos.view(1, S, 1, 128), sin.view(1, S, 1, 128)
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        want = rope_ext.apply_rope(x, impl="fp32x4_tile")
        for plain in (True, False):
            assert torch.equal(knob(plain, lambda: rope_ext.apply_rope(x))(), want), f"plain={plain}: bits"
        fns = {"plain": knob(True, lambda: rope_ext.apply_rope(x)),
               "general": knob(False, lambda: rope_ext.apply_rope(x)),
               "plain ip": knob(True, lambda: rope_ext.apply_rope(x, inplace=True)),
               "thd cu": lambda: rope_ext.apply_rope(xt, layout="thd", cu_seqlens=cu),
               "compile": lambda: comp(x, c4, s4),
               "copy": same_size_copy(x.numel(), x.dtype)}
        got, errs = graph_us_interleaved(fns, args.reps)
        print(f"{S:>6} {x.numel() * 2 / 2**20:>6.2f}" + "".join(f"{got[c]:>9.2f}" if c in got else f"{'n/a':>9}"
                                                           for c in cols), flush=True)
        for c, e in errs.items():
            print(f"   {c}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    # thd + cu_seqlens ran 0.2-2.7 us slower than bshd (more at more rows per thread; runs
    # 5-6 of 2026-11-26 (second)): the same tensor as bshd, as thd with cu_seqlens, with
    # positions, and under the tiles, to tell the tensor, the layout and the flag apart.
    for S in (int(s) for s in args.thd_sizes.split(",") if s):
        xt = torch.randn(S, 32, 128, device="cuda").bfloat16()
        cu = torch.tensor([0, S], dtype=torch.int32, device="cuda")
        ar = torch.arange(S, device="cuda")
        fns = {"bshd view": lambda: rope_ext.apply_rope(xt.view(1, S, 32, 128)),
               "thd cu": lambda: rope_ext.apply_rope(xt, layout="thd", cu_seqlens=cu),
               "thd pos": lambda: rope_ext.apply_rope(xt, ar, layout="thd"),
               "thd cu tiles": lambda: rope_ext.apply_rope(xt, layout="thd", cu_seqlens=cu, impl="fp32x4_tile"),
               "copy": same_size_copy(xt.numel(), xt.dtype)}
        got, _ = graph_us_interleaved(fns, args.reps)
        print(f"thd forms, S {S} ({xt.numel() * 2 / 2**20:.2f} MB): " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()),
              flush=True)
    q = torch.randn(16, 32, 128, device="cuda").bfloat16()
    k = torch.randn(16, 8, 128, device="cuda").bfloat16()
    pos = torch.randint(0, 131072, (16,), device="cuda")
    got, _ = graph_us_interleaved({"W5 ip": lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True),
                                   "copy": same_size_copy(q.numel() + k.numel(), q.dtype)}, args.reps)
    print(f"W5 q[16,32,128]+k[16,8,128] in place at random positions: {got.get('W5 ip', float('nan')):.2f} us "
          f"(copy {got.get('copy', float('nan')):.2f})")


if __name__ == "__main__":
    main()
