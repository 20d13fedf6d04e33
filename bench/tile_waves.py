"""Study: does one resident wave of long contiguous tiles cost DRAM bandwidth against
many waves of short ones, with the kernel otherwise the same? The fused norm + RoPE
forward ran one wave (its old tile rule: max(2 rows per team, one wave's share)) at ~88%
of a same-size copy in bf16 and fp32 alike, while the plain RoPE tile variant (4, many
waves of 2 rows a thread) reached 95.5% (bf16) / 98.4% (fp32) at this shape. Holding
sin/cos and weights in registers (fewer shared-memory reads) and a compact team (fewer
per-row steps per byte) had changed nothing, so the loop's work was not what held it. One
wave puts ~4 x 132 concurrent streams, each a tile of ~160 KB (bf16), across the whole
tensors; many short tiles launched in order keep the resident blocks on a moving window
of neighbouring rows. The answer (bench/NOTES.md, twelfth session of 2026-11-26, runs 2-3:
one wave costs ~8%) set the forward's tiles to 4 rows per team (norm_rope_dispatch.cu's
kFwdRowsPerTeam). The norm + RoPE columns run at the rule's ring depth for their tiles (2
for 16-bit tiles of < 4 rows per team, else 3).

Columns, timed in turns (timing.graph_us_interleaved: one call in a CUDA graph, L2
flushed before each replay), q [1, S, 32, 128] + k [1, S, 8, 128] out of place:
  - rope tile @N: the plain RoPE variant 4 (`impl="fp32x4_tile"`) with N rows per thread of a
    tile (`set_tile_rows_per_thread`; 2 the default; a large N gives one wave);
  - norm+rope rows/team R: the fused forward with R rows per team (-1: one wave);
  - the same-size copy.

    python bench/tile_waves.py [--dtype bf16,fp32] [--seqs 8192] [--tile 2,8,32,100000] [--norm 2,8,-1]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from timing import graph_us_interleaved, same_size_copy, switched  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--dtype", default="bf16,fp32")
    ap.add_argument("--seqs", default="8192")
    ap.add_argument("--tile", default="2,8,32,100000", help="rows per thread of the rope tile variant")
    ap.add_argument("--norm", default="2,8,-1", help="rows per team of the fused norm + rope forward")
    args = ap.parse_args()
    D, base = 128, 1e6
    for dname in args.dtype.split(","):
        dt = DTYPES[dname]
        for S in map(int, args.seqs.split(",")):
            torch.manual_seed(0)
            q = torch.randn(1, S, 32, D, device="cuda", dtype=dt)
            k = torch.randn(1, S, 8, D, device="cuda", dtype=dt)
            qw = (1 + 0.1 * torch.randn(D, device="cuda")).to(dt)
            kw = (1 + 0.1 * torch.randn(D, device="cuda")).to(dt)
            pos = torch.arange(S, device="cuda")[None]
            fns = {}
            for n in map(int, filter(None, args.tile.split(","))):
                fns[f"rope tile @{n}"] = switched(rope_ext._C.set_tile_rows_per_thread, n, 0,
                                                  lambda: rope_ext.apply_rope_qk(q, k, pos, base=base, impl="fp32x4_tile"))
            for r in map(int, filter(None, args.norm.split(","))):
                fns[f"norm+rope rows/team {r}"] = switched(
                    rope_ext._C.set_norm_rope_rows_per_team, r, 0,
                    lambda: rope_ext.rms_norm_rope_qk(q, k, qw, kw, pos, base=base))
            fns["same-size copy"] = same_size_copy(q.numel() + k.numel(), dt)
            got, errs = graph_us_interleaved(fns, args.reps)
            mb = (q.numel() + k.numel()) * q.element_size() / 2**20
            print(f"\nq [1, {S}, 32, {D}] + k [1, {S}, 8, {D}] {dname} ({mb:.0f} MB read, as much written), us "
                  "(% of the copy's time):")
            ref = got.get("same-size copy")
            for name in fns:
                if name in got:
                    pct = f"  {100 * ref / got[name]:>5.1f}%" if ref else ""
                    print(f"  {name:<26}{got[name]:>9.1f}{pct}")
                else:
                    print(f"  {name:<26}  n/a: {errs.get(name)}")


if __name__ == "__main__":
    main()
