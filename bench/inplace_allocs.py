"""Issue 19: the latency suite's close rows, timed over several allocations of the input.

    python bench/inplace_allocs.py [--allocs 8] [--reps 100] [--sizes 64,1024,4096] [--no-w4]
    python bench/inplace_allocs.py --sets --sizes 1024,4096 --allocs 3 --no-w4

Why: in place at 8-32 MB, rope_ext and Liger swapped places between runs of the latency
suite, and the same kernel on two 8 MB inputs of one process took 7.8 and 9.8 us
(bench/lean_ab.py's thd rows; README, "Why the columns take turns"). A row's columns
share one input, so one run compares them at one address. Here each size is timed at
`--allocs` inputs, each a new allocation behind a spacer of a different size (other
addresses; inputs of 8 MB and more still start at offset 0 of a 2 MB page, which this
does not vary), every column of an input in turns (timing.graph_us_interleaved: one call in a CUDA graph, L2 flushed before
each replay). torch.compile is compiled once per size (its guards do not depend on the
address). Printed per input: x's offset in its 2 MB page, the times, peer / rope_ext (>= 1:
rope_ext at or ahead; copy / rope_ext: how far under or over the copy), and per size the
median, min and max of those ratios over the inputs ("compile own" has no ratio: it is
there for its effect on the others).

bshd bf16 [1, S, 32, 128]: rope_ext out of place against torch.compile (cos/sin given,
as the latency suite), rope_ext in place against Liger (in place, x's tokens as q and k
halves, as run.Peers), and a same-size copy. --sets: the in-place columns with and without
the others (bench/NOTES.md, nineteenth session: with torch.compile's column among the
turns every column that reads x ran 0.7-1.5 us faster at 8 MB; the set where it gets its
own clones of x and cos/sin says whether that comes through the lines it shares). W4 (q [8192, 32, 128] + k [8192, 8, 128]
thd, random positions, in place): rope_ext against Liger and the copy.
"""
import argparse
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from run import Peers, hf_cos_sin  # noqa: E402
from timing import graph_us_interleaved, same_size_copy  # noqa: E402

DEV = "cuda"


def spacer(i):
    """A live allocation of a size that differs per input (odd MB counts and a sub-MB tail),
    so the next input starts elsewhere."""
    return torch.empty((i * 37 + 3) * 2**20 + i * 4096 * 5, dtype=torch.uint8, device=DEV)


def x_inputs(S, i, peers, comp, own=False):
    """One input of bshd bf16 [1, S, 32, 128] and its columns; with own (--sets), also
    "compile own": torch.compile's call on its own clones of x and cos/sin."""
    H, D = 32, 128
    x = torch.randn(1, S, H, D, device=DEV).bfloat16()
    cos, sin = hf_cos_sin(S, D, x.dtype)
    c4, s4 = cos.view(S, 1, D), sin.view(S, 1, D)
    fns = {"rope_ext": lambda: rope_ext.apply_rope(x),
           "rope_ext ip": lambda: rope_ext.apply_rope(x, inplace=True),
           "compile": lambda: comp(x, c4, s4)}
    if own:
        xo, c4o, s4o = x.clone(), c4.clone(), s4.clone()
        fns["compile own"] = lambda: comp(xo, c4o, s4o)
    pos = torch.arange(S, device=DEV)
    cache = ref.cos_sin_table(D, 10000.0, S, DEV)
    pf = peers.x_fns(x.view(S, H, D), cos, sin, pos, cache)
    if "Liger" in pf:
        fns["Liger ip"] = pf["Liger"]
    fns["copy"] = same_size_copy(x.numel(), x.dtype)
    return x, fns


def w4_inputs(i, peers):
    T = 8192
    cache = ref.cos_sin_table(128, 10000.0, 131072, DEV)
    q = torch.randn(T, 32, 128, device=DEV).bfloat16()
    k = torch.randn(T, 8, 128, device=DEV).bfloat16()
    pos = torch.randint(0, 131072, (T,), device=DEV)
    fns = {"rope_ext ip": lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)}
    pf = peers.qk_fns(q, k, pos, cache)
    if "Liger" in pf:
        fns["Liger ip"] = pf["Liger"]
    fns["copy"] = same_size_copy(q.numel() + k.numel(), q.dtype)
    return q, fns


