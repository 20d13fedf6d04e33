"""Issue 19: where a small out-of-place rope call loses to torch.compile's kernel.

Builds bench/small_rope_study.cu (its header lists the variants and what each asks) and
times each variant, rope_ext's own calls, torch.compile's cached formula and the
same-size copy as the latency suite does (bench/timing.py graph_us: one call in a CUDA
graph, L2 flushed before every replay, median), x [S, 32, 128] bf16 out of place, at
S = 16, 64, 256, 1024 (0.12, 0.5, 2, 8 MB). Each variant's output is checked against
rope_ext's (the fake sin/cos and copy variants excepted) before it is timed.

    python bench/small_rope_study.py [--reps 200] [--only lean_global,real_k2,lean_global_far,real_k2_far] [--sizes 16,64]
    python bench/small_rope_study.py --turns --only lean_global,lean_nopos,plain_k1 --sizes 16,64

--turns times the chosen variants, the op (thd with cu_seqlens; bshd with and without the
block's sin/cos table: since the twenty-eighth session both bshd columns run
rope_lean_plain1_kernel up to S 128, which has no table), torch.compile and the copy in
turns (timing.graph_us_interleaved), as the suites do, and prints nothing else (no knob,
decode or profiler rows). The knob rows' "rule" and "K=1" likewise run plain1 for bshd there.
"""
import argparse
import os
import sys

import torch
from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from timing import graph_us, graph_us_interleaved, same_size_copy  # noqa: E402

VARIANTS = ["copy_lean", "lean_global", "lean_param", "lean_fake", "lean_table", "uni_global", "uni_param",
            "copy_uni", "uni_fake", "lean_rb2", "lean_seq", "lean_rb2_seq", "real_k2", "real_k1",
            "lines2", "lines4", "lean_nopos", "lean_smem", "lean_smem4", "lean_pf", "lean_ld", "nopos_const",
            "nopos_one", "nopos_both", "plain_k0", "plain_k1", "plain1"]
# Python-side variants: a kernel above with its output (and frequencies) in other memory.
# The op's launch of lean took ~0.2-0.3 us more than the study's launch of the same
# instance (ncu, runs 3 and 5 of 2026-11-26); the parameters differ only in the
# frequency and output pointers. The study's x, out and frequencies sit in one
# allocator segment, the op's output in the graph's pool and its frequencies in an
# early small allocation: if a cold address translation per extra segment is the
# cost, the "_far" rows (output and frequencies each behind a 64 MB spacer) take it too.
# (Run 1 of 2026-11-26 (second session), H100: far +0.23 us in graph medians at 0.12 MB,
# nothing under ncu; the _pf / _ld rows touch the output early and gained nothing (run 2,
# the .cu's header).) plain1_far (thirty-first session): ncu in the suite's regime
# (scripts/ncu_small.sh) put the op's launch of rope_lean_plain1_kernel 0.5-0.7 us over the
# study's launch of it at S 64: its far segments, or something else in the op's launch?
FAR = {"lean_global_far": "lean_global", "real_k2_far": "real_k2", "lean_pf_far": "lean_pf",
       "lean_ld_far": "lean_ld", "plain1_far": "plain1"}
EXACT = {"lean_global", "lean_param", "uni_global", "uni_param", "lean_rb2", "lean_seq", "lean_rb2_seq", "real_k2",
         "real_k1", "lines2", "lines4", "lean_nopos", "lean_smem", "lean_smem4", "lean_pf", "lean_ld", "nopos_const",
         "nopos_one", "nopos_both", "plain_k0", "plain_k1", "plain1", *FAR}  # bit-equal to rope_ext's sin/cos


