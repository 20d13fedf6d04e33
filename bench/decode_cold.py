"""Decode at small batches with its code cold (issue 18): forced split counts, merged in a
cluster or by the combine kernel, against rope + SDPA, all timed in turns.

    python bench/decode_cold.py [--reps 200] [--points 1x512,1x2048,8x512] [--splits 1,2,4,8,16]
                                [--D 128] [--Hq 32] [--Hk 8] [--simt] [--fp8] [--pair] [--loads 4,8,16]
                                [--chunks 0,1,3,5] [--paged 16] [--sweep] [--offset-mb N] [--q-len 1]
                                [--head-major] [--step]

--splits "": no forced splits (separate and auto only); --simt adds variant 2
(impl="hybrid_simt"), another large kernel between the replays, as the attn suite has;
--fp8: the forced splits over an fp8 (e4m3) copy of the cache (per-head k_scale), beside
auto over the bf16 cache; --pair (with --fp8): the forced splits and auto with one kv
head per CTA and again with two (rope_ext._C.set_decode_kv_pair(1) / (2)); --loads: each
forced split count's combine row again with the combine kernel's splits loaded per warp
forced to each listed count (rope_ext._C.set_decode_combine_loads); --chunks: auto's plan
again with the splits taking chunks of 2^(k-1) 16-key tiles round-robin for each listed k
(rope_ext._C.set_decode_split_chunk; 0 = one key range per split; auto takes 4 tiles), and
each forced split count's row again per listed k (the cluster allowed up to 16 splits: it
merges where it fits, as in the "cluster" rows, which take the rule's chunks);
--sweep: a survey of auto's plans over many points: no separate, bf16-cache or cluster
rows (the forced counts merge by the combine kernel), and each point ends with one line:
auto against the fastest forced row (a plan search, not a comparison with the peers);
--q-len N (with --sweep): N query tokens per sequence (speculative decoding's verify step);
--head-major: rope_ext's rows read the cache stored [B, Hk, ctx, D] and passed as its
transposed view (no kv-head pairs there); --step: rope_ext's rows are the one-call decode
step (attention_decode with k, v: the q_len new tokens appended at ctx - q_len, then
attended; cache_seqlens counts the tokens before the step). Both without --pair (neither
allows kv-head pairs); the separate, "auto, bf16 cache" and hybrid_simt rows keep the
contiguous cache and attend without a step;
--offset-mb N: an N MB buffer allocated before each point's tensors (where the caches lie
moves some split counts' times: run the same points at two offsets);
--paged N: rope_ext's decode rows read a paged copy of the cache (blocks of N slots in a
shuffled block table; separate, "auto, bf16 cache" and hybrid_simt keep the contiguous one). Every point also times
a plain read of the cache's bytes (torch.sum of one fp32 buffer of that size: the read this
harness allows), and its title line names auto's plan (splits, merge, the combine's
shape) and how many clusters of 4 / 8 / 16 CTAs can be resident at once
(rope_ext._C.decode_max_clusters).

Why: the split rule (attention_dispatch.cu, decode_plan) was measured with the kernel
replayed back to back, its code warm in the SM. Timed in turns (timing.graph_us_interleaved),
after other kernels, variant 5's ~2,000 instructions on the B = 1 path are fetched cold
(ncu, bench/NOTES.md, third session of 2026-11-26), and each split count runs a different
amount of code (the cluster merge, the combine kernel). The rule was also tuned at Hq 32,
Hk 8, D 128 only: the plans for other head dims and group sizes came from these rows
(NOTES, fourth session of 2026-11-26). bf16 (default Hq 32, Hk 8, D 128), contiguous
cache, every sequence at the full context.
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import rope_ext  # noqa: E402
from rope_ext import _C  # noqa: E402
from attn import _separate_attn  # noqa: E402  (the attn suite's rope + SDPA)
from timing import Timer, copy_bandwidth, graph_us_interleaved  # noqa: E402


def chunk_name(head, ck):
    """A row's name for split-chunk knob value ck (-1 the rule, 0 one range, k chunks of 2^(k-1) tiles)."""
    return f"{head}, " + ("the rule's chunks" if ck < 0 else "one range per split" if ck == 0 else
                          f"chunks of {1 << (ck - 1)} tiles")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--points", default="1x512,1x2048,8x512")
    ap.add_argument("--splits", default="1,2,4,8,16")
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--Hq", type=int, default=32)
    ap.add_argument("--Hk", type=int, default=8)
    ap.add_argument("--simt", action="store_true")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--pair", action="store_true")
    ap.add_argument("--loads", default="")
    ap.add_argument("--chunks", default="")
    ap.add_argument("--paged", type=int, default=0)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--offset-mb", type=int, default=0)
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--head-major", action="store_true")
    ap.add_argument("--step", action="store_true")
    args = ap.parse_args()
    if args.pair and (args.head_major or args.step):
        sys.exit("--pair: not with --head-major or --step (no kv-head pairs there)")
    if args.q_len < 1 or (args.q_len != 1 and not args.sweep):
        sys.exit("--q-len: >= 1, and > 1 only with --sweep (the separate row rotates one query token)")
    Hq, Hk, D = args.Hq, args.Hk, args.D
    dev = "cuda"
    bw = copy_bandwidth(Timer(20))  # GB/s, read + write: the reference of "% copy"
    for pt in args.points.split(","):
        B, ctx = (int(x) for x in pt.split("x"))
        kc = vc = kd = vd = q = ref = pad = None  # free the previous point's tensors first (--offset-mb)
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        pad = torch.empty(args.offset_mb << 20, dtype=torch.uint8, device=dev) if args.offset_mb else None  # noqa: F841
        kc = torch.randn(B, ctx, Hk, D, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        q = torch.randn(B, args.q_len, Hq, D, device=dev, dtype=torch.bfloat16)
        lens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
        step = {}  # --step: the new tokens, appended at ctx - q_len; cache_seqlens before the step
        if args.step:
            lens = lens - args.q_len
            step = dict(k=torch.randn(B, args.q_len, Hk, D, device=dev, dtype=torch.bfloat16))
            step["v"] = torch.randn_like(step["k"])
        seqmax = ctx - args.q_len if args.step else ctx
        kw = {}
        kd, vd = kc, vc  # the cache the forced splits read
        if args.fp8:
            kw = dict(k_scale=torch.full((Hk,), 0.02, device=dev), v_scale=torch.full((1,), 0.02, device=dev))
            kd, vd = ((x / 0.02).to(torch.float8_e4m3fn) for x in (kc, vc))
        nbytes = 2 * kd.numel() * kd.element_size()
        if args.head_major:  # [B, Hk, ctx, D] storage, passed as [B, ctx, Hk, D]
            if args.paged:
                sys.exit("--head-major: a contiguous cache only")
            kd, vd = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (kd, vd))
        if args.paged:  # the same keys in shuffled blocks of args.paged slots
            if ctx % args.paged:
                sys.exit(f"--paged {args.paged}: ctx {ctx} is not a multiple of the block size")
            nb = B * ctx // args.paged
            perm = torch.randperm(nb, device=dev)
            kw["block_table"] = perm.view(B, -1).to(torch.int32)
            pk, pv = (torch.empty((nb, args.paged, Hk, D), device=dev, dtype=x.dtype) for x in (kd, vd))
            pk[perm] = kd.reshape(nb, args.paged, Hk, D)
            pv[perm] = vd.reshape(nb, args.paged, Hk, D)
            kd, vd = pk, pv
        ref = torch.empty(nbytes // 4, device=dev)
        ref_out = torch.empty((), device=dev)

        def call(s=None, cluster=True, pair=0, loads=0, chunk=-1):
            def f():
                # The knobs are read on the host when the call is captured (graph_us_interleaved
                # captures every column before any replay).
                try:
                    _C.set_decode_cluster_merge(cluster)
                    _C.set_decode_kv_pair(pair)
                    _C.set_decode_combine_loads(loads)
                    _C.set_decode_split_chunk(chunk)
                    return rope_ext.attention_decode(q, kd, vd, lens, max_seqlen=seqmax, num_splits=s, **kw, **step)
                finally:
                    _C.set_decode_cluster_merge(True)
                    _C.set_decode_kv_pair(0)
                    _C.set_decode_combine_loads(0)
                    _C.set_decode_split_chunk(-1)
            return f

        fns = {"separate (rope + SDPA)": lambda: _separate_attn(q, kc, vc, ctx), "auto": call(),
               "same-size read (torch.sum)": lambda: torch.sum(ref, dim=0, out=ref_out)}
        if args.sweep:
            del fns["separate (rope + SDPA)"]
        if args.fp8 and not args.sweep:
            fns["auto, bf16 cache"] = lambda: rope_ext.attention_decode(q, kc, vc, lens, max_seqlen=ctx)
        if args.simt and not args.sweep:
            fns["hybrid_simt"] = lambda: rope_ext.attention_decode(q, kc, vc, lens, max_seqlen=ctx, impl="hybrid_simt")
        # --pair: the forced-split rows once with one kv head per CTA (mode 1) and once with
        # two (mode 2); without it auto's choice (0: attention_dispatch.cu, decode_kv_per_cta,
        # fp8_short_kv).
        for ck in (int(x) for x in args.chunks.split(",") if x):
            fns[chunk_name("auto", ck)] = call(chunk=ck)
        pairs = (1, 2) if args.pair else (0,)
        if args.pair and not args.sweep:
            fns["one head per CTA, auto splits"] = call(pair=1)
            fns["pair auto"] = call(pair=2)
        for pr in pairs:
            tag = "pair " if pr == 2 else ""
            for s in (int(x) for x in args.splits.split(",") if x):
                fns[f"{tag}splits {s} combine"] = call(s, False, pr)
                for ld in (int(x) for x in args.loads.split(",") if x):  # --loads: forced combine shapes
                    fns[f"{tag}splits {s} combine L{ld}"] = call(s, False, pr, ld)
                if 1 < s <= 16 and not args.sweep:  # past the cluster limit (kMaxClusterSplits) it would be the combine row again
                    fns[f"{tag}splits {s} cluster"] = call(s, True, pr)
                for ck in (int(x) for x in args.chunks.split(",") if x):  # --chunks: each forced count again
                    fns[chunk_name(f"{tag}splits {s}", ck)] = call(s, 1 < s <= 16 and not args.sweep, pr, chunk=ck)
        got, errs = graph_us_interleaved(fns, args.reps, captures=1)
        base = got.get("separate (rope + SDPA)", got.get("auto"))
        cache = (("fp8" if args.fp8 else "bf16") + (f" paged({args.paged})" if args.paged else "")
                 + (" head-major" if args.head_major else "") + (" step" if args.step else ""))
        rope_ext.attention_decode(q, kd, vd, lens, max_seqlen=seqmax, **kw, **step)
        plan = _C.last_decode_plan()
        kv_cta = _C.last_decode_kv_per_cta()
        cl, cw = _C.last_decode_combine()
        fits = "/".join(str(_C.decode_max_clusters("bfloat16", D, args.fp8, Hq // Hk * args.q_len, s, q.device.index))
                        for s in (4, 8, 16))
        print(f"\nB={B} ctx={ctx} Hq={Hq} Hk={Hk} D={D} q_len={args.q_len}, {cache} cache of {nbytes / 1e6:.1f} MB "
              f"(us, in turns; x = {'auto' if args.sweep else 'separate'} / this; % copy at {bw:.0f} GB/s); "
              f"auto's plan: {plan[0]} splits, "
              f"{'cluster' if plan[1] else f'combine ({cl} loads x {cw} warps)' if plan[0] > 1 else 'no merge'}, {kv_cta} kv head(s) per CTA; "
              f"resident clusters of 4/8/16 (one head per CTA): {fits}")
        for n in fns:
            if n in errs or base is None:
                print(f"  {n:<28} n/a: {str(errs.get(n, 'no base row')).splitlines()[0][:70]}")
            else:
                print(f"  {n:<28}{got[n]:8.2f}{base / got[n]:8.2f}x{100 * nbytes / (got[n] * 1e3) / bw:7.1f}%")
        if args.sweep and "auto" in got:
            forced = {n: t for n, t in got.items() if "splits" in n}
            if forced:
                best = min(forced, key=forced.get)
                print(f"  SWEEP {cache} B={B} ctx={ctx} Hq={Hq} Hk={Hk} D={D} q_len={args.q_len}: auto {got['auto']:.2f} (plan {plan[0]}, "
                      f"{kv_cta} kv/CTA) best forced {forced[best]:.2f} ({best}): auto / best "
                      f"{got['auto'] / forced[best]:.3f}")


if __name__ == "__main__":
    main()
