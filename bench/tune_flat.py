"""Variant 5 (flat) against the tiles, and flat's rows per thread, on issue 11's shapes.

    python bench/tune_flat.py

Issue 19: flat measured level with the tiles or slower everywhere on the H100, and auto
no longer takes it (rope_dispatch.cu), so the "limit" table below is what auto WOULD
gain with such a limit; ROPE_EXT_FLAT_MAX_BYTES no longer changes anything.

Each cell: one call in a CUDA graph, L2 flushed before each replay, median (bench/run.py's
graph_us). Rows: flat at its default rows per thread (launch_flat: about one wave of
kFlatThreadsPerSM threads per SM) and at fixed values, and fp32x4_tile. Then, for each
candidate limit, what auto would take (flat up to the limit, tiles above): the geometric
mean and the worst of auto / min(flat, tile) over the shapes (1.00 = always the faster)."""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402


def workloads():
    """(name, bytes of x (q + k), fn(impl))."""
    dev = "cuda"
    w = []
    for dt, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        for S in (16, 64, 256, 1024, 4096, 16384):
            x = torch.randn(1, S, 32, 128, device=dev).to(dt)
            w.append((f"{tag} S={S}", x.numel() * x.element_size(), lambda i, x=x: rope_ext.apply_rope(x, impl=i)))
    for name, shape in (("W2a", (4096, 1, 128, 128)), ("W2b", (512, 32, 24, 128))):
        x = torch.randn(*shape, device=dev).bfloat16()
        w.append((name, x.numel() * 2, lambda i, x=x: rope_ext.apply_rope(x, layout="sbhd", impl=i)))
    for T, name in ((8192, "W4"), (16, "W5")):
        q = torch.randn(T, 32, 128, device=dev).bfloat16()
        k = torch.randn(T, 8, 128, device=dev).bfloat16()
        pos = torch.randint(0, 131072, (T,), device=dev)
        n = 2 * (q.numel() + k.numel())
        w.append((name, n, lambda i, q=q, k=k, pos=pos: rope_ext.apply_rope_qk(q, k, pos, layout="thd", impl=i,
                                                                                 inplace=True)))
        cache = ref.cos_sin_table(128, 10000.0, 131072, dev)
        w.append((name + " cache", n, lambda i, q=q, k=k, pos=pos, c=cache: rope_ext.apply_rope_qk(
            q, k, pos, layout="thd", impl=i, inplace=True, cos_sin_cache=c)))
    return w


def main():
    ws = workloads()
    settings = [("flat", 0), ("flat", 1), ("flat", 2), ("flat", 4), ("flat", 8), ("flat", 16), ("fp32x4_tile", 0)]
    print(f"{torch.cuda.get_device_name()}; us per call (CUDA graph, cold L2)")
    print(f"{'':<20}" + "".join(f"{n:>11}" for n, _, _ in ws))
    print(f"{'MB of x':<20}" + "".join(f"{b / 2**20:>11.2f}" for _, b, _ in ws))
    t = {}
    for impl, rpt in settings:
        rope_ext._C.set_flat_rows_per_thread(rpt)
        label = impl if impl != "flat" else f"flat rows/thr {rpt or 'auto'}"
        t[label] = [bench.graph_us(lambda fn=fn: fn(impl)) for _, _, fn in ws]
        print(f"{label:<20}" + "".join(f"{v:>11.1f}" for v in t[label]))
    rope_ext._C.set_flat_rows_per_thread(0)
    flat, tile = t["flat rows/thr auto"], t["fp32x4_tile"]
    best = [min(a, b) for a, b in zip(flat, tile)]
    print("\na size limit for flat (auto has none: issue 19): auto / min(flat, tile), geometric mean and worst")
    cands = sorted({0} | {b for _, b, _ in ws} | {2**k for k in range(18, 28)})
    scored = []
    for lim in cands:
        r = [(f if b <= lim else tl) / m for (_, b, _), f, tl, m in zip(ws, flat, tile, best)]
        gm = math.exp(sum(map(math.log, r)) / len(r))
        scored.append((gm, max(r), lim))
        print(f"  {lim:>12} ({lim / 2**20:8.2f} MB){gm:>8.3f}{max(r):>8.3f}")
    gm, worst, lim = min(scored)
    print(f"best limit: {lim} bytes (geometric mean {gm:.3f}, worst {worst:.3f}); auto ignores it "
          "(issue 19): a limit above 0 here would argue for bringing flat back")
    faster = [(lab, n) for lab in t if lab.startswith("flat rows/thr") and lab != "flat rows/thr auto"
              for (n, _, _), v, f in zip(ws, t[lab], flat) if v < 0.95 * f]
    if faster:
        print("flat with fixed rows per thread beat the default by > 5% on: " +
              ", ".join(f"{n} ({lab})" for lab, n in faster) + "  (launch_flat's kFlatThreadsPerSM)")


if __name__ == "__main__":
    main()
