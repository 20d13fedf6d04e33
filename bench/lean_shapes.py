"""Where auto's lean kernel (variant 6) meets shapes the latency suite never had: few heads
per token, and fp32 past lean's old 16 MB limit (issue 19; bench/NOTES.md, twenty-second
session).

    python bench/lean_shapes.py [--rows all|NAME,...] [--reps 100] [--min-threads T,BYTES]

Lean's block holds one token's rows (rope_variants.cuh): with one head unfolded (B = 1, or
per-batch positions) a bf16 block is 16 threads, with two 32. From the twenty-first
session auto ran 16-bit tensors of every size on lean, these calls too; since the
twenty-second a token under 64 threads takes the tiles (variant 4) past 256 KB, and fp32
has no size limit on lean; since the twenty-third a one-head call whose positions the
batch shares runs as one token of B rows (the one-head fold), rows a thread stop at
64-thread blocks, and a block of one row slot computes sin/cos per lane; since the
twenty-fourth a block of a token under 64 threads takes consecutive tokens up to 64
(set_lean_tokens_per_block); since the twenty-fifth such a token's thread covers its rows
past 32 MB too. Columns, in order, timed in turns
(timing.graph_us_interleaved, one x for all): auto; the tiles (impl="fp32x4_tile"); lean
forced (no size limit, no small-block limit, and with it one token a block); auto without
the one-head fold (set_lean_fold_one_head(False)); auto at one token a block (the rule
before the twenty-fourth session: a token under 64 threads past 256 KB takes the tiles);
lean forced at 4 / 8 tokens a block (fewer where 128 threads or S do not allow it; with the
limits off these take the rows-a-thread rule of tokens of 64 threads or more: U = 1 for
small grids, up to 8 for large ones, 2 past 32 MB; since run 6 of the twenty-fourth session
a block's row slots make room for the tokens); auto at 2 / 8 rows a thread
(set_lean_rows_per_thread); 4 tokens a block at 8 rows a thread;
torch.compile of the cached formula (its own output); the same-size copy. Per row: the
launches (last_lean_launch: grid, rows a thread, width, tokens a block; zeros: the tiles
ran) and the lean outputs against the tiles'.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
import timing  # noqa: E402
from run import hf_cos_sin  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from timing import same_size_copy, switched_many  # noqa: E402

# name: (dtype, [B, S, H, D]) bshd
ROWS = {
    "h1_bf16_0.125MB": (torch.bfloat16, (1, 512, 1, 128)),
    "h1_bf16_1MB": (torch.bfloat16, (1, 4096, 1, 128)),   # B = 1: nothing to fold
    "h1b1_bf16_4MB": (torch.bfloat16, (1, 16384, 1, 128)),
    "h1b1_bf16_32MB": (torch.bfloat16, (1, 131072, 1, 128)),
    "h1b1_bf16_122MB": (torch.bfloat16, (1, 500000, 1, 128)),  # S / 8 <= 65535
    "h2b1_bf16_4MB": (torch.bfloat16, (1, 8192, 2, 128)),
    "h1b1_fp32_4MB": (torch.float32, (1, 8192, 1, 128)),
    "h1b1_fp32_0.5MB": (torch.float32, (1, 1024, 1, 128)),
    # shapes the twenty-fourth session's few-row rule reaches (a thread takes the token's rows)
    "h3_bf16_3MB": (torch.bfloat16, (1, 4096, 3, 128)),
    "h3_bf16_48MB": (torch.bfloat16, (16, 4096, 3, 128)),
    "h2b1_fp32_8MB": (torch.float32, (1, 8192, 2, 128)),
    "h2_fp32_32MB": (torch.float32, (4, 8192, 2, 128)),
    "h4_d64_bf16_4MB": (torch.bfloat16, (1, 8192, 4, 64)),
    "h2_d64_bf16_32MB": (torch.bfloat16, (16, 8192, 2, 64)),
    # past 32 MB a thread on all of a few-row token's rows (twenty-fifth session)
    "h3_fp32_48MB": (torch.float32, (4, 8192, 3, 128)),
    "h6_d64_bf16_48MB": (torch.bfloat16, (8, 8192, 6, 64)),
    # the one-head fold past 32 MB with a few batch rows (review of the twenty-fifth session)
    "h1b3_bf16_48MB": (torch.bfloat16, (3, 65536, 1, 128)),
    "h1b6_d64_bf16_48MB": (torch.bfloat16, (6, 65536, 1, 64)),
    "h1_bf16_4MB": (torch.bfloat16, (4, 4096, 1, 128)),
    "h1_bf16_8MB": (torch.bfloat16, (8, 4096, 1, 128)),
    "h1_bf16_32MB": (torch.bfloat16, (32, 4096, 1, 128)),
    "h1_bf16_128MB": (torch.bfloat16, (128, 4096, 1, 128)),
    "seed_bf16_256MB": (torch.bfloat16, (128, 8192, 1, 128)),
    "h2_bf16_128MB": (torch.bfloat16, (64, 4096, 2, 128)),
    "h2_bf16_4MB": (torch.bfloat16, (2, 4096, 2, 128)),
    "h2_bf16_32MB": (torch.bfloat16, (16, 4096, 2, 128)),
    "h4_bf16_4MB": (torch.bfloat16, (1, 4096, 4, 128)),
    "h4_bf16_32MB": (torch.bfloat16, (8, 4096, 4, 128)),
    "h4_bf16_128MB": (torch.bfloat16, (32, 4096, 4, 128)),
    "h8_bf16_8MB": (torch.bfloat16, (1, 4096, 8, 128)),   # k alone under GQA 8
    "h8_bf16_32MB": (torch.bfloat16, (4, 4096, 8, 128)),
    "h8_bf16_128MB": (torch.bfloat16, (16, 4096, 8, 128)),
    "h32_bf16_128MB": (torch.bfloat16, (4, 4096, 32, 128)),
    "h1_fp32_4MB": (torch.float32, (8, 1024, 1, 128)),
    "h32_fp32_32MB": (torch.float32, (1, 2048, 32, 128)),
    "h32_fp32_128MB": (torch.float32, (1, 8192, 32, 128)),
    "h8_fp32_128MB": (torch.float32, (4, 8192, 8, 128)),
    "seed_fp32_512MB": (torch.float32, (128, 8192, 1, 128)),
}


def columns(name, min_threads):
    dtype, shape = ROWS[name]
    B, S, H, D = shape
    x = torch.randn(*shape, device="cuda").to(dtype)
    cos, sin = hf_cos_sin(S, D, dtype)
    c4, s4 = cos.view(S, 1, D), sin.view(S, 1, D)
    torch._dynamo.reset()
    comp = torch.compile(ref.apply_cos_sin, dynamic=False)
    C = rope_ext._C
    fns = {"auto": lambda: rope_ext.apply_rope(x),
           "tiles": lambda: rope_ext.apply_rope(x, impl="fp32x4_tile"),
           "lean forced": switched_many(((C.set_lean_max_bytes, 1 << 40, -1),
                                         (lambda v: C.set_lean_min_threads(*v), (0, 0), min_threads)),
                                        lambda: rope_ext.apply_rope(x)),
           # auto without the one-head fold (set_lean_fold_one_head, on by default since the
           # twenty-third session: a one-head call as one token of B rows)
           "no fold": switched_many(((C.set_lean_fold_one_head, False, True),),
                                    lambda: rope_ext.apply_rope(x)),
           # one token a block: auto before the twenty-fourth session
           "tpb 1": switched_many(((C.set_lean_tokens_per_block, 1, 0),), lambda: rope_ext.apply_rope(x)),
           **{f"tpb {n}": switched_many(((C.set_lean_max_bytes, 1 << 40, -1),
                                        (lambda v: C.set_lean_min_threads(*v), (0, 0), min_threads),
                                        (C.set_lean_tokens_per_block, n, 0)),
                                       lambda: rope_ext.apply_rope(x)) for n in (4, 8)},
           # auto at 2 / 8 rows a thread (set_lean_rows_per_thread; a one-row token then takes the
           # instance that loads x before its frequencies, a two-row one shares its sin/cos)
           **{f"U={n}": switched_many(((C.set_lean_rows_per_thread, n, 0),), lambda: rope_ext.apply_rope(x))
              for n in (2, 8)},
           # 4 tokens a block at 8 rows a thread, no limits (the block's row slots give way to the tokens)
           "tpb 4 U=8": switched_many(((C.set_lean_max_bytes, 1 << 40, -1),
                                       (lambda v: C.set_lean_min_threads(*v), (0, 0), min_threads),
                                       (C.set_lean_tokens_per_block, 4, 0), (C.set_lean_rows_per_thread, 8, 0)),
                                      lambda: rope_ext.apply_rope(x)),
           "compile": lambda: comp(x, c4, s4),
           "copy": same_size_copy(x.numel(), dtype)}
    rope_ext.apply_rope(x)
    torch.cuda.synchronize()
    auto_launch = C.last_lean_launch()
    want = rope_ext.apply_rope(x, impl="fp32x4_tile")
    got = fns["lean forced"]()
    torch.cuda.synchronize()
    forced_launch = C.last_lean_launch()
    diff = (got.float() - want.float()).abs().max().item()
    got = fns["no fold"]()
    torch.cuda.synchronize()
    fold_launch = C.last_lean_launch()
    diff = max(diff, (got.float() - want.float()).abs().max().item())
    return x, fns, auto_launch, forced_launch, fold_launch, diff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="all")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--min-threads", default="", help="THREADS,FROM_BYTES: auto's small-block limit for this run")
    args = ap.parse_args()
    # the limit auto runs with ("lean forced" switches it off and back to this)
    mt = tuple(int(v) for v in args.min_threads.split(",")) if args.min_threads else (-1, -1)
    mt = mt if len(mt) == 2 else (mt[0], 0)
    rope_ext._C.set_lean_min_threads(*mt)
    names = list(ROWS) if args.rows == "all" else args.rows.split(",")
    print(f"device: {torch.cuda.get_device_name()}; flush {timing.FLUSH}; us, median of {args.reps} replays, in turns")
    print("launch: (grid x, y, z, rows a thread, width, tokens a block); zeros: the tiles ran")
    for name in names:
        x, fns, al, fl, hl, diff = columns(name, mt)
        mb = x.numel() * x.element_size() / 2**20
        got, errs = timing.graph_us_interleaved(fns, args.reps)
        cells = "  ".join(f"{c} {got[c]:.2f}" for c in fns if c in got)
        print(f"{name:<18} {str(ROWS[name][1]):<22} {mb:8.3g} MB  {cells}", flush=True)
        print(f"    auto launch {al}  forced {fl}  no fold {hl}  max |lean - tiles| {diff:g}"
              + "".join(f"; {c} failed: {str(e)[:60]}" for c, e in errs.items()), flush=True)


if __name__ == "__main__":
    main()
