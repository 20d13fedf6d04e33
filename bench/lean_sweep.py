"""Variant 6 (lean) by its launch choices, for issue 19's small and middle sizes: rows per
thread U (each thread computes its chunk's sin/cos once for its U rows) and access width W,
out of place and in place, beside Liger in place (when importable), torch.compile out of
place and a same-size copy, every column of a size timed in turns
(timing.graph_us_interleaved: one call in a CUDA graph, L2 flushed before each replay,
median; a knob is set inside its column's call, so the captured launch keeps it).

    python bench/lean_sweep.py [--reps 100] [--sizes 16,64,256,1024,4096] [--widths 8,16] [--rows 0,1,2,4,8]
                               [--no-compile]

bshd bf16 [1, S, 32, 128]; U "rule" (0) is launch_lean's own choice (rope_dispatch.cu).
Timed one column after another (as this sweep did before), the column after
torch.compile's ran ~2 us faster at 2-32 MB (bench/NOTES.md, second session of 2026-11-26).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from timing import graph_us_interleaved  # noqa: E402
from run import import_liger, hf_cos_sin  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--sizes", default="16,64,256,1024,4096", help="tokens S of [1, S, 32, 128] bf16")
    ap.add_argument("--widths", default="8,16", help="access widths W (bytes)")
    ap.add_argument("--rows", default="0,1,2,4,8", help="rows per thread U (0: the rule)")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile column (A/B runs: no compile time)")
    args = ap.parse_args()
    try:
        liger = import_liger()
    except Exception as e:  # optional peer
        print(f"Liger: n/a ({type(e).__name__})")
        liger = None
    C = rope_ext._C
    print(f"device: {torch.cuda.get_device_name()}; us, median of {args.reps} graph replays in turns, cold L2")

    def knobs(W, U):
        C.set_lean_max_bytes(64 << 20)
        C.set_lean_bytes(W)
        C.set_lean_rows_per_thread(U)

    def reset():
        C.set_lean_max_bytes(-1)
        C.set_lean_bytes(-1)
        C.set_lean_rows_per_thread(0)

    widths = [int(w) for w in args.widths.split(",")]
    rows = [int(u) for u in args.rows.split(",")]
    for S in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(1, S, 32, 128, device="cuda").bfloat16()
        y = torch.empty_like(x)
        mb = x.numel() * 2 / 2**20
        fns = {"copy": lambda: y.copy_(x)}
        cos, sin = hf_cos_sin(S, 128, x.dtype)
        c4, s4 = cos.view(1, S, 1, 128), sin.view(1, S, 1, 128)
        if not args.no_compile:
            torch._dynamo.reset()
            comp = torch.compile(ref.apply_cos_sin, dynamic=False)
            fns["compile"] = lambda: comp(x, c4, s4)  # the cached formula, out of place
        if liger is not None and S >= 2:
            h = S // 2
            xt = x.view(S, 32, 128)
            qb, kb = xt[:h].unsqueeze(0).transpose(1, 2), xt[h:2 * h].unsqueeze(0).transpose(1, 2)
            c, s_ = cos[:h].unsqueeze(0).contiguous(), sin[:h].unsqueeze(0).contiguous()
            fns["Liger ip"] = lambda: liger.rope_forward(qb, kb, c, s_)
        def column(W, U, inplace):
            def f():
                knobs(W, U)
                try:
                    return rope_ext.apply_rope(x, inplace=inplace)
                finally:
                    reset()
            return f

        for W in widths:
            for U in rows:
                for inplace, tag in ((False, "oop"), (True, "ip")):
                    fns[f"W{W} U{U or 'rule'} {tag}"] = column(W, U, inplace)
        t, err = graph_us_interleaved(fns, args.reps)
        print(f"\nS {S} ({mb:.2f} MB): " + ", ".join(f"{n} {v:.2f}" for n, v in t.items()))
        for n, e in err.items():
            print(f"  {n}: n/a ({type(e).__name__}: {e})")
        reset()


if __name__ == "__main__":
    main()
