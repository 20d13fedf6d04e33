"""rope_ext timing sweeps.

    python bench/run.py                 # seed sweep + bshd bf16 [4, 4096, 32, 128] fwd/bwd
    python bench/run.py --quick         # the largest seed shapes + bshd only
    python bench/run.py --suite llm     # issue-4 workloads W1-W5 (+ max error vs float64)
    python bench/run.py --suite sweep --plot sweep.png   # 64 KB .. 4 GB, bf16/fp32, fwd/bwd
    python bench/run.py --suite all --json out.json --csv out.csv

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


def time_rows(fns, nbytes, timer, bw, base, outs=None, want=None):
    """Times each (name, fn): µs, GB/s, % of copy, speedup over the row named `base`
    (and max |out - want| where `outs` gives the output). A variant that refuses the
    input gets a row saying why; the sweep goes on."""
    rows = []
    for name, fn in fns:
        try:
            us = timer(fn)
        except Exception as e:
            rows.append(dict(impl=name, error=str(e).splitlines()[0][:80]))
            continue
        gbs = nbytes / us / 1e3
        row = dict(impl=name, us=us, gbs=gbs, pct_copy=100 * gbs / bw)
        if outs is not None and name in outs:
            row["err"] = max_err(outs[name](), want)
        rows.append(row)
    base_us = next((r["us"] for r in rows if "us" in r and r["impl"].startswith(base)), None)
    for r in rows:
        if "us" in r:
            r["speedup"] = base_us / r["us"] if base_us else float("nan")
    return rows


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
    return time_rows(impls, nbytes, timer, bw, base="torch naive")


def seed_call(x, impl, inverse):
    return ops.rope(x.unsqueeze(2), None, None, None, None, None, 0, 10000.0, -1, False, inverse, impl) \
        if inverse else rope_ext.rope(x, impl=impl)


def bshd_call(x, impl, inverse):
    return ops.rope(x, None, None, None, None, None, 0, 10000.0, -1, False, inverse, impl)


def print_table(title, rows, ratio="x naive", err=False):
    print(f"\n{title}")
    print(f"  {'impl':<36}{'time us':>10}{'GB/s':>8}{'% copy':>8}{ratio:>10}" + ("  max err vs f64" if err else ""))
    for r in rows:
        if "error" in r:
            print(f"  {r['impl']:<36}  n/a: {r['error']}")
        else:
            e = f"  {r['err']:.3g}" if "err" in r else ""
            print(f"  {r['impl']:<36}{r['us']:>10.1f}{r['gbs']:>8.0f}{r['pct_copy']:>7.1f}%{r['speedup']:>9.2f}x{e}")



# ----------------------------------------------------------------------------- llm suite
def qk_cache_compiled():
    """torch.compile of the cos/sin-cache form for q and k (vLLM style): gather cos/sin
    rows by position, rotate both, in place. Its warm-up is untimed."""
    def f(q, k, pos, cache):
        cs = cache[pos]  # [T, R]
        half = cs.shape[-1] // 2
        cos = torch.cat([cs[:, :half], cs[:, :half]], -1)[:, None, :].to(q.dtype)
        sin = torch.cat([cs[:, half:], cs[:, half:]], -1)[:, None, :].to(q.dtype)
        q.copy_(ref.apply_cos_sin(q, cos, sin))
        k.copy_(ref.apply_cos_sin(k, cos, sin))
    torch._dynamo.reset()
    return torch.compile(f, dynamic=False)


def max_err(out, want):
    return (out.double() - want).abs().max().item()


def llm_suite(timer, bw):
    """Issue 4's workloads. Each row: µs, GB/s, % of copy, max |out - float64|."""
    results = []
    impls = rope_ext.IMPLS + ("auto",)

    def table(title, nbytes, fns, want=None, outs=None):
        rows = time_rows(fns, nbytes, timer, bw, base="torch.compile", outs=outs, want=want)
        print_table(title, rows, "x compile", err=want is not None)
        results.append(dict(workload=title, rows=rows))

    # W1, W2: dense layouts, forward and backward (backward = rotation by -theta).
    for name, shape, layout in [("W1 bshd", (4, 4096, 32, 128), "bshd"), ("W2a sbhd", (4096, 1, 128, 128), "sbhd"),
                                ("W2b sbhd", (512, 32, 24, 128), "sbhd")]:
        x = torch.randn(*shape, device=DEV).bfloat16()
        S, D = (shape[1] if layout == "bshd" else shape[0]), shape[3]
        cos, sin = hf_cos_sin(S, D, x.dtype)
        if layout == "bshd":
            cos, sin = cos[:, None, :], sin[:, None, :]
        else:
            cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        for inverse in (False, True):
            want = ref.rope_float64(x, layout=layout, inverse=inverse)
            torch._dynamo.reset()
            comp = torch.compile(ref.apply_cos_sin, dynamic=False)
            s = -sin if inverse else sin
            call = lambda i, inverse=inverse: ops.rope(x.permute(1, 0, 2, 3) if layout == "sbhd" else x, None, None,  # noqa: E731
                                                       None, None, None, 0, 10000.0, -1, False, inverse, i)
            fix = (lambda y: y.permute(1, 0, 2, 3)) if layout == "sbhd" else (lambda y: y)
            fns = [("torch.compile(cached)", lambda: comp(x, cos, s))] + [(f"rope_ext {i}", lambda i=i: call(i)) for i in impls]
            outs = {"torch.compile(cached)": lambda: comp(x, cos, s)}
            outs.update({f"rope_ext {i}": (lambda i=i: fix(call(i))) for i in impls})
            table(f"{name} bf16 {list(shape)} {'backward' if inverse else 'forward'}", 2 * x.numel() * 2, fns, want, outs)
            del want
        del x
    # W3: the seed sweep's largest, fp32 single head, position = row mod 8192.
    x = torch.randn(128, 8192, 128, device=DEV)
    cos, sin = hf_cos_sin(8192, 128, x.dtype)
    want = ref.rope_float64(x[:8].unsqueeze(2)).squeeze(2)  # error on 8 of the 128 rows of positions
    torch._dynamo.reset()
    comp = torch.compile(ref.apply_cos_sin, dynamic=False)
    fns = [("torch.compile(cached)", lambda: comp(x, cos, sin))] + [(f"rope_ext {i}", lambda i=i: rope_ext.rope(x, impl=i)) for i in impls]
    outs = {"torch.compile(cached)": lambda: comp(x, cos, sin)[:8]}
    outs.update({f"rope_ext {i}": (lambda i=i: rope_ext.rope(x, impl=i)[:8]) for i in impls})
    table("W3 fp32 [128*8192, 128] one head forward", 2 * x.numel() * 4, fns, want, outs)
    del x
    # W4 / W5: q + k thd, random int64 positions < 131072, one launch, in place.
    cache = ref.cos_sin_table(128, 10000.0, 131072, DEV)[:131072].contiguous()
    for T in (8192, 16):
        q = torch.randn(T, 32, 128, device=DEV).bfloat16()
        k = torch.randn(T, 8, 128, device=DEV).bfloat16()
        pos = torch.randint(0, 131072, (T,), device=DEV)
        nbytes = 2 * (q.numel() + k.numel()) * 2
        comp = qk_cache_compiled()
        qc, kc = q.clone(), k.clone()
        wq = ref.rope_float64(q, pos, layout="thd")
        fns = [("torch.compile(cached)", lambda: comp(qc, kc, pos, cache))]
        outs = {}
        for i in impls:
            if i == "naive":
                continue  # cannot run in place
            for src, kw in (("sin/cos in kernel", {}), ("fp32 cache", {"cos_sin_cache": cache})):
                nm = f"rope_ext {i} ({src})"
                fns.append((nm, lambda i=i, kw=kw: rope_ext.apply_rope_qk(qc, kc, pos, layout="thd", impl=i,
                                                                       inplace=True, **kw)))
                outs[nm] = (lambda i=i, kw=kw: rope_ext.apply_rope_qk(q.clone(), k, pos, layout="thd", impl=i,
                                                                   inplace=True, **kw)[0])
        label = "W4" if T == 8192 else "W5 (device time, cold L2)"
        table(f"{label} q[{T},32,128]+k[{T},8,128] bf16 thd, random pos < 131072, in place", nbytes, fns, wq, outs)
        if T == 16 and CUDA:
            results.append(decode_latency(q, k, pos, cache, comp))
    return results