def build():
    """The study's module (torch.utils.cpp_extension.load: built once, then cached)."""
    return load("small_rope_study", [os.path.join(HERE, "small_rope_study.cu")],
                extra_include_paths=[os.path.join(HERE, "..", "csrc")],
                extra_cuda_cflags=["-O3", "--expt-relaxed-constexpr", "-DROPE_EXT_ANGLE_TURNS=1"], verbose=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--only", default="", help="comma-separated variants to time (default: all)")
    ap.add_argument("--sizes", default="16,64,256,1024", help="comma-separated S (tokens)")
    ap.add_argument("--turns", action="store_true",
                    help="time the variants, rope_ext and the peers in turns (timing.graph_us_interleaved: each "
                         "replay after other kernels, as in a model) instead of one column after another, where "
                         "a kernel replayed back to back keeps its code in the SM's caches; no knob, decode or "
                         "profiler rows")
    args = ap.parse_args()
    only = set(args.only.split(",")) - {""}
    unknown = only - set(VARIANTS) - set(FAR)
    if unknown:
        raise SystemExit(f"--only: unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS + list(FAR))}")
    mod = build()
    D, H = 128, 32
    inv = rope_ext.inv_freq(D, 10000.0).float().cpu().contiguous()  # the bits rope_ext's kernels use
    freq = inv.cuda()
    seq0 = torch.zeros(1, dtype=torch.int32, device="cuda")
    C = rope_ext._C
    shown = [v for v in VARIANTS + list(FAR) if not only or v in only]
    # (Allocations under 1 MB share the caching allocator's 2 MB segments: the far ones
    # are slices of their own 8+ MB buffers, each behind a 64 MB spacer.)
    spacers = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda")]
    freq_far = torch.empty(2 << 20, device="cuda")[: freq.numel()].copy_(freq)
    print(f"{'S':>6}{'MB':>7}" + "".join(f"{v:>13}" for v in shown) +
          f"{'rope auto':>11}{'rope ip':>9}{'compile':>9}{'copy':>8}")
    for S in (int(t) for t in args.sizes.split(",")):
        x = torch.randn(S, H, D, device="cuda").bfloat16()
        out = torch.empty_like(x)
        ang = torch.arange(S, dtype=torch.float64, device="cuda")[:, None] * freq.double()
        tcos, tsin = ang.cos().float().contiguous(), ang.sin().float().contiguous()
        want = rope_ext.apply_rope(x, layout="thd", cu_seqlens=torch.tensor([0, S], dtype=torch.int32,
                                                                             device="cuda"))
        spacers.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
        out_far = torch.empty(max(x.numel(), 4 << 20), dtype=x.dtype, device="cuda")[: x.numel()].view_as(x)
        cells, fns = [], {}
        for v in shown:
            i = VARIANTS.index(FAR.get(v, v))
            o, f = (out_far, freq_far) if v in FAR else (out, freq)
            o.fill_(float("nan"))
            mod.run(i, x, o, f, inv, tcos, tsin, seq0)
            torch.cuda.synchronize()
            if v in EXACT:
                bad = (o.float() - want.float()).abs().max().item()
                note = "" if bad == 0 else f"(!{bad:.1e})"
            elif v.startswith("copy"):
                note = "" if torch.equal(o, x) else "(!copy)"
            elif v == "lean_table":
                bad = (o.float() - want.float()).abs().max().item()
                note = "" if bad <= 2 ** -7 * x.abs().max().item() else f"(!{bad:.1e})"
            else:
                note = "" if not o.isnan().any() else "(!nan)"
            fns[v] = lambda i=i, o=o, f=f: mod.run(i, x, o, f, inv, tcos, tsin, seq0)
            cells.append(note)
        cu = torch.tensor([0, S], dtype=torch.int32, device="cuda")
        if args.turns:
            emb = torch.arange(S, device="cuda").float()[:, None] * freq
            emb = torch.cat([emb, emb], -1)
            c, s_ = emb.cos().bfloat16().view(S, 1, D), emb.sin().bfloat16().view(S, 1, D)
            torch._dynamo.reset()
            comp = torch.compile(ref.apply_cos_sin, dynamic=False)
            def k1(fn):  # the op with per-lane sin/cos (set_lean_share(False), read at launch)
                def run():
                    C.set_lean_share(False)
                    try:
                        return fn()
                    finally:
                        C.set_lean_share(True)
                return run
            xb = x.view(1, S, H, D)
            fns.update({"op bshd": lambda: rope_ext.apply_rope(xb), "op bshd K=1": k1(lambda: rope_ext.apply_rope(xb)),
                        "rope auto": lambda: rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu),
                        "compile": lambda: comp(x, c, s_), "copy": same_size_copy(x.numel(), x.dtype)})
            t, err = graph_us_interleaved(fns, reps=args.reps)
            g = lambda n: t.get(n, float("nan"))  # noqa: E731 (a column that failed: nan, its error below)
            print(f"{S:>6}{x.numel() * 2 / 2**20:>7.2f}" +
                  "".join(f"{g(v) :>9.2f}{n:<4}" if len(n) <= 4 else f"{g(v):>7.2f}{n}" for v, n in zip(shown, cells)) +
                  f"{g('rope auto'):>11.2f}{'-':>9}{g('compile'):>9.2f}{g('copy'):>8.2f}  (in turns; op bshd "
                  f"{g('op bshd'):.2f}, K=1 {g('op bshd K=1'):.2f})", flush=True)
            for n, e in err.items():
                print(f"  {n}: n/a: {e}")
            continue
        for j, v in enumerate(shown):
            cells[j] = f"{graph_us(fns[v], args.reps):.2f}{cells[j]}"
        t_auto = graph_us(lambda: rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu), args.reps)
        t_ip = graph_us(lambda: rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu, inplace=True), args.reps)
        t_copy = graph_us(same_size_copy(x.numel(), x.dtype), args.reps)
        emb = torch.arange(S, device="cuda").float()[:, None] * freq
        emb = torch.cat([emb, emb], -1)
        c, s_ = emb.cos().bfloat16().view(S, 1, D), emb.sin().bfloat16().view(S, 1, D)
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        t_comp = graph_us(lambda: comp(x, c, s_), args.reps)
        graph_us(same_size_copy(x.numel(), x.dtype), 20)  # discarded (the suite's rule after compile)
        print(f"{S:>6}{x.numel() * 2 / 2**20:>7.2f}" + "".join(f"{c_:>13}" for c_ in cells) +
              f"{t_auto:>11.2f}{t_ip:>9.2f}{t_comp:>9.2f}{t_copy:>8.2f}", flush=True)
        # rope_ext's lean kernel under its knobs, bshd [1, S, 32, 128] and thd, out of place.
        xb = x.view(1, S, H, D)
        want_now = rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu, impl="fp32x4_tile")  # x was rotated in place
        knobs = {"rule": {}, "old rule (blocks to 32)": dict(min_block=1), "K=1": dict(share=False),
                 "general": dict(plain=False)}  # (general: the instance with the position code, as thd's)
        line = []
        for name, kn in knobs.items():
            C.set_lean_min_block(kn.get("min_block", 0))
            C.set_lean_share(kn.get("share", True))
            C.set_lean_plain(kn.get("plain", True))
            got = rope_ext.apply_rope(xb)
            ok = torch.equal(got.view_as(want_now), want_now)
            tb = graph_us(lambda: rope_ext.apply_rope(xb), args.reps)
            tt = graph_us(lambda: rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu), args.reps)
            line.append(f"{name}: bshd {tb:.2f} thd {tt:.2f}{'' if ok else ' (!bits)'}")
        C.set_lean_min_block(0)
        C.set_lean_share(True)
        C.set_lean_plain(True)
        print("        rope_ext lean knobs: " + "; ".join(line), flush=True)
    if args.turns:
        return
    # Decode-sized calls (q + k in place at random positions, W5's form) under lean's block
    # rule (128 threads) and the old one (set_lean_min_block(1): halved to cover the SMs):
    # the rule was measured at 0.12-8 MB only.
    for T in (1, 16):
        q = torch.randn(T, 32, D, device="cuda").bfloat16()
        k = torch.randn(T, 8, D, device="cuda").bfloat16()
        pos = torch.randint(0, 131072, (T,), device="cuda")
        cells = []
        for name, mb in (("rule", 0), ("old rule", 1)):
            C.set_lean_min_block(mb)
            cells.append(f"{name} {graph_us(lambda: rope_ext.apply_rope_qk(q, k, pos, layout='thd', inplace=True), args.reps):.2f}")
        C.set_lean_min_block(0)
        print(f"decode q[{T},32,128]+k[{T},8,128] in place, us: " + ", ".join(cells), flush=True)
    # What one out-of-place call launches (a second kernel would show here).
    x = torch.randn(1, 16, H, D, device="cuda").bfloat16()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        rope_ext.apply_rope(x)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print("kernels of one apply_rope(bshd [1, 16, 32, 128]):", names)


if __name__ == "__main__":
    main()
