"""rope_ext timing sweeps.

    python bench/run.py                 # seed sweep + bshd bf16 [4, 4096, 32, 128] fwd/bwd
    python bench/run.py --quick         # the largest seed shapes + bshd only
    python bench/run.py --json out.json --csv out.csv

Timing: CUDA events around each call, after warm-up, with the L2 flushed (a 256 MB
write) before every timed call and the GPU held busy (torch.cuda._sleep) while the host
enqueues it, so host overhead stays out of the device time; the median of --reps calls. GB/s counts the bytes
that must move: x read once and the output written once. "% copy" compares with a
device-to-device copy measured in the same run the same way. Without a GPU it runs
a small CPU sweep (wall clock) and says so.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from rope_ext._ops import ops  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


class Timer:
    def __init__(self, reps, warmup=3):
        self.reps, self.warmup = reps, warmup
        self.flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=DEV) if CUDA else None

    def __call__(self, fn):
        for _ in range(self.warmup):
            fn()
        if not CUDA:
            ts = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1e6
        ts = []
        for _ in range(self.reps):
            self.flush.fill_(1)  # evict x from L2: time the DRAM traffic, not the cache
            # Keep the GPU busy while the host enqueues the call: the events then time
            # the kernel(s), not the Python/dispatcher overhead before the launch.
            torch.cuda._sleep(1_000_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        return statistics.median(ts)


def copy_bandwidth(timer, nbytes=2**30):
    x = torch.randn(nbytes // 4, device=DEV)
    y = torch.empty_like(x)
    us = timer(lambda: y.copy_(x))
    return 2 * nbytes / us / 1e3  # GB/s, read + write


def hf_cos_sin(S, D, dtype, base=10000.0):
    """HF-style cos/sin [S, D] (halves duplicated) in x's dtype, for the cached baselines."""
    f = 1.0 / (base ** (torch.arange(0, D, 2, device=DEV).float() / D))
    ang = torch.arange(S, device=DEV).float()[:, None] * f
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def workload_rows(x, rope_call, cos, sin, inverse, timer, bw):
    """Time every implementation on x; rows of dicts."""
    nbytes = 2 * x.numel() * x.element_size()
    s = -sin if inverse else sin
    impls = [
        ("torch naive", lambda: ref.rope_naive(x, inverse=inverse) if x.dim() == 4 else
         ref.rope_naive(x.unsqueeze(2), inverse=inverse)),
        ("torch cached", lambda: ref.apply_cos_sin(x, cos, s)),
    ]
    if CUDA:
        # A fresh static-shape compile per workload: torch.compile's best case (its
        # warm-up, 0.7-3.6 s per new shape, happens in the untimed warm-up calls).
        torch._dynamo.reset()
        compiled = torch.compile(ref.apply_cos_sin, dynamic=False)
        impls.append(("torch.compile(cached)", lambda: compiled(x, cos, s)))
    for name in rope_ext.IMPLS + ("auto",):
        impls.append((f"rope_ext {name}", lambda name=name: rope_call(x, name, inverse)))
    rows, base_us = [], None
    for name, fn in impls:
        try:
            us = timer(fn)
        except Exception as e:  # e.g. a variant that refuses this input: say so, keep going
            rows.append(dict(impl=name, error=str(e).splitlines()[0][:80]))
            continue
        base_us = base_us or us
        gbs = nbytes / us / 1e3
        rows.append(dict(impl=name, us=us, gbs=gbs, pct_copy=100 * gbs / bw, speedup=base_us / us))
    return rows


def seed_call(x, impl, inverse):
    return ops.rope(x.unsqueeze(2), None, None, None, None, None, 0, 10000.0, -1, False, inverse, impl) \
        if inverse else rope_ext.rope(x, impl=impl)


def bshd_call(x, impl, inverse):
    return ops.rope(x, None, None, None, None, None, 0, 10000.0, -1, False, inverse, impl)


def print_table(title, rows):
    print(f"\n{title}")
    print(f"  {'impl':<24}{'time us':>11}{'GB/s':>9}{'% copy':>8}{'x naive':>9}")
    for r in rows:
        if "error" in r:
            print(f"  {r['impl']:<24}  n/a: {r['error']}")
        else:
            print(f"  {r['impl']:<24}{r['us']:>11.1f}{r['gbs']:>9.0f}{r['pct_copy']:>7.1f}%{r['speedup']:>8.1f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="largest seed shapes and the bshd workload only")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--csv")
    args = ap.parse_args()
    torch.manual_seed(0)
    timer = Timer(args.reps)
    if CUDA:
        dev_name = torch.cuda.get_device_name()
        seed_shapes = [(bs, n, m) for bs in (64, 128) for n in (512, 1024, 2048, 4096, 8192) for m in (128, 256)]
        if args.quick:
            seed_shapes = [(128, 8192, 128), (128, 8192, 256)]
        bshd_shape = (4, 4096, 32, 128)
    else:
        dev_name = "CPU (no GPU found: a small CPU sweep, wall-clock timing)"
        seed_shapes = [(4, n, m) for n in (512, 2048) for m in (64, 128)]
        bshd_shape = (1, 512, 8, 128)
    bw = copy_bandwidth(timer, 2**30 if CUDA else 2**26)
    print(f"device: {dev_name}; torch {torch.__version__}; copy bandwidth {bw:.0f} GB/s (read + write)")
    results = []
    for bs, n, m in seed_shapes:
        x = torch.randn(bs, n, m, device=DEV)
        cos, sin = hf_cos_sin(n, m, x.dtype)
        rows = workload_rows(x, seed_call, cos, sin, False, timer, bw)
        title = f"seed fp32 [{bs}, {n}, {m}] forward ({2 * x.numel() * 4 / 1e6:.0f} MB moved)"
        print_table(title, rows)
        results.append(dict(workload=title, rows=rows))
        del x
    x = torch.randn(*bshd_shape, device=DEV).bfloat16()
    cos, sin = hf_cos_sin(bshd_shape[1], bshd_shape[3], x.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]
    for inverse in (False, True):
        rows = workload_rows(x, bshd_call, cos, sin, inverse, timer, bw)
        title = f"bshd bf16 {list(bshd_shape)} {'backward' if inverse else 'forward'}"
        print_table(title, rows)
        results.append(dict(workload=title, rows=rows))
    meta = dict(device=dev_name, torch=torch.__version__, copy_gbs=bw, reps=args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("workload,impl,us,gbs,pct_copy,speedup\n")
            for w in results:
                for r in w["rows"]:
                    if "error" not in r:
                        f.write(f"\"{w['workload']}\",{r['impl']},{r['us']:.2f},{r['gbs']:.1f},{r['pct_copy']:.2f},{r['speedup']:.2f}\n")


if __name__ == "__main__":
    main()