def decode_latency(q, k, pos, cache, comp):
    """W5: per call, (a) replayed in a CUDA graph with a cold L2, (b) eager Python calls
    back to back (host overhead included)."""
    rows = []
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=DEV)
    for name, fn in [("rope_ext auto", lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)),
                     ("rope_ext auto (fp32 cache)", lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True,
                                                                                  cos_sin_cache=cache)),
                     ("torch.compile(cached)", lambda: comp(q, k, pos, cache)),
                     # The floor for any kernel: one aten element-wise op over q's bytes.
                     ("floor: aten q.mul_(1.0)", lambda: q.mul_(1.0))]:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        ts = []
        for _ in range(200):
            flush.fill_(1)
            torch.cuda._sleep(100_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); g.replay(); b.record(); b.synchronize()  # noqa: E702
            ts.append(a.elapsed_time(b) * 1e3)
        n = 2000
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        eager = (time.perf_counter() - t0) / n * 1e6
        rows.append(dict(impl=name, graph_us=statistics.median(ts), eager_us=eager))
    print("\nW5 decode T=16 per call: CUDA-graph replay with cold L2 / eager back-to-back (host included)")
    for r in rows:
        print(f"  {r['impl']:<30}{r['graph_us']:>8.1f} us graph {r['eager_us']:>8.1f} us eager")
    return dict(workload="W5 decode latency", rows=rows)


