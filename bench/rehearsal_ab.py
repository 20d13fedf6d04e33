"""The rehearsal pass (issues 18 and 19): the small kernels' work after their loads run
first on stand-ins while the loads are in flight, so that the code is fetched during the
DRAM round trip (rope_variants.cuh, kRehearse; attention_variants.cuh, kernel 1c). Each
row's columns in turns (timing.graph_us_interleaved: one call in a CUDA graph, the L2
flushed before each replay, median), with and without the pass (the knobs
set_lean_rehearse / set_append_lean_rehearse, read when a call launches: a graph keeps
them), beside torch.compile, Liger (in place, where importable) and a same-size copy.

    python bench/rehearsal_ab.py [--reps 200] [--sizes 16,64,256,1024] [--passes 2] [--no-append]

Rows: bshd bf16 [1, S, 32, 128] out of place and in place (S tokens, positions 0..S-1);
thd [S, 32, 128] with cu_seqlens (the general instance); fp32 [1, 16, 32, 128]; W5 (q
[16, 32, 128] + k [16, 8, 128] thd, random positions, in place); then append_kv T = 16
(bench/profile_decode.py's cases: varlen, with q, batched, batched with q, paged(16) with
q, fp8 with q) with the pass on / off. Every rehearsed output is checked bit-equal to the
output without it before timing.
"""
import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from run import hf_cos_sin, import_liger  # noqa: E402
from timing import graph_us_interleaved, same_size_copy, switched  # noqa: E402


def reh(on, f):
    return switched(rope_ext._C.set_lean_rehearse, on, False, f)


def show(title, fns, reps):
    t, err = graph_us_interleaved(fns, reps)
    print(f"{title}: " + ", ".join(f"{n} {v:.2f}" for n, v in t.items()), flush=True)
    for n, e in err.items():
        print(f"  {n}: n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})")


def same(fa, fb, what):
    a, b = fa(), fb()
    torch.cuda.synchronize()
    assert torch.equal(a, b), f"{what}: the rehearsed output differs"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--sizes", default="16,64,256,1024")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    try:
        liger = import_liger()
    except Exception as e:  # noqa: BLE001 (optional peer)
        print(f"Liger: n/a ({type(e).__name__})")
        liger = None
    print(f"device: {torch.cuda.get_device_name()}; us, median of {args.reps} graph replays, cold L2, in turns; "
          "r0 / r1: without / with the rehearsal pass")
    for ps in range(args.passes):
        print(f"--- pass {ps + 1}")
        for S in (int(s) for s in args.sizes.split(",")):
            x = torch.randn(1, S, 32, 128, device="cuda").bfloat16()
            xi = x.clone()
            xt = x.view(S, 32, 128).clone()
            cu = torch.tensor([0, S], dtype=torch.int32, device="cuda")
            cos, sin = hf_cos_sin(S, 128, x.dtype)
            c4, s4 = cos.view(1, S, 1, 128), sin.view(1, S, 1, 128)
            for on in (False, True):  # bits first: out of place, thd, and in place on copies
                same(lambda: rope_ext.apply_rope(x, impl="fp32x4_tile"), reh(on, lambda: rope_ext.apply_rope(x)),
                     f"S {S} oop r{int(on)}")
                same(lambda: rope_ext.apply_rope(xt, layout="thd", cu_seqlens=cu, impl="fp32x4_tile"),
                     reh(on, lambda: rope_ext.apply_rope(xt, layout="thd", cu_seqlens=cu)), f"S {S} thd r{int(on)}")
                same(lambda: rope_ext.apply_rope(x.clone(), inplace=True, impl="fp32x4_tile"),
                     reh(on, lambda: rope_ext.apply_rope(x.clone(), inplace=True)), f"S {S} ip r{int(on)}")
            torch._dynamo.reset()
            comp = torch.compile(ref.apply_cos_sin, dynamic=False)
            fns = {"oop r0": reh(False, lambda: rope_ext.apply_rope(x)),
                   "oop r1": reh(True, lambda: rope_ext.apply_rope(x)),
                   "ip r0": reh(False, lambda: rope_ext.apply_rope(xi, inplace=True)),
                   "ip r1": reh(True, lambda: rope_ext.apply_rope(xi, inplace=True)),
                   "thd cu r0": reh(False, lambda: rope_ext.apply_rope(xt, layout="thd", cu_seqlens=cu)),
                   "thd cu r1": reh(True, lambda: rope_ext.apply_rope(xt, layout="thd", cu_seqlens=cu)),
                   "compile": lambda: comp(x, c4, s4),
                   "copy": same_size_copy(x.numel(), x.dtype)}
            if liger is not None and S >= 2:
                h = S // 2
                xl = x.view(S, 32, 128).clone()
                qb, kb = xl[:h].unsqueeze(0).transpose(1, 2), xl[h:2 * h].unsqueeze(0).transpose(1, 2)
                c, s_ = cos[:h].unsqueeze(0).contiguous(), sin[:h].unsqueeze(0).contiguous()
                fns["Liger ip"] = lambda: liger.rope_forward(qb, kb, c, s_)
            show(f"bshd bf16 [1, {S}, 32, 128] ({x.numel() * 2 / 2**20:g} MB)", fns, args.reps)
        x = torch.randn(1, 16, 32, 128, device="cuda")
        same(lambda: rope_ext.apply_rope(x, impl="fp32x4_tile"), reh(True, lambda: rope_ext.apply_rope(x)), "fp32")
        show("bshd fp32 [1, 16, 32, 128] (0.25 MB)",
             {"oop r0": reh(False, lambda: rope_ext.apply_rope(x)), "oop r1": reh(True, lambda: rope_ext.apply_rope(x)),
              "copy": same_size_copy(x.numel(), x.dtype)}, args.reps)
        q = torch.randn(16, 32, 128, device="cuda").bfloat16()
        k = torch.randn(16, 8, 128, device="cuda").bfloat16()
        pos = torch.randint(0, 100000, (16,), device="cuda")
        for on in (False, True):
            q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
            rope_ext.apply_rope_qk(q1, k1, pos, layout="thd", inplace=True, impl="fp32x4_tile")
            reh(on, lambda: rope_ext.apply_rope_qk(q2, k2, pos, layout="thd", inplace=True))()
            torch.cuda.synchronize()
            assert torch.equal(q1, q2) and torch.equal(k1, k2), f"W5 r{int(on)}: bits"
        show("W5 q[16,32,128]+k[16,8,128] thd, in place",
             {"ip r0": reh(False, lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)),
              "ip r1": reh(True, lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)),
              "copy": same_size_copy(q.numel() + k.numel(), q.dtype)}, args.reps)
    if not args.no_append:
        cases = [f"append_{c}@r{r}" for c in ("16", "16q", "16bn", "16b", "16bp", "16f") for r in (0, 1)]
        for ps in range(args.passes):
            print(f"--- append_kv T = 16, pass {ps + 1} (bench/profile_decode.py --turns)", flush=True)
            subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "profile_decode.py"), "--turns", *cases], check=True)


if __name__ == "__main__":
    main()
