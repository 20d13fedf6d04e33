"""Does the L2 flush leave lines loaded with the evict_last hint in L2? (issue 19)

    python bench/evict_last.py [--sizes 16,64,256,1024,4096] [--reps 100] [--modes write,reset,last,discard]

Why: in the nineteenth and twentieth sessions (bench/NOTES.md) every column that read the
suite's shared x ran 0.5-2 us faster whenever torch.compile's column took turns with it,
and not when torch.compile ran on its own clones. Inductor loads x and cos/sin with
`eviction_policy='evict_last'`; if those lines outlive the 256 MB write of the flush, the
next call that reads x finds it in L2: the "cold L2" is warm for them.

Per size (bshd bf16 [1, S, 32, 128]), the suite's columns on one shared x: rope_ext out of
place, rope_ext in place, torch.compile (the suite's cached formula, on x and cos/sin),
Liger in place (on x and the same cos/sin), "read x" (x copied into a buffer of its own:
a plain read of the shared x), and "copy" (a same-size copy on buffers of its own); all in
turns (timing.graph_us_interleaved), once without the compiled column and once with it,
under each flush mode (timing.FLUSH's note). If evict_last lines outlive the write, "read x"
runs under "copy" with the compiled column and level without it; a mode that removes them
puts it level again.
"""
import argparse
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
import timing  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from run import Peers, hf_cos_sin  # noqa: E402
from timing import same_size_copy  # noqa: E402

DEV = "cuda"


def l2_report():
    """The L2 persistence settings the runtime reports (set-aside size and its maximum)."""
    try:
        rt = timing._cudart()
        size, most = ctypes.c_size_t(), ctypes.c_int()
        rt.cudaDeviceGetLimit(ctypes.byref(size), 0x06)  # cudaLimitPersistingL2CacheSize
        rt.cudaDeviceGetAttribute(ctypes.byref(most), 108, torch.cuda.current_device())  # MaxPersistingL2CacheSize
        return f"persisting L2 set-aside {size.value / 2**20:g} MB (max {most.value / 2**20:g} MB)"
    except Exception as e:  # noqa: BLE001
        return f"persisting L2 settings not read: {e}"


def columns(S, peers, comp):
    H, D = 32, 128
    x = torch.randn(1, S, H, D, device=DEV).bfloat16()
    cos, sin = hf_cos_sin(S, D, x.dtype)
    c4, s4 = cos.view(S, 1, D), sin.view(S, 1, D)
    y = torch.empty_like(x)
    fns = {"rope_ext": lambda: rope_ext.apply_rope(x),
           "rope_ext ip": lambda: rope_ext.apply_rope(x, inplace=True),
           "compile": lambda: comp(x, c4, s4)}
    pf = peers.x_fns(x.view(S, H, D), cos, sin, torch.arange(S, device=DEV), ref.cos_sin_table(D, 10000.0, S, DEV))
    if "Liger" in pf:
        fns["Liger ip"] = pf["Liger"]
    fns["read x"] = lambda: y.copy_(x)
    fns["copy"] = same_size_copy(x.numel(), x.dtype)
    return fns


PAIRS = (("compile", "rope_ext"), ("Liger ip", "rope_ext ip"), ("copy", "read x"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="16,64,256,1024,4096")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--modes", default=",".join(timing.FLUSH_MODES))
    args = ap.parse_args()
    peers = Peers.for_script("evict_last.py", extra=l2_report() if torch.cuda.is_available() else "")
    print("us, median of", args.reps, "replays per column, columns in turns; ratios: a / b (>= 1: b at or ahead)")
    for S in (int(s) for s in args.sizes.split(",") if s):
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        fns = columns(S, peers, comp)
        mb = S * 32 * 128 * 2 / 2**20
        cols = list(fns)
        print(f"\nbshd bf16 [1, {S}, 32, 128] ({mb:g} MB)")
        print(f"{'flush':>8} {'compiled column':>16}" + "".join(f"{c:>12}" for c in cols) +
              "".join(f"{a + '/' + b:>22}" for a, b in PAIRS))
        for mode in args.modes.split(","):
            for with_comp in (False, True):
                try:
                    sel = {k: f for k, f in fns.items() if with_comp or k != "compile"}
                    got, errs = timing.graph_us_under(sel, args.reps, mode)
                except Exception as e:  # noqa: BLE001 (a mode this machine cannot run)
                    print(f"{mode:>8}: failed: {e}")
                    break
                for name, e in errs.items():
                    print(f"  {name} failed: {e}")
                cells = "".join(f"{got[c]:>12.2f}" if c in got else f"{'-':>12}" for c in cols)
                rs = "".join(f"{got[a] / got[b]:>21.3f}x" if a in got and b in got else f"{'-':>22}" for a, b in PAIRS)
                print(f"{mode:>8} {'with' if with_comp else 'without':>16}{cells}{rs}", flush=True)


if __name__ == "__main__":
    main()