# ----------------------------------------------------------------------------- size sweep
def sweep_suite(timer, bw, max_bytes):
    """x of 64 KB .. max_bytes (bshd [1, S, 32, 128]), bf16 and fp32, forward and
    backward: rope_ext auto vs torch.compile(cached) (a fresh static compile per point,
    its warm-up untimed)."""
    results = []
    sizes = [2**k for k in range(16, 33, 2) if 2**k <= max_bytes]
    points = [(n, dt, inv) for n in sizes for dt in (torch.bfloat16, torch.float32) for inv in (False, True)]
    for idx, (nbytes, dt, inv) in enumerate(points):
        esz = 2 if dt == torch.bfloat16 else 4
        S = max(1, nbytes // (32 * 128 * esz))
        x = torch.randn(1, S, 32, 128, device=DEV).to(dt)
        cos, sin = hf_cos_sin(S, 128, dt)
        cos, sin = cos[:, None, :], (-sin if inv else sin)[:, None, :]
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        moved = 2 * x.numel() * esz
        us_c = timer(lambda: comp(x, cos, sin))
        us_r = timer(lambda: bshd_call(x, "auto", inv))
        row = dict(bytes=x.numel() * esz, dtype=str(dt).split(".")[-1], direction="backward" if inv else "forward",
                   rope_ext_us=us_r, compile_us=us_c, rope_ext_gbs=moved / us_r / 1e3, compile_gbs=moved / us_c / 1e3)
        results.append(row)
        print(f"\r  sweep {idx + 1}/{len(points)}: {row['bytes'] / 2**20:9.2f} MB {row['dtype']:<8} {row['direction']:<8}"
              f" rope_ext {row['rope_ext_gbs']:6.0f} GB/s  compile {row['compile_gbs']:6.0f} GB/s", file=sys.stderr)
        del x
    print("\nsize sweep (bshd [1, S, 32, 128]): GB/s, rope_ext auto vs torch.compile(cached)")
    print(f"  {'MB':>10} {'dtype':<9}{'dir':<9}{'rope_ext':>9}{'compile':>9}{'ratio':>7}")
    for r in results:
        print(f"  {r['bytes'] / 2**20:>10.2f} {r['dtype']:<9}{r['direction']:<9}{r['rope_ext_gbs']:>9.0f}"
              f"{r['compile_gbs']:>9.0f}{r['compile_us'] / r['rope_ext_us']:>6.2f}x")
    return results


def plot_sweep(rows, bw, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, dt in zip(axes, ("bfloat16", "float32")):
        for direction, ls in (("forward", "-"), ("backward", "--")):
            pts = [r for r in rows if r["dtype"] == dt and r["direction"] == direction]
            xs = [r["bytes"] for r in pts]
            ax.plot(xs, [r["rope_ext_gbs"] for r in pts], "o" + ls, color="C0", label=f"rope_ext auto {direction}")
            ax.plot(xs, [r["compile_gbs"] for r in pts], "s" + ls, color="C1", label=f"torch.compile {direction}")
        ax.axhline(bw, color="k", lw=1, label=f"copy {bw:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, bw * 1.08)
        ax.set_title(f"{dt}: bshd [1, S, 32, 128]")
        ax.set_xlabel("size of x (bytes)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s (x read + out written)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="largest seed shapes and the bshd workload only")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--suite", choices=["seed", "llm", "sweep", "attn", "all"], default="seed",
                    help="seed: the seed sweep + bshd bf16 (default); llm: W1-W5; sweep: 64 KB..--max-bytes")
    ap.add_argument("--max-bytes", type=float, default=4 * 2**30, help="largest x in the size sweep")
    ap.add_argument("--plot", help="PNG of the size sweep (GB/s against size)")
    ap.add_argument("--plot-attn", help="PNG of the attn suite: decode time against context length")
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
    if args.suite in ("llm", "all") and CUDA:
        results += llm_suite(timer, bw)
    if args.suite in ("attn", "all"):  # issue 9: bench/attn.py
        from attn import attn_suite, plot_attn
        attn = attn_suite(timer, bw, args.quick)
        results += attn
        if args.plot_attn:
            plot_attn(attn, args.plot_attn)
    sweep = []
    if args.suite in ("sweep", "all") and CUDA:
        sweep = sweep_suite(timer, bw, args.max_bytes)
        if args.plot:
            plot_sweep(sweep, bw, args.plot)
    if args.suite not in ("seed", "all"):
        seed_shapes, bshd_shape = [], None
    for bs, n, m in seed_shapes:
        x = torch.randn(bs, n, m, device=DEV)
        cos, sin = hf_cos_sin(n, m, x.dtype)
        rows = workload_rows(x, seed_call, cos, sin, False, timer, bw)
        title = f"seed fp32 [{bs}, {n}, {m}] forward ({2 * x.numel() * 4 / 1e6:.0f} MB moved)"
        print_table(title, rows)
        results.append(dict(workload=title, rows=rows))
        del x
    x = torch.randn(*bshd_shape, device=DEV).bfloat16() if bshd_shape else None
    if x is not None:
        cos, sin = hf_cos_sin(bshd_shape[1], bshd_shape[3], x.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]
    for inverse in ((False, True) if x is not None else ()):
        rows = workload_rows(x, bshd_call, cos, sin, inverse, timer, bw)
        title = f"bshd bf16 {list(bshd_shape)} {'backward' if inverse else 'forward'}"
        print_table(title, rows)
        results.append(dict(workload=title, rows=rows))
    meta = dict(device=dev_name, torch=torch.__version__, copy_gbs=bw, reps=args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results, sweep=sweep), f, indent=1)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("workload,impl,us,gbs,pct_copy,speedup,max_err,graph_us,eager_us\n")
            for w in results:
                for r in w["rows"]:
                    if "error" not in r:
                        f.write(f"\"{w['workload']}\",{r['impl']},{r.get('us', '')},{r.get('gbs', '')},"
                                f"{r.get('pct_copy', '')},{r.get('speedup', '')},{r.get('err', '')},"
                                f"{r.get('graph_us', '')},{r.get('eager_us', '')}\n")
            for r in sweep:
                f.write(f"\"sweep {r['bytes']} {r['dtype']} {r['direction']}\",rope_ext auto,{r['rope_ext_us']:.2f},"
                        f"{r['rope_ext_gbs']:.1f},,,,,\n")
                f.write(f"\"sweep {r['bytes']} {r['dtype']} {r['direction']}\",torch.compile(cached),"
                        f"{r['compile_us']:.2f},{r['compile_gbs']:.1f},,,,,\n")


if __name__ == "__main__":
    main()
