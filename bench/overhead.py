"""Host cost of one eager call, decode-sized (W5: q [16,32,128] + k [16,8,128] bf16
thd, in place): the public API, its two inner paths, and an aten op for scale.

    python bench/overhead.py [--profile]

Each row: wall time per call over back-to-back calls (host + launch; the kernel is
shorter than the host work, so the host is what is measured), median of 5 runs.
The "of which" rows split the public call: its Python checks, the dispatcher-skip test,
and the C++ entry on empty tensors (argument conversion + params, no launch); the launch
is then rope_direct minus rope_direct on empty tensors.
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import _C, api  # noqa: E402
from rope_ext._ops import OPT_NAMES, ops  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def per_call_us(fn, n=2000, runs=5):
    for _ in range(200):
        fn()
    out = []
    for _ in range(runs):
        if DEV == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if DEV == "cuda":
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def main():
    T = 16
    q = torch.randn(T, 32, 128, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(T, 8, 128, device=DEV, dtype=torch.bfloat16)
    pos = torch.randint(0, 131072, (T,), device=DEV)
    cache = torch.randn(131072, 128, device=DEV)
    q4, k4 = q.unsqueeze(0), k.unsqueeze(0)
    wq, wk = torch.rand(128, device=DEV), torch.rand(128, device=DEV)
    opts = api._op_options("thd", pos, None, 10000.0, "auto", None, None, False, None, None)  # the op's options
    rows = [
        ("aten q.mul_(1.0) (one launch, for scale)", lambda: q.mul_(1.0)),
        ("torch.ops.rope_ext.rope_qk_ (dispatcher)", lambda: ops.rope_qk_(q4, k4, *opts)),
        ("rope_ext._C.rope_direct (no dispatcher)", lambda: _C.rope_direct([q, k], 3, True, *opts)),
        ("apply_rope_qk(inplace=True)", lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)),
        ("apply_rope_qk(inplace=True, cos_sin_cache)",
         lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True, cos_sin_cache=cache)),
        ("apply_rope_qk (out of place)", lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd")),
        ("rope_ext._C.rope_direct, out of place", lambda: _C.rope_direct([q, k], 3, False, *opts)),
        ("  of which: rope_direct out of place, empty q/k", lambda: _C.rope_direct([q0, k0], 3, False, *opts0)),
        ("  torch.empty_like(q), torch.empty_like(k)", lambda: (torch.empty_like(q), torch.empty_like(k))),
        ("  aten q * 1.0 (one launch and its output)", lambda: q * 1.0),
        ("bshd 4-D q, k (no views): rope_direct in place", lambda: _C.rope_direct([q4, k4], 0, True, *opts4)),
        ("  rope_direct out of place", lambda: _C.rope_direct([q4, k4], 0, False, *opts4)),
        ("  rope_direct in place, empty q/k", lambda: _C.rope_direct([q40, k40], 0, True, *opts40)),
        ("  rope_direct out of place, empty q/k", lambda: _C.rope_direct([q40, k40], 0, False, *opts40)),
        ("  torch.empty_like(q4), torch.empty_like(k4)", lambda: (torch.empty_like(q4), torch.empty_like(k4))),
        ("  q.unsqueeze(0), k.unsqueeze(0) (two views)", lambda: (q.unsqueeze(0), k.unsqueeze(0))),
        ("  torch.ops.rope_ext.rope_qk (dispatcher, out of place)", lambda: ops.rope_qk(q4, k4, *opts4)),
        ("rms_norm_rope_qk thd (out of place)", lambda: rope_ext.rms_norm_rope_qk(q, k, wq, wk, pos, layout="thd")),
        ("rms_norm_rope_qk bshd (out of place)", lambda: rope_ext.rms_norm_rope_qk(q4, k4, wq, wk, pos, layout="bshd")),
        ("  of which: _op_options (Python checks)",
         lambda: api._op_options("thd", pos, None, 10000.0, "auto", None, None, False, None, None)),
        ("  of which: _direct_ok (modes, subclasses)", lambda: api._direct_ok((q, k), 3, opts)),
        ("  of which: rope_direct, empty q/k (no launch)", lambda: _C.rope_direct([q0, k0], 3, True, *opts0)),
    ]
    q0, k0, pos0 = q[:0], k[:0], pos[:0]
    opts0 = list(opts)
    opts0[OPT_NAMES.index("positions")] = pos0
    opts4 = api._op_options("bshd", pos.unsqueeze(0), None, 10000.0, "auto", None, None, False, None, None)
    q40, k40 = q4[:, :0], k4[:, :0]
    opts40 = list(opts4)
    opts40[OPT_NAMES.index("positions")] = pos[:0].unsqueeze(0)
    name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU"
    print(f"eager host cost per call, W5 shapes, {name}")
    for label, fn in rows:
        print(f"  {label:<48}{per_call_us(fn):8.2f} us")
    # The attention family's eager calls (a decode step of one sequence: Hq 32, Hk 8, D 128,
    # bf16, a contiguous cache of 4096 slots holding 1000 tokens): since run 5 of the
    # twenty-fifth session through their direct entries (rope_ext/attention.py, _call).
    B, Hk, D, cap = 1, 8, 128, 4096
    kn = torch.randn(B, 1, Hk, D, device=DEV, dtype=torch.bfloat16)
    vn = torch.randn_like(kn)
    qn = torch.randn(B, 1, 32, D, device=DEV, dtype=torch.bfloat16)
    kc = torch.randn(B, cap, Hk, D, device=DEV, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    lens = torch.full((B,), 1000, dtype=torch.int32, device=DEV)
    for label, fn in (("append_kv (B 1, T 1)", lambda: rope_ext.append_kv(kn, vn, kc, vc, lens)),
                      ("append_kv with q", lambda: rope_ext.append_kv(kn, vn, kc, vc, lens, q=qn)),
                      ("  append_kv, empty k / v / cache", lambda: rope_ext.append_kv(kn[:0], vn[:0], kc[:0], vc[:0],
                                                                                        lens[:0])),
                      ("attention_decode (1000 keys)", lambda: rope_ext.attention_decode(qn, kc, vc, lens))):
        print(f"  {label:<48}{per_call_us(fn):8.2f} us")
    if "--profile" in sys.argv:  # where the out-of-place call's extra host time goes, by aten op
        for label, fn in (("in place", lambda: _C.rope_direct([q, k], 3, True, *opts)),
                          ("out of place", lambda: _C.rope_direct([q, k], 3, False, *opts))):
            for _ in range(200):
                fn()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(500):
                    fn()
            print(f"\nrope_direct {label}, 500 calls (torch.profiler, CPU ops)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
