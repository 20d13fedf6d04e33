"""Variant 6 (lean) by its launch choices, for issue 19's small and middle sizes: rows per
thread U (each thread computes its chunk's sin/cos once for its U rows), access width W
and the block's sin/cos table in shared memory (the default) or each lane's own (K1), out of place and in
place, beside Liger in place (when importable) and a same-size copy, timed as the
latency suite times (one call in a CUDA graph, L2 flushed, median).

    python bench/lean_sweep.py [--reps 100]

bshd bf16 [1, S, 32, 128]; "rule" is launch_lean's own choice (rope_dispatch.cu).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from timing import graph_us  # noqa: E402
from run import import_liger, hf_cos_sin  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--sizes", default="16,64,256,1024,4096", help="tokens S of [1, S, 32, 128] bf16")
    ap.add_argument("--widths", default="4,8,16", help="access widths W (bytes)")
    args = ap.parse_args()
    try:
        liger = import_liger()
    except Exception as e:  # optional peer
        print(f"Liger: n/a ({type(e).__name__})")
        liger = None
    C = rope_ext._C
    print(f"device: {torch.cuda.get_device_name()}; us, median of {args.reps} graph replays, cold L2")
    print(f"{'S':>6} {'MB':>6} {'W':>3} {'U':>5} {'oop':>7} {'ip':>7} {'oop K1':>7} {'ip K1':>7} {'Liger ip':>9} {'compile':>8} {'copy':>7}")
    for S in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(1, S, 32, 128, device="cuda").bfloat16()
        y = torch.empty_like(x)
        mb = x.numel() * 2 / 2**20
        copy = graph_us(lambda: y.copy_(x), args.reps)
        # torch.compile of the cached formula, out of place (the latency suite's peer)
        cos, sin = hf_cos_sin(S, 128, x.dtype)
        c4, s4 = cos.view(1, S, 1, 128), sin.view(1, S, 1, 128)
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        t_comp = graph_us(lambda: comp(x, c4, s4), args.reps)
        graph_us(lambda: y.copy_(x), 20)  # discarded: the first replays after a compile
        lig = float("nan")
        if liger is not None and S >= 2:
            h = S // 2
            cos, sin = hf_cos_sin(S, 128, x.dtype)
            xt = x.view(S, 32, 128)
            qb, kb = xt[:h].unsqueeze(0).transpose(1, 2), xt[h:2 * h].unsqueeze(0).transpose(1, 2)
            c, s_ = cos[:h].unsqueeze(0).contiguous(), sin[:h].unsqueeze(0).contiguous()
            lig = graph_us(lambda: liger.rope_forward(qb, kb, c, s_), args.reps)
        for W in (int(w) for w in args.widths.split(",")):
            for U in (0, 1, 2, 4, 8):
                C.set_lean_max_bytes(64 << 20)
                C.set_lean_bytes(W)
                C.set_lean_rows_per_thread(U)
                t = []
                for share in (True, False):  # the block's table (default) and each lane's own (K1)
                    C.set_lean_share(share)
                    t += [graph_us(lambda: rope_ext.apply_rope(x), args.reps),
                          graph_us(lambda: rope_ext.apply_rope(x, inplace=True), args.reps)]
                C.set_lean_share(True)
                print(f"{S:>6} {mb:>6.2f} {W:>3} {'rule' if U == 0 else U:>5} " + " ".join(f"{v:>7.1f}" for v in t) +
                      f" {lig:>9.1f} {t_comp:>8.1f} {copy:>7.1f}")
        C.set_lean_max_bytes(-1)
        C.set_lean_bytes(-1)
        C.set_lean_rows_per_thread(0)


if __name__ == "__main__":
    main()
