"""Why torch.compile runs W2a / W2b out of place under the same-size copy, and rope_ext's tiles
(auto's kernel there until run 4) 2-3% over it (issue 19; bench/NOTES.md, twenty-first
session: the evict_last hint on x; auto's lean kernel since then level with the copy).

    python bench/w2_study.py [--sizes W2a,W2b,128] [--reps 100] [--flushes reset,reset+clean] [--code FILE]
    ncu --profile-from-start off --metrics ... python bench/w2_study.py --ncu W2b

Columns, timed in turns (timing.graph_us_interleaved), x the same tensor for all:
  - rope_ext auto, the tiles (auto's here until run 4) at 2 (their default) / 1 / 4 rows
    per thread (set_tile_rows_per_thread);
  - the lean kernel (auto's for 16-bit types since run 4) at width 16, and at 1 / 4 rows per
    thread (its rule: 2 past 32 MB);
  - torch.compile with its own output (the suite's column), and writing into `buf` (out.copy_(f(x))
    compiled: Inductor stores into buf directly);
  - torch's copy x -> buf; the suite's copy (its own buffers);
  - a minimal Triton RoPE x -> buf reading the same bf16 cos/sin rows as torch.compile, its x loads
    plain or with evict_last, its table loads with evict_last (as Inductor's) or plain, its
    stores plain or with evict_first (whether a hint that pins nothing buys the same), 8 rows
    a program.
Same output buffer, same input: if torch.compile -> buf is still under copy -> buf, its lead is
the kernel, not where its output lies; the Triton RoPE variants say which of its loads' hints
(if any) buys it. --code FILE: Inductor's generated code for the W2b call, to read its grid,
block and hints. --ncu W: each of those calls once inside the profiler range (NVTX-named).
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
import timing  # noqa: E402
from load_hints import workload  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from timing import graph_us_under, same_size_copy, switched, switched_many  # noqa: E402


@triton.jit
def _rope(x, out, cos, sin, G, S, BLOCK_R: tl.constexpr, XHINT: tl.constexpr, THINT: tl.constexpr,
          SHINT: tl.constexpr = 0):
    """Rows of 128 bf16 (neox halves), BLOCK_R rows a program; row r's position (r // G) % S
    (G: rows a token); cos / sin [S, 128] bf16 rows (halves equal), the first half read.
    XHINT / THINT: x's / the table's loads with evict_last; SHINT: the stores with evict_first
    (the output's dirty lines first out of L2, where the loads' lines stay normal)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, 64)
    a = r[:, None] * 128 + c[None, :]
    t = ((r // G) % S)[:, None] * 128 + c[None, :]
    if XHINT:
        x1 = tl.load(x + a, eviction_policy="evict_last").to(tl.float32)
        x2 = tl.load(x + a + 64, eviction_policy="evict_last").to(tl.float32)
    else:
        x1 = tl.load(x + a).to(tl.float32)
        x2 = tl.load(x + a + 64).to(tl.float32)
    if THINT:
        co = tl.load(cos + t, eviction_policy="evict_last").to(tl.float32)
        si = tl.load(sin + t, eviction_policy="evict_last").to(tl.float32)
    else:
        co = tl.load(cos + t).to(tl.float32)
        si = tl.load(sin + t).to(tl.float32)
    if SHINT:
        tl.store(out + a, (x1 * co - x2 * si).to(tl.bfloat16), eviction_policy="evict_first")
        tl.store(out + a + 64, (x2 * co + x1 * si).to(tl.bfloat16), eviction_policy="evict_first")
    else:
        tl.store(out + a, (x1 * co - x2 * si).to(tl.bfloat16))
        tl.store(out + a + 64, (x2 * co + x1 * si).to(tl.bfloat16))


def columns(name):
    """{column: fn} for one workload, and a check of the Triton RoPE against rope_ext."""
    x, layout, c4, s4 = workload(name)
    S = x.shape[0] if layout == "sbhd" else x.shape[1]
    G = x.numel() // (S * 128) if layout == "sbhd" else x.shape[2]  # rows a token
    cos2, sin2 = c4.reshape(S, 128), s4.reshape(S, 128)
    buf = torch.empty_like(x)
    torch._dynamo.reset()
    comp = torch.compile(ref.apply_cos_sin, dynamic=False)
    comp_into = torch.compile(lambda x, c, s, out: out.copy_(ref.apply_cos_sin(x, c, s)), dynamic=False)
    rows = x.numel() // 128
    set_rows = rope_ext._C.set_tile_rows_per_thread
    fns = {"rope_ext": lambda: rope_ext.apply_rope(x, layout=layout),
           "tiles": lambda: rope_ext.apply_rope(x, layout=layout, impl="fp32x4_tile")}
    for n in (1, 4):
        fns[f"tile {n} rows"] = switched(set_rows, n, 0, lambda: rope_ext.apply_rope(x, layout=layout,
                                                                                     impl="fp32x4_tile"))
    C = rope_ext._C
    # lean at any size (auto's since run 4 for 16-bit types): width, rows per thread (0: its rule)
    for w, u in ((16, 0), (8, 1), (8, 4)):
        fns[f"lean w{w} U{u or 'rule'}"] = switched_many(((C.set_lean_max_bytes, 1 << 40, -1), (C.set_lean_bytes, w, -1),
                                                          (C.set_lean_rows_per_thread, u, 0)),
                                                         lambda: rope_ext.apply_rope(x, layout=layout))
    fns["compile"] = lambda: comp(x, c4, s4)
    fns["compile->buf"] = lambda: comp_into(x, c4, s4, buf)
    fns["copy->buf"] = lambda: buf.copy_(x)
    fns["suite copy"] = same_size_copy(x.numel(), x.dtype)
    for br in (8,):  # (32 rows a program: 1-1.5% slower in run 2)
        for xh, th, sh, tag in ((0, 1, 0, "tbl last"), (0, 0, 0, "plain"), (1, 1, 0, "all last"),
                                (0, 0, 1, "st first"), (1, 1, 1, "last+st first")):
            fns[f"tri rope {br} {tag}"] = (lambda br=br, xh=xh, th=th, sh=sh: _rope[(rows // br,)](
                x, buf, cos2, sin2, G, S, BLOCK_R=br, XHINT=xh, THINT=th, SHINT=sh))
    # Check the Triton RoPE (fp32 math on bf16 tables, so ~1 bf16 ulp from rope_ext's).
    _rope[(rows // 8,)](x, buf, cos2, sin2, G, S, BLOCK_R=8, XHINT=0, THINT=1)
    err = (buf.float() - rope_ext.apply_rope(x, layout=layout).float()).abs().max().item()
    assert err < 0.07 * x.float().abs().max().item(), f"{name}: Triton RoPE off by {err}"
    # The lean columns against the tiles' output (the suite has them bit-equal at small sizes).
    want = rope_ext.apply_rope(x, layout=layout, impl="fp32x4_tile")
    for c in (c for c in fns if c.startswith("lean")):
        d = (fns[c]().float() - want.float()).abs().max().item()
        print(f"  {name} {c}: max |lean - tiles| = {d:g}")
    return x, layout, comp, (c4, s4), fns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="W2a,W2b,128", help="W1 / W2a / W2b, or N (MB) of bshd bf16 [1, S, 32, 128]")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--flushes", default="reset,reset+clean")
    ap.add_argument("--code", default="", help="write Inductor's code for the W2b call here")
    ap.add_argument("--ncu", default="", help="one workload: each column once in the profiler range")
    args = ap.parse_args()
    if args.ncu:
        *_, fns = columns(args.ncu)
        timing.profile_once(fns)
        return
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}")
    print(f"us, median of {args.reps} replays a column, columns in turns; buf: one output buffer shared")
    for name in (s for s in args.sizes.split(",") if s):
        x, layout, comp, (c4, s4), fns = columns(name)
        if args.code and name == "W2b":
            from torch._inductor.utils import run_and_get_code
            torch._dynamo.reset()
            _, code = run_and_get_code(torch.compile(ref.apply_cos_sin, dynamic=False), x, c4, s4)
            with open(args.code, "w") as f:
                f.write("\n\n".join(code))
        print(f"\n{name}: {layout} bf16 {list(x.shape)} ({x.numel() * 2 / 2**20:g} MB)")
        for label in args.flushes.split(","):
            got, errs = graph_us_under(fns, args.reps, label)
            print(f"  flush {label}" + "".join(f"; {c} failed: {e}" for c, e in errs.items()))
            for c in fns:
                if c in got:
                    print(f"    {c:<22}{got[c]:>9.2f}")


if __name__ == "__main__":
    main()
