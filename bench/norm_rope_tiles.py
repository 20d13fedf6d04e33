"""The fused q/k RMSNorm + RoPE kernels' tile size (rows per team of a block's tile:
`rope_ext._C.set_norm_rope_rows_per_team`, -1 = one resident wave of blocks) and rows in
flight per team (`set_norm_rope_stages`: 1 the register prefetch, 2-4 the cp.async ring), forward
and backward, against torch.compile of HF's formula, every column of a table timed in
turns (timing.graph_us_interleaved: one call in a CUDA graph, L2 flushed before each
replay), on the variants suite's Qwen3 shape and a small one.

    python bench/norm_rope_tiles.py [--reps 100] [--fwd 1,2,4,8,-1] [--bwd 2,4,8,16,-1] [--no-bwd]
    ncu -k regex:norm_rope_kernel ... python bench/norm_rope_tiles.py --profile [--stages 1,4]

The backward is timed alone (rope_ext's backward op on saved tensors; torch.compile's
formula differentiated by autograd has no such split, so its column is fwd+bwd) and
as fwd+bwd through autograd at the rule's tiles.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext._args import _op_options  # noqa: E402
from timing import graph_us_interleaved, same_size_copy, switched  # noqa: E402
from variants import _cos_sin, _fwd_bwd, hf_norm_rope  # noqa: E402


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def with_rows(k, f):
    """f with set_norm_rope_rows_per_team(k) around it (host side: a captured graph keeps it)."""
    return switched(rope_ext._C.set_norm_rope_rows_per_team, k, 0, f)


def with_stages(k, f):
    """f with set_norm_rope_stages(k) around it: rows in flight per team (1 registers, 2-4 the ring)."""
    return switched(rope_ext._C.set_norm_rope_stages, k, 0, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--fwd", default="1,2,4,8,-1")
    ap.add_argument("--bwd", default="2,4,8,16,-1")
    ap.add_argument("--seqs", default="8192,512")
    ap.add_argument("--stages", default="1,2,3,4", help="rows in flight per team at the rule's tiles")
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    ap.add_argument("--no-bwd", action="store_true", help="the forward table only")
    ap.add_argument("--profile", action="store_true",
                    help="for ncu: per --stages depth the forward twice, then the backward twice, at the first --seqs, "
                         "nothing timed")
    args = ap.parse_args()
    if args.profile:
        S, D = int(args.seqs.split(",")[0]), 128
        dt = DTYPES[args.dtype]
        q = torch.randn(1, S, 32, D, device="cuda", dtype=dt)
        k = torch.randn(1, S, 8, D, device="cuda", dtype=dt)
        w = [(1 + 0.1 * torch.randn(D, device="cuda")).to(dt) for _ in range(2)]
        pos = torch.arange(S, device="cuda")[None]
        opts = _op_options("bshd", pos, None, 1e6, "auto", None, None, False, None, None)
        for st in map(int, filter(None, args.stages.split(","))):  # per depth: 2 forward, then 2 backward launches
            for _ in range(2):
                with_stages(st, lambda: rope_ext.rms_norm_rope_qk(q, k, *w, pos, base=1e6))()
            for _ in range(2):
                with_stages(st, lambda: rope_ext._C.norm_rope_backward_direct([q, k], [q, k], w, 1e-6, 0.0, *opts))()
        torch.cuda.synchronize()
        return
    dev, D = "cuda", 128
    dt = DTYPES[args.dtype]
    base = 1e6
    for S in map(int, args.seqs.split(",")):
        torch.manual_seed(0)
        q = torch.randn(1, S, 32, D, device=dev, dtype=dt)
        k = torch.randn(1, S, 8, D, device=dev, dtype=dt)
        qw = (1 + 0.1 * torch.randn(D, device=dev)).to(dt)
        kw = (1 + 0.1 * torch.randn(D, device=dev)).to(dt)
        pos = torch.arange(S, device=dev)[None]
        cos, sin = _cos_sin(pos, rope_ext.inv_freq(D, base), dt)
        mb = (q.numel() + k.numel()) * q.element_size() / 2**20
        comp = torch.compile(hf_norm_rope, dynamic=False)
        fwd = {"torch.compile": lambda: comp(q, k, qw, kw, cos, sin)}
        for r in map(int, filter(None, args.fwd.split(","))):
            fwd[f"rope_ext rows/team {r}"] = with_rows(r, lambda: rope_ext.rms_norm_rope_qk(q, k, qw, kw, pos,
                                                                                        base=base))
        for st in map(int, filter(None, args.stages.split(","))):
            fwd[f"rope_ext stages {st}"] = with_stages(st, lambda: rope_ext.rms_norm_rope_qk(q, k, qw, kw, pos,
                                                                                         base=base))
        fwd["rope_ext rule"] = lambda: rope_ext.rms_norm_rope_qk(q, k, qw, kw, pos, base=base)
        fwd["same-size copy"] = same_size_copy(q.numel() + k.numel(), dt)
        got, errs = graph_us_interleaved(fwd, args.reps)
        print(f"\nforward, q [1, {S}, 32, {D}] + k [1, {S}, 8, {D}] {args.dtype} ({mb:.0f} MB read, as much written), "
              "us:")
        for n in fwd:
            print(f"  {n:<28}{got[n]:>9.1f}" if n in got else f"  {n:<28}  n/a: {errs.get(n)}")
        if args.no_bwd:
            continue

        gq, gk = torch.randn_like(q), torch.randn_like(k)
        opts = _op_options("bshd", pos, None, base, "auto", None, None, False, None, None)
        bwd = {}
        for r in map(int, filter(None, args.bwd.split(","))):
            bwd[f"rope_ext bwd rows/team {r}"] = with_rows(r, lambda: rope_ext._C.norm_rope_backward_direct(
                [gq, gk], [q, k], [qw, kw], 1e-6, 0.0, *opts))
        for st in map(int, filter(None, args.stages.split(","))):
            bwd[f"rope_ext bwd stages {st}"] = with_stages(st, lambda: rope_ext._C.norm_rope_backward_direct(
                [gq, gk], [q, k], [qw, kw], 1e-6, 0.0, *opts))
        bwd["rope_ext bwd rule"] = lambda: rope_ext._C.norm_rope_backward_direct([gq, gk], [q, k], [qw, kw], 1e-6,
                                                                                 0.0, *opts)
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        qwg, kwg = qw.clone().requires_grad_(), kw.clone().requires_grad_()
        bwd["torch.compile fwd+bwd"] = _fwd_bwd(lambda: comp(qg, kg, qwg, kwg, cos, sin), (gq, gk),
                                                (qg, kg, qwg, kwg))
        bwd["rope_ext fwd+bwd (rule)"] = _fwd_bwd(lambda: rope_ext.rms_norm_rope_qk(qg, kg, qwg, kwg, pos, base=base),
                                                  (gq, gk), (qg, kg, qwg, kwg))
        got, errs = graph_us_interleaved(bwd, args.reps)
        print(f"backward ({mb:.0f} MB of dy and {mb:.0f} of x read, {mb:.0f} of dx written), us:")
        for n in bwd:
            print(f"  {n:<28}{got[n]:>9.1f}" if n in got else f"  {n:<28}  n/a: {errs.get(n)}")
        # Every tile size gives the same bits (the same arithmetic per row; dw summed in
        # another order: fp32 rounding only).
        outs = {r: with_rows(r, lambda: rope_ext._C.norm_rope_backward_direct([gq, gk], [q, k], [qw, kw], 1e-6, 0.0,
                                                                               *opts))()
                for r in (2, -1)}
        dx_same = all(torch.equal(a, b) for a, b in zip(outs[2][:2], outs[-1][:2]))
        dw_diff = max((a - b).abs().max().item() for a, b in zip(outs[2][2:], outs[-1][2:]))
        print(f"  dx bit-equal across tiles: {dx_same}; dw max diff {dw_diff:.3g} "
              f"(|dw| ~ {outs[2][2].abs().max().item():.3g})")


if __name__ == "__main__":
    main()
