"""Issue 19: why a small call with an index tensor (thd's cu_seqlens, a positions tensor)
runs ~0.3 us over the same bytes without one (thirty-third session: thd bf16 [64, 32, 128]
5.0 us against bshd's 4.7; rope_lean_plain1_kernel with the packed sequence's guess did
not close it, run 4). Is it where the index tensor lies? Each call on one x, timed as the
latency suite times (one call in a CUDA graph, the L2 flushed before each replay, the
columns in turns, median), the index tensor either its own allocation (as the suite's)
or in x's allocation past x's bytes (cu_seqlens right after them, positions 4 KiB further).
The caching allocator puts all of these small tensors in one 2 MiB segment of its small
pool (the run prints the regions); a third place, 32 MiB into a 64 MiB buffer of the large
pool ("far"), asks whether an index on another page than x's costs more:

    python bench/index_page.py [--reps 200] [--passes 2] [--sizes 16,64]

Columns: bshd (no index tensor, the plain kernel); thd with cu_seqlens [0, S]; bshd with
an int64 positions tensor 0..S-1; torch.compile of the cached formula; a same-size copy.
Every rope_ext column's output is compared with the plain call's first (a difference is
printed, bit-equal expected). The
addresses' 2 MiB and 64 KiB regions are printed (does the index share x's?)."""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
import run  # noqa: E402
from timing import graph_us_interleaved, same_size_copy  # noqa: E402


def region(t):
    p = t.data_ptr()
    return f"{p >> 21:#x}/{(p >> 16) & 31}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--sizes", default="16,64", help="tokens S of [S, 32, 128] bf16 (16: 0.125 MB)")
    args = ap.parse_args()
    H, D = 32, 128
    print(f"device: {torch.cuda.get_device_name()}; us, median of {args.reps} replays in turns")
    for S in (int(v) for v in args.sizes.split(",")):
        nx = S * H * D * 2
        buf = torch.empty(nx + 4096 + 8 * S, dtype=torch.uint8, device="cuda")
        x = buf[:nx].view(torch.bfloat16).view(S, H, D)
        x.copy_(torch.randn(S, H, D, device="cuda").bfloat16())
        xb = x.view(1, S, H, D)
        cu_own = torch.tensor([0, S], dtype=torch.int32, device="cuda")
        cu_in = buf[nx:nx + 8].view(torch.int32)
        cu_in.copy_(cu_own)
        pos_own = torch.arange(S, device="cuda")
        pos_in = buf[nx + 4096:nx + 4096 + 8 * S].view(torch.int64)
        pos_in.copy_(pos_own)
        far = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        cu_far = far[32 << 20:(32 << 20) + 8].view(torch.int32)
        cu_far.copy_(cu_own)
        pos_far = far[(32 << 20) + 4096:(32 << 20) + 4096 + 8 * S].view(torch.int64)
        pos_far.copy_(pos_own)
        cos, sin = run.hf_cos_sin(S, D, torch.bfloat16)
        c4, s4 = cos.view(S, 1, D), sin.view(S, 1, D)
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        fns = {"bshd, no index": lambda: rope_ext.apply_rope(xb),
               "thd, cu_seqlens own alloc": lambda: rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu_own),
               "thd, cu_seqlens after x": lambda: rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu_in),
               "bshd, positions own alloc": lambda: rope_ext.apply_rope(xb, pos_own),
               "thd, cu_seqlens far": lambda: rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu_far),
               "bshd, positions after x": lambda: rope_ext.apply_rope(xb, pos_in),
               "bshd, positions far": lambda: rope_ext.apply_rope(xb, pos_far)}
        want = fns["bshd, no index"]().view(S, H, D)
        for name, fn in fns.items():  # (reported, not raised: the timings still say where the time goes)
            got = fn().view(S, H, D)
            if not torch.equal(got, want):
                print(f"  S {S}: {name} DIFFERS from the plain call: max |d| "
                      f"{(got.float() - want.float()).abs().max().item():.3g}", flush=True)
        fns["torch.compile"] = lambda: comp(xb, c4, s4)
        fns["same-size copy"] = same_size_copy(x.numel(), torch.bfloat16)
        print(f"thd bf16 [{S}, {H}, {D}] ({nx / 2**20:.3f} MB); 2 MiB region/64 KiB block: x {region(x)}, "
              f"cu_seqlens own {region(cu_own)}, after x {region(cu_in)}, positions own {region(pos_own)}, "
              f"after x {region(pos_in)}, far {region(cu_far)} / {region(pos_far)}",
              flush=True)
        for ps in range(args.passes):
            got, errs = graph_us_interleaved(fns, args.reps)
            print(f"  pass {ps + 1}: " + "  ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
            for k, e in errs.items():
                print("   ", k, "failed:", str(e)[:80])


if __name__ == "__main__":
    main()