PAIRS = (("compile", "rope_ext"), ("Liger ip", "rope_ext ip"), ("copy", "rope_ext ip"))


def gpu_state():
    """SM / memory clocks, power and temperature now (nvidia-smi), or '' where it is absent.
    Queried once per size or set, when its table header prints: after its first input was
    timed, with the GPU idle (not the clocks during the replays)."""
    try:
        q = "clocks.sm,clocks.mem,power.draw,temperature.gpu"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip()
        return f"(sm, mem clocks, power, temp: {out})"
    except Exception:  # noqa: BLE001
        return ""


def run_size(label, make, allocs, reps, only=None):
    cols, ratios = None, {p: [] for p in PAIRS}
    keep = []
    for i in range(allocs):
        keep.append(spacer(i))
        x, fns = make(i)
        if only is not None:
            fns = {k: f for k, f in fns.items() if k in only}
        got, errs = graph_us_interleaved(fns, reps)
        for name, e in errs.items():
            print(f"  {label}: {name} failed: {e}")
        if cols is None:
            cols = list(fns)
            print(f"\n{label}: us, median of {reps} replays per column, columns in turns; input offset in its 2 MB page"
                  f" {gpu_state()}")
            print(f"{'input':>6} {'offset':>9}" + "".join(f"{c:>12}" for c in cols) +
                  "".join(f"{a + '/' + b:>26}" for a, b in PAIRS if a in cols and b in cols))
        cells = "".join(f"{got[c]:>12.2f}" if c in got else f"{'n/a':>12}" for c in cols)
        rs = ""
        for a, b in PAIRS:
            if a in got and b in got:
                ratios[(a, b)].append(got[a] / got[b])
                rs += f"{got[a] / got[b]:>25.3f}x"
        print(f"{i:>6} {x.data_ptr() % 2**21:>9}{cells}{rs}", flush=True)
        keep.append(x)
        del fns
    for (a, b), rs in ratios.items():
        if rs:
            ahead = sum(r >= 1.0 for r in rs)
            who = "rope_ext at or under the copy's time" if a == "copy" else "rope_ext at or ahead"
            print(f"  {a} / {b}: median {statistics.median(rs):.3f}x, min {min(rs):.3f}x, max {max(rs):.3f}x; "
                  f"{who} at {ahead} of {len(rs)} inputs")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--sizes", default="64,1024,4096", help="S of bshd [1, S, 32, 128] (64: 0.5 MB)")
    ap.add_argument("--no-w4", action="store_true")
    ap.add_argument("--sets", action="store_true",
                    help="instead: at each size, the in-place columns timed alone, then with each other column "
                         "added (rope_ext out of place; torch.compile on its own clones of x and cos/sin, compiled "
                         "there; torch.compile on x and the cos/sin Liger reads), then all but the first compiled "
                         "column, then alone again")
    args = ap.parse_args()
    peers = Peers.for_script("inplace_allocs.py")
    for S in (int(s) for s in args.sizes.split(",") if s):
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        mb = S * 32 * 128 * 2 / 2**20
        if args.sets:
            ip = ("rope_ext ip", "Liger ip", "copy")
            for name, only in (("in place alone", ip), ("+ rope_ext out of place", ip + ("rope_ext",)),
                               ("+ torch.compile on its own clones of x and cos/sin (compiled here)",
                                ip + ("compile own",)),
                               ("+ torch.compile on x and the cos/sin Liger reads", ip + ("compile",)),
                               ("all but compile own", tuple(c for c in ("rope_ext", "compile") + ip)),
                               ("in place alone, again", ip)):
                run_size(f"bshd bf16 [1, {S}, 32, 128] ({mb:g} MB), {name}",
                         lambda i, S=S, comp=comp: x_inputs(S, i, peers, comp, own=True), args.allocs, args.reps, only)
            continue
        run_size(f"bshd bf16 [1, {S}, 32, 128] ({mb:g} MB)", lambda i, S=S, comp=comp: x_inputs(S, i, peers, comp),
                 args.allocs, args.reps)
    if not args.no_w4:
        run_size("W4 q[8192,32,128]+k[8192,8,128] thd in place (80 MB)", lambda i: w4_inputs(i, peers),
                 args.allocs, args.reps)


if __name__ == "__main__":
    main()
