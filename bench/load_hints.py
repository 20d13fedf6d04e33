"""What an L2 eviction hint on a streaming kernel's loads is worth under each flush (issue 19).

    python bench/load_hints.py [--sizes 8,32,96,128,W2a,W2b] [--reps 100] [--flushes reset,reset+clean,write] [--pin]

Why: under the flush that resets persisting lines (timing.FLUSH "reset", twentieth
session), torch.compile's kernel, whose loads of x's partner halves and of cos/sin carry
evict_last, ran under the same-size
copy at W2a / W2b (128 / 96 MB: 92.8 / 70.6 us, copy 93.6 / 71.2, rope_ext 95.1 / 73.0), and
rope_ext ahead of it under the old flush. Lines loaded with evict_last go to L2's persisting
set-aside (~9.4 MB here), which the reset leaves empty; the flush's other lines are dirty.
One Triton copy kernel, its loads with no hint, evict_first or evict_last, beside torch's
copy, rope_ext and torch.compile on bshd bf16 [1, S, 32, 128] (or W2a / W2b, sbhd), in turns,
under the flushes
"reset" (dirty lines), "reset" + clean (a 256 MB read after the write: no dirty line left)
and "write": whether a hint moves a streaming kernel's time, and under which flush; rope_ext
in place too. --pin: whether a call leaves the kernels after it a smaller L2 (pin_probe).
(Runs 5-6 of the twentieth session also timed rope_ext's tiles with the hint, with and
without demoting each line after use, through an A/B knob since removed: bench/NOTES.md.)
"""
import argparse
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
import timing  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from run import hf_cos_sin  # noqa: E402


@triton.jit
def _copy(src, dst, BLOCK: tl.constexpr, HINT: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if HINT == 1:
        x = tl.load(src + offs, eviction_policy="evict_first")
    elif HINT == 2:
        x = tl.load(src + offs, eviction_policy="evict_last")
    else:
        x = tl.load(src + offs)
    tl.store(dst + offs, x)


SHAPES = {"W2a": ("sbhd", (4096, 1, 128, 128)), "W2b": ("sbhd", (512, 32, 24, 128)), "W1": ("bshd", (4, 4096, 32, 128))}


def workload(name):
    """x, the layout, and torch.compile's cos / sin views of a shape name: W1 / W2a / W2b, or
    N (MB) for bshd bf16 [1, S, 32, 128]."""
    if name in SHAPES:
        layout, shape = SHAPES[name]
    else:
        layout, shape = "bshd", (1, int(name) * 2**20 // (32 * 128 * 2), 32, 128)
    x = torch.randn(*shape, device="cuda").bfloat16()
    S = shape[0] if layout == "sbhd" else shape[1]
    cos, sin = hf_cos_sin(S, 128, x.dtype)
    if layout == "sbhd":
        return x, layout, cos[:, None, None, :], sin[:, None, None, :]
    return x, layout, cos.view(S, 1, 128), sin.view(S, 1, 128)


def pin_probe(reps):
    """Does a call whose loads carry evict_last leave L2 smaller for the kernels after it?
    After each flush ("reset"): the call on a 128 MB x, then a read of a buffer z (fp32 sum),
    then that read again, timed: z fits in L2 when nothing is pinned, and its second read
    comes from L2; lines held in the persisting set-aside (~9.4 MB) leave normal lines less
    room, and a z near L2's size then misses."""
    x = torch.randn(1, 16384, 32, 128, device="cuda").bfloat16()
    y = torch.empty_like(x)
    cos, sin = hf_cos_sin(16384, 128, x.dtype)
    torch._dynamo.reset()
    comp = torch.compile(ref.apply_cos_sin, dynamic=False)
    c4, s4 = cos.view(16384, 1, 128), sin.view(16384, 1, 128)
    grid = (x.numel() // 4096,)
    preps = {"nothing": lambda: None,
             "Triton copy": lambda: _copy[grid](x, y, BLOCK=4096, HINT=0),
             "Triton copy evict_last": lambda: _copy[grid](x, y, BLOCK=4096, HINT=2),
             "torch.compile": lambda: comp(x, c4, s4)}
    preps["rope_ext"] = lambda: rope_ext.apply_rope(x)
    flush = timing._flush_buffer()
    out = torch.empty((), device="cuda")
    print("\npin probe: us of the second read of z (fp32 sum) after the call on 128 MB (median of", reps, ")")
    sizes = (30, 40, 44)
    zs = {mb: torch.randn(mb * 2**20 // 4, device="cuda") for mb in sizes}
    print(f"{'call before':>28}" + "".join(f"{f'z {mb} MB':>12}" for mb in sizes))
    for name, prep in preps.items():
        prep()
        row = []
        for mb in sizes:
            z = zs[mb]
            ts = []
            for _ in range(reps):
                timing.flush_l2(flush, mode="reset")
                prep()
                torch.sum(z, dim=0, out=out)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.sum(z, dim=0, out=out)
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1e3)
            row.append(statistics.median(ts))
        print(f"{name:>28}" + "".join(f"{t:>12.2f}" for t in row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,32,96,128", help="MB of x (bshd bf16 [1, S, 32, 128]) or W1 / W2a / W2b")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--flushes", default="reset,reset+clean,write")
    ap.add_argument("--pin", action="store_true", help="then the pin probe (pin_probe)")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}")
    print("us, median of", args.reps, "replays per column, columns in turns")
    block = 4096
    for name in (s for s in args.sizes.split(",") if s):
        x, layout, c4, s4 = workload(name)
        xa, ya = torch.randn_like(x), torch.empty_like(x)  # the copies' own buffers
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        grid = (x.numel() // block,)
        fns = {"torch copy": lambda: ya.copy_(xa)}
        for label, hint in (("copy", 0), ("copy evict_first", 1), ("copy evict_last", 2)):
            fns[label] = lambda hint=hint: _copy[grid](xa, ya, BLOCK=block, HINT=hint)
        fns["rope_ext"] = lambda: rope_ext.apply_rope(x, layout=layout)
        fns["rope_ext ip"] = lambda: rope_ext.apply_rope(x, layout=layout, inplace=True)
        fns["compile"] = lambda: comp(x, c4, s4)
        print(f"\n{name}: {layout} bf16 {list(x.shape)} ({x.numel() * 2 / 2**20:g} MB)")
        print(f"{'flush':>14}" + "".join(f"{c:>17}" for c in fns))
        for label in args.flushes.split(","):
            got, errs = timing.graph_us_under(fns, args.reps, label)
            for col, e in errs.items():
                print(f"  {col} failed: {e}")
            print(f"{label:>14}" + "".join(f"{got[c]:>17.2f}" if c in got else f"{'-':>17}" for c in fns), flush=True)
    if args.pin:
        pin_probe(max(20, args.reps // 2))


if __name__ == "__main__":
    main()
