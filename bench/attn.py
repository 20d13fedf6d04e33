"""The attention suite (issues 9, 18): RoPE fused into decode attention and the KV-cache append.

    python bench/run.py --suite attn [--quick] [--plot-attn attn.png] [--json out.json]

Decode: B in {1, 8, 64}, context 512..32768, Hq = 32, Hk = 8, D = 128, bf16, contiguous
cache and paged (block 16, shuffled block table), every sequence at the full context.
Rows per point (µs; GB/s and % of copy count the KV bytes read: B * ctx * Hk * D * 2 (k, v)
* 2 bytes):
    rope_ext hybrid           attention_decode (variant 5: tensor cores, Q-RoPE on load)
    rope_ext hybrid, combine kernel   the same with the split merge in a second kernel
                              (B <= 8; auto merges <= 16 splits in a thread-block cluster)
    rope_ext hybrid, N splits forced split counts (B <= 8)
    rope_ext hybrid_simt      variant 2 (the first hybrid kernel), for comparison
    rope_ext full fusion      variant 3 (K-RoPE in the loop; the cache holds un-rotated K)
    separate                  rope_ext.apply_rope(q) + SDPA (enable_gqa) over the contiguous
                              cache: the base of "x separate" (paged rows are held against
                              the CONTIGUOUS separate time of the same point)
    torch.compile(separate)
    step: rope_ext            append_kv(new k, v) + attention_decode(hybrid): one decode step
    step: rope_ext one call   attention_decode(..., k=, v=): the same step in one launch
    step: separate            apply_rope_qk(q, k_new, in place) + cache write + SDPA (paged: a
                              gather of the blocks first); "step" rows are held against it
    step: torch.compile(separate)
    flash_attn_with_kvcache / FlashInfer decode: when importable (n/a otherwise)
    same-size read (torch.sum)  a reference (contiguous points): torch.sum of one fp32
                              buffer of the KV's bytes, timed the same way: the plain read
                              this harness allows at that size
Append: append_kv of T = 16 (16 sequences x 1 token) and T = 8192 (one sequence) tokens,
with and without q; GB/s count k, v (and q) read + written, against the separate path
(apply_rope_qk + cache writes); "same-size copy" (y.copy_(x) moving the same bytes) is
the reference.
Prefill: rope_attention fused vs separate, B in {1, 8}, S in {1, 4, 16, 64}.
FP8 (issue 20; also alone: --suite fp8): decode over a float8_e4m3fn cache against the bf16
cache at the same point (% copy of each cache's own bytes: fp8 moves half), the fp8
append_kv and append_mla (DeepSeek-V3 shapes) against rope + quantize + index_put.
Timing (CUDA): each call captured alone in a CUDA graph, the L2 flushed before every
replay, the median; a workload's rows' replays take turns in a new random order each
round (bench/timing.py's graph_us_interleaved, run.py's attn timer; ROPE_EXT_BENCH_SEQUENTIAL=1:
one row after another, graph_us); % copy against a 1 GiB copy timed the same way in the
same run. CPU: tiny shapes, wall clock.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
import timing  # noqa: E402
from timing import switched  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _rows(fns, nbytes, timer, bw, base, base_us=None):
    """Times each (name, fn): µs, GB/s of `nbytes`, % of copy, speedup over base_us (else
    the row named `base`). fn may be a string: the reason the row is n/a. A path that
    fails (OOM, unsupported) gets a row saying why. A timer with `many` ({name: fn} ->
    ({name: µs}, {name: error})) times the rows together (in turns)."""
    rows = []
    many = getattr(timer, "many", None)
    got, errs = many({n: f for n, f in fns if not isinstance(f, str)}) if many else ({}, {})
    for name, fn in fns:
        if isinstance(fn, str):
            rows.append(dict(impl=name, error=fn))
            continue
        if many and name in errs:
            rows.append(dict(impl=name, error=_first_line(errs[name])))
            continue
        try:
            us = got[name] if many else timer(fn)
        except Exception as e:  # noqa: BLE001  (the sweep goes on)
            rows.append(dict(impl=name, error=_first_line(e)))
            if CUDA:
                torch.cuda.empty_cache()
            continue
        gbs = nbytes / us / 1e3
        rows.append(dict(impl=name, us=us, gbs=gbs, pct_copy=100 * gbs / bw))
    if base_us is None:
        base_us = next((r["us"] for r in rows if "us" in r and r["impl"] == base), None)
    for r in rows:
        if "us" in r:
            r["speedup"] = base_us / r["us"] if base_us else float("nan")
    return rows


def _first_line(e):
    return (str(e).splitlines() or [type(e).__name__])[0][:80]


def _print(title, rows, ratio):
    print(f"\n{title}")
    print(f"  {'impl':<40}{'time us':>10}{'GB/s':>8}{'% copy':>8}{ratio:>12}")
    for r in rows:
        if "error" in r:
            print(f"  {r['impl']:<40}  n/a: {r['error']}")
        else:
            print(f"  {r['impl']:<40}{r['us']:>10.1f}{r['gbs']:>8.0f}{r['pct_copy']:>7.1f}%{r['speedup']:>11.2f}x")


def _sdpa(q, k, v):
    """q [B, q_len, Hq, D], k/v [B, L, Hk, D] -> [B, q_len, Hq, D]; q_len 1: no mask needed."""
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                         enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def separate_step(q, k_new, v_new, kc, vc, pos, idx, ctx, bt=None):
    """The unfused decode step: rotate q and the new k (one rope_ext launch), write k/v
    into the cache, attention over the cache with SDPA (paged: gather the blocks)."""
    rope_ext.apply_rope_qk(q, k_new, pos, inplace=True)
    B = q.shape[0]
    if bt is None:
        kc[torch.arange(B, device=q.device), idx] = k_new[:, 0]
        vc[torch.arange(B, device=q.device), idx] = v_new[:, 0]
        return _sdpa(q, kc[:, :ctx], vc[:, :ctx])
    bs = kc.shape[1]
    blk = bt[torch.arange(B, device=q.device), idx // bs].long()
    kc[blk, idx % bs] = k_new[:, 0]
    vc[blk, idx % bs] = v_new[:, 0]
    nb = -(-ctx // bs)
    k = kc[bt[:, :nb].long()].flatten(1, 2)[:, :ctx]
    v = vc[bt[:, :nb].long()].flatten(1, 2)[:, :ctx]
    return _sdpa(q, k, v)


def decode_points(quick):
    if not CUDA:
        return [(B, ctx) for B in (1, 2) for ctx in (64, 128)], 8, 2, 64
    ctxs = (512, 2048, 8192, 32768) if quick else (512, 1024, 2048, 4096, 8192, 16384, 32768)
    # ATTN_BATCHES="1,8": only these batch sizes (a short A/B run of one setting).
    batches = tuple(int(b) for b in os.environ.get("ATTN_BATCHES", "1,8,64").split(","))
    return [(B, ctx) for B in batches for ctx in ctxs], 32, 8, 128


def _separate_attn(q, kc, vc, ctx):
    """The unfused decode attention: rotate q (rope_ext), SDPA over the first ctx slots."""
    qr = rope_ext.apply_rope(q, idx_positions(q, ctx))
    return _sdpa(qr, kc[:, :ctx], vc[:, :ctx])


def idx_positions(q, ctx):
    return torch.full((q.shape[0], 1), ctx - 1, dtype=torch.long, device=q.device)


def _peer_decode():
    """Optional peers (never vendored): flash-attn's flash_attn_with_kvcache, FlashInfer's
    single-request decode. Returns {name: (fn(q, kc, vc, lens) or None, why)}."""
    peers = {}
    try:
        from flash_attn import flash_attn_with_kvcache  # noqa: PLC0415
        peers["flash_attn_with_kvcache"] = (lambda q, kc, vc, lens: flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=lens, causal=True), None)
    except Exception as e:  # noqa: BLE001
        peers["flash_attn_with_kvcache"] = (None, f"not importable ({type(e).__name__})")
    try:
        import flashinfer  # noqa: PLC0415

        def fi(q, kc, vc, lens):
            assert q.shape[0] == 1, "B = 1 only (single_decode_with_kv_cache)"
            return flashinfer.single_decode_with_kv_cache(q[0, 0], kc[0], vc[0])
        peers["flashinfer decode"] = (fi, None)
    except Exception as e:  # noqa: BLE001
        peers["flashinfer decode"] = (None, f"not importable ({type(e).__name__})")
    return peers


def decode_suite(timer, bw, quick=False):
    results = []
    points, Hq, Hk, D = decode_points(quick)
    dt = torch.bfloat16
    contiguous_sep = {}  # (B, ctx) -> separate µs: the base of the paged rows too
    compiled_attn = torch.compile(_separate_attn, dynamic=True) if CUDA else None
    compiled_step = torch.compile(separate_step, dynamic=True) if CUDA else None
    peers = _peer_decode() if CUDA else {}
    for paged in (False, True):
        for B, ctx in points:
            bs = 16
            cap = ctx  # every sequence at the full context (the new token is its last)
            if paged:
                nblk = -(-cap // bs)
                bt = torch.randperm(B * nblk, device=DEV).view(B, nblk).to(torch.int32)
                shape = (B * nblk, bs, Hk, D)
            else:
                bt, shape = None, (B, cap, Hk, D)
            try:
                kc = torch.randn(shape, device=DEV, dtype=dt)
                vc = torch.randn(shape, device=DEV, dtype=dt)
            except torch.OutOfMemoryError:
                print(f"  skipped B={B} ctx={ctx}: out of memory", file=sys.stderr)
                continue
            q = torch.randn(B, 1, Hq, D, device=DEV, dtype=dt)
            k_new = torch.randn(B, 1, Hk, D, device=DEV, dtype=dt)
            v_new = torch.randn(B, 1, Hk, D, device=DEV, dtype=dt)
            before = torch.full((B,), ctx - 1, dtype=torch.int32, device=DEV)
            lens = before + 1
            idx = before.long()
            pos = idx[:, None]  # [B, 1]
            kv_bytes = 2 * B * ctx * Hk * D * 2
            hint = dict(max_seqlen=ctx)

            def dec(impl):
                return lambda: rope_ext.attention_decode(q, kc, vc, lens, block_table=bt, impl=impl, **hint)

            def step_rope_ext():
                rope_ext.append_kv(k_new, v_new, kc, vc, before, block_table=bt)
                return rope_ext.attention_decode(q, kc, vc, lens, block_table=bt, **hint)

            fns = [("rope_ext hybrid", dec("hybrid")), ("rope_ext hybrid_simt", dec("hybrid_simt")),
                   ("rope_ext full fusion", dec("full_fusion"))]
            if CUDA and B <= 8:
                # The split merge: in the thread-block cluster (auto, <= 16 splits) or by the
                # combine kernel (decode_merge.cuh), and forced split counts around the rule's.
                fns.append(("rope_ext hybrid, combine kernel", _no_cluster(dec("hybrid"))))
                for ns in ((4, 8, 16) if ctx <= 2048 else (8, 16, 32)) if B == 1 else (1, 2, 4, 8):
                    fns.append((f"rope_ext hybrid, {ns} split{'s' if ns > 1 else ''}",
                                lambda ns=ns: rope_ext.attention_decode(q, kc, vc, lens, block_table=bt, num_splits=ns,
                                                                        **hint)))
            if not paged:
                # A reference, not a peer: the fastest plain read of the same bytes in this
                # harness (torch.sum of one buffer of the KV's size): where it stays below 90%
                # of the copy rate, so must any decode (the flush's dirty lines: timing.py).
                ref = torch.empty(kv_bytes // 4, device=DEV)
                ref_out = torch.empty((), device=DEV)
                fns += [("same-size read (torch.sum)", lambda: torch.sum(ref, dim=0, out=ref_out))]
                fns += [("separate", lambda: _separate_attn(q, kc, vc, ctx))]
                if CUDA:
                    fns += [("torch.compile(separate)", lambda: compiled_attn(q, kc, vc, ctx))]
                for name, (fn, why) in peers.items():
                    fns.append((name, (lambda f=fn: f(q, kc, vc, lens)) if fn else why))
            fns += [("step: rope_ext", step_rope_ext),
                    ("step: rope_ext one call", lambda: rope_ext.attention_decode(
                        q, kc, vc, before, block_table=bt, k=k_new, v=v_new, **hint)),
                    ("step: rope_ext one call, combine kernel", _no_cluster(lambda: rope_ext.attention_decode(
                        q, kc, vc, before, block_table=bt, k=k_new, v=v_new, **hint))),
                    ("step: separate", lambda: separate_step(q, k_new, v_new, kc, vc, pos, idx, ctx, bt))]
            if CUDA:
                fns.append(("step: torch.compile(separate)",
                            lambda: compiled_step(q, k_new, v_new, kc, vc, pos, idx, ctx, bt)))
            rows = _rows(fns, kv_bytes, timer, bw, base="separate", base_us=contiguous_sep.get((B, ctx)))
            _step_speedups(rows)
            if not paged:
                contiguous_sep[(B, ctx)] = next((r["us"] for r in rows if r["impl"] == "separate" and "us" in r), None)
            title = (f"decode {'paged(16)' if paged else 'contiguous'} B={B} ctx={ctx} Hq={Hq} Hk={Hk} D={D} bf16 "
                     f"(KV read {kv_bytes / 1e6:.1f} MB)")
            _print(title, rows, "x separate")
            results.append(dict(workload=title, kind="decode", paged=paged, B=B, ctx=ctx, rows=rows))
            del kc, vc
            ref = None
            if CUDA:
                torch.cuda.empty_cache()
    return results


def _no_cluster(fn):
    """fn with attention_decode's split merge in the combine kernel (no cluster merge):
    the A/B of decode_merge.cuh."""
    return switched(rope_ext._C.set_decode_cluster_merge, False, True, fn)


def _append_shape(shape, fn):
    """fn with append_kv's kernel shape forced (attention_dispatch.cu's list)."""
    return switched(rope_ext._C.set_append_shape, shape, -1, fn)


def _step_speedups(rows):
    """'step:' rows are held against 'step: separate' (of the same cache kind)."""
    base = next((r["us"] for r in rows if r["impl"] == "step: separate" and "us" in r), None)
    for r in rows:
        if r["impl"].startswith("step:") and "us" in r:
            r["speedup"] = base / r["us"] if base else float("nan")


def separate_append(q, k, v, kc, vc, pos, rows_b, rows_i):
    if q is None:
        rope_ext.apply_rope(k, pos, layout="thd", inplace=True)
    else:
        rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)
    kc[rows_b, rows_i] = k
    vc[rows_b, rows_i] = v


def append_suite(timer, bw, quick=False):
    results = []
    Hq, Hk, D = (32, 8, 128) if CUDA else (8, 2, 64)
    dt = torch.bfloat16
    for T in ((16, 8192) if CUDA else (16, 256)):
        B = 16 if T == 16 else 1
        per = T // B
        cap = per + 4096 if CUDA else per + 64
        kc = torch.zeros(B, cap, Hk, D, device=DEV, dtype=dt)
        vc = torch.zeros_like(kc)
        before = torch.randint(0, cap - per, (B,), device=DEV, dtype=torch.int32)
        q = torch.randn(T, Hq, D, device=DEV, dtype=dt)
        k = torch.randn(T, Hk, D, device=DEV, dtype=dt)
        v = torch.randn(T, Hk, D, device=DEV, dtype=dt)
        cu = torch.arange(0, T + 1, per, device=DEV, dtype=torch.int32)
        rows_b = torch.repeat_interleave(torch.arange(B, device=DEV), per)
        rows_i = before.long()[rows_b] + torch.arange(T, device=DEV) % per
        pos = rows_i
        for with_q in (False, True):
            nbytes = 2 * 2 * (k.numel() + v.numel() + (q.numel() if with_q else 0))
            qq = q if with_q else None
            fns = [("rope_ext append_kv", lambda: rope_ext.append_kv(k, v, kc, vc, before, cu_seqlens=cu,
                                                                      q=q if with_q else None))]
            if CUDA:  # the kernels and shapes (attention_dispatch.cu; auto: bulk, 8 KB per block, or lean)
                fns += [(f"rope_ext append_kv, shape {sh} ({desc})", _append_shape(sh, fns[0][1]))
                        for sh, desc in ((0, "registers: 4 items, 3 blocks/SM"), (1, "registers: 2 items, 4 blocks/SM"),
                                         (2, "registers: 1 item, 6 blocks/SM"), (4, "bulk, 16 KB per block"),
                                         (5, "lean"))]
            if CUDA and T == 16:  # the decode step's forms: batched [B, 1], and a paged(16) cache
                k4, v4, q4 = k.view(B, per, Hk, D), v.view(B, per, Hk, D), q.view(B, per, Hq, D)
                nbp = B * (cap // 16) + 3
                kp = torch.zeros(nbp, 16, Hk, D, device=DEV, dtype=dt)
                vp = torch.zeros_like(kp)
                btp = torch.randperm(nbp, device=DEV)[: B * (cap // 16)].view(B, -1).to(torch.int32)
                batched = lambda: rope_ext.append_kv(k4, v4, kc, vc, before, q=q4 if with_q else None)  # noqa: E731
                paged = lambda: rope_ext.append_kv(k4, v4, kp, vp, before, block_table=btp,  # noqa: E731
                                                   q=q4 if with_q else None)
                blocks128 = lambda fn: switched(rope_ext._C.set_append_lean_min_block, 128, 0, fn)  # noqa: E731
                fns += [("rope_ext append_kv, lean, 128-thread blocks", blocks128(fns[0][1])),
                        ("rope_ext append_kv, batched [B, 1]", batched),
                        ("rope_ext append_kv, batched [B, 1], 128-thread blocks", blocks128(batched)),
                        ("rope_ext append_kv, batched [B, 1], shape 1", _append_shape(1, batched)),
                        ("rope_ext append_kv, batched, paged(16)", paged),
                        ("rope_ext append_kv, batched, paged(16), shape 1", _append_shape(1, paged))]
            # A reference, not a peer: a copy of the same bytes (half read, half written).
            cx = torch.empty(nbytes // 8, device=DEV)
            cy = torch.empty_like(cx)
            fns += [("same-size copy (y.copy_(x))", lambda cx=cx, cy=cy: cy.copy_(cx)),
                   ("separate: apply_rope_qk + cache writes",
                    lambda: separate_append(qq, k, v, kc, vc, pos, rows_b, rows_i))]
            rows = _rows(fns, nbytes, timer, bw, base="separate: apply_rope_qk + cache writes")
            title = (f"append_kv T={T} ({B} sequence{'s' if B > 1 else ''}) Hk={Hk}{f' + q Hq={Hq}' if with_q else ''} "
                     f"D={D} bf16 ({nbytes / 1e6:.1f} MB moved)")
            _print(title, rows, "x separate")
            results.append(dict(workload=title, kind="append", T=T, with_q=with_q, rows=rows))
    return results


def prefill_suite(timer, bw, quick=False):
    """rope_attention (issue 18, deliverable 4): the fused path (decode kernel over k, v as
    the cache) against the separate path (apply_rope_qk + SDPA) for short prefills, to set
    where rope_attention(impl="auto") takes the fused one (rope_ext.attention.FUSED_MAX_Q)."""
    results = []
    Hq, Hk, D = (32, 8, 128) if CUDA else (8, 2, 64)
    dt = torch.bfloat16 if CUDA else torch.float32
    for B in ((1, 8) if CUDA else (1,)):
        for S in ((1, 4, 16, 64) if CUDA else (4,)):
            q = torch.randn(B, S, Hq, D, device=DEV, dtype=dt)
            k = torch.randn(B, S, Hk, D, device=DEV, dtype=dt)
            v = torch.randn(B, S, Hk, D, device=DEV, dtype=dt)
            nbytes = 2 * (q.numel() + k.numel() + v.numel()) * q.element_size()
            fns = [(f"rope_attention {impl}", lambda impl=impl: rope_ext.rope_attention(q, k, v, impl=impl))
                   for impl in ("fused", "separate")]
            rows = _rows(fns, nbytes, timer, bw, base="rope_attention separate")
            title = f"prefill rope_attention B={B} S={S} Hq={Hq} Hk={Hk} D={D} {str(dt)[6:]}"
            _print(title, rows, "x separate")
            results.append(dict(workload=title, kind="prefill", B=B, S=S, rows=rows))
    return results


FP8 = torch.float8_e4m3fn


def quantize_into(cache, rows_b, rows_i, x, scale):
    """The unfused fp8 cache write: torch's quantization, then an index_put."""
    cache[rows_b, rows_i] = (x.float() / scale).clamp(-448, 448).to(FP8)


def fp8_suite(timer, bw, quick=False):
    """Issue 20: decode over an fp8 cache against the bf16 cache (% copy of the fp8 KV
    bytes read), the fp8 append and the MLA append against their unfused paths."""
    results = []
    Hq, Hk, D = (32, 8, 128) if CUDA else (8, 2, 64)
    dt = torch.bfloat16
    ks, vs = torch.full((Hk,), 0.02, device=DEV), torch.full((1,), 0.02, device=DEV)
    # FP8_PARTS="decode" (or "append,mla"): only these parts; ATTN_BATCHES as in decode_points.
    # (`quick` takes the same points: ctx 8192 is where the fp8 targets start.)
    parts = os.environ.get("FP8_PARTS", "decode,append,mla").split(",")
    batches = tuple(int(b) for b in os.environ.get("ATTN_BATCHES", "1,8,64").split(","))
    pts = ([(B, c) for B in batches for c in (2048, 8192, 32768)] if CUDA else [(1, 128), (2, 256)])
    if "decode" not in parts:
        pts = []
    for paged in (False, True):
        for B, ctx in pts:
            bs = 16
            nblk = -(-ctx // bs)
            bt = torch.randperm(B * nblk, device=DEV).view(B, nblk).to(torch.int32) if paged else None
            shape = (B * nblk, bs, Hk, D) if paged else (B, ctx, Hk, D)
            try:
                kc, vc = torch.randn(shape, device=DEV, dtype=dt), torch.randn(shape, device=DEV, dtype=dt)
                fk, fv = (kc / ks[:, None]).to(FP8), (vc / vs).to(FP8)
            except torch.OutOfMemoryError:
                print(f"  skipped fp8 B={B} ctx={ctx}: out of memory", file=sys.stderr)
                continue
            q = torch.randn(B, 1, Hq, D, device=DEV, dtype=dt)
            lens = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
            fp8_bytes = 2 * B * ctx * Hk * D
            bf16 = _rows([("rope_ext hybrid, bf16 cache", lambda: rope_ext.attention_decode(
                q, kc, vc, lens, block_table=bt, max_seqlen=ctx))], 2 * fp8_bytes, timer, bw, base="")
            base = bf16[0].get("us")
            fp8 = _rows([("rope_ext hybrid, fp8 cache", lambda: rope_ext.attention_decode(
                q, fk, fv, lens, block_table=bt, max_seqlen=ctx, k_scale=ks, v_scale=vs))], fp8_bytes, timer, bw,
                base="", base_us=base)
            rows = bf16 + fp8
            if os.environ.get("FP8_HND"):
                # FP8_HND=1: the same caches stored head-major ([B, Hk, ctx, D], paged [blocks,
                # Hk, 16, D], viewed as [.., slot, Hk, D]): a kv head's rows contiguous instead of
                # one 128-byte (fp8) or 256-byte (bf16) row per key every Hk * D elements. Tells
                # whether DRAM page locality is what holds the interleaved layout below a plain
                # read (session of 2026-11-25, day: it is, for fp8).
                hk_, hv_ = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (kc, vc))
                fhk, fhv = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (fk, fv))
                rows += _rows([("rope_ext hybrid, bf16 cache, head-major", lambda: rope_ext.attention_decode(
                    q, hk_, hv_, lens, block_table=bt, max_seqlen=ctx))], 2 * fp8_bytes, timer, bw, base="",
                    base_us=base)
                rows += _rows([("rope_ext hybrid, fp8 cache, head-major", lambda: rope_ext.attention_decode(
                    q, fhk, fhv, lens, block_table=bt, max_seqlen=ctx, k_scale=ks, v_scale=vs))], fp8_bytes, timer,
                    bw, base="", base_us=base)
                hk_ = hv_ = fhk = fhv = None
            if not paged:  # the reference: a plain read of the fp8 KV's bytes (decode_suite's)
                ref = torch.empty(fp8_bytes // 4, device=DEV)
                ref_out = torch.empty((), device=DEV)
                rows += _rows([("same-size read (torch.sum)", lambda: torch.sum(ref, dim=0, out=ref_out))], fp8_bytes,
                              timer, bw, base="", base_us=base)
                ref = None
            if base:
                bf16[0]["speedup"] = 1.0
            title = (f"decode {'paged(16)' if paged else 'contiguous'} fp8 vs bf16 cache B={B} ctx={ctx} Hq={Hq} "
                     f"Hk={Hk} D={D} (% copy: the cache's own bytes; fp8 KV read {fp8_bytes / 1e6:.1f} MB)")
            _print(title, rows, "x bf16")
            results.append(dict(workload=title, kind="fp8_decode", paged=paged, B=B, ctx=ctx, rows=rows))
            del kc, vc, fk, fv
            if CUDA:
                torch.cuda.empty_cache()
    for T in ((16, 8192) if CUDA else (16, 256)) if "append" in parts else ():
        B = 16 if T == 16 else 1
        per = T // B
        cap = per + (4096 if CUDA else 64)
        fk, fv = torch.zeros(B, cap, Hk, D, device=DEV).to(FP8), torch.zeros(B, cap, Hk, D, device=DEV).to(FP8)
        before = torch.randint(0, cap - per, (B,), device=DEV, dtype=torch.int32)
        q = torch.randn(T, Hq, D, device=DEV, dtype=dt)
        k, v = torch.randn(T, Hk, D, device=DEV, dtype=dt), torch.randn(T, Hk, D, device=DEV, dtype=dt)
        cu = torch.arange(0, T + 1, per, device=DEV, dtype=torch.int32)
        rows_b = torch.repeat_interleave(torch.arange(B, device=DEV), per)
        rows_i = before.long()[rows_b] + torch.arange(T, device=DEV) % per
        ksb = ks[:, None]

        def separate(with_q):
            if with_q:
                rope_ext.apply_rope_qk(q, k, rows_i, layout="thd", inplace=True)
            else:
                rope_ext.apply_rope(k, rows_i, layout="thd", inplace=True)
            quantize_into(fk, rows_b, rows_i, k, ksb)
            quantize_into(fv, rows_b, rows_i, v, vs)

        for with_q in (False, True):
            nbytes = 2 * (k.numel() + v.numel()) + (k.numel() + v.numel()) + (4 * q.numel() if with_q else 0)
            fns = [("rope_ext append_kv (fp8)", lambda: rope_ext.append_kv(
                        k, v, fk, fv, before, cu_seqlens=cu, q=q if with_q else None, k_scale=ks, v_scale=vs))]
            if CUDA:
                fns += [(f"rope_ext append_kv (fp8), shape {sh} ({desc})", _append_shape(sh, fns[0][1]))
                        for sh, desc in ((0, "registers: 4 items, 3 blocks/SM"), (1, "registers: 2 items, 4 blocks/SM"),
                                         (4, "bulk, 16 KB per block"), (5, "lean"))]
            if os.environ.get("FP8_HND"):  # into head-major caches (the bulk kernel stores per head)
                hm = [torch.zeros(B, Hk, cap, D, device=DEV).to(FP8).transpose(1, 2) for _ in range(2)]
                fns += [("rope_ext append_kv (fp8), head-major cache", lambda hm=hm, wq=with_q: rope_ext.append_kv(
                    k, v, hm[0], hm[1], before, cu_seqlens=cu, q=q if wq else None, k_scale=ks, v_scale=vs))]
            fns += [
                   ("separate: rope + quantize + index_put", lambda: separate(with_q))]
            rows = _rows(fns, nbytes, timer, bw, base="separate: rope + quantize + index_put")
            title = (f"append_kv fp8 cache T={T} Hk={Hk}{f' + q Hq={Hq}' if with_q else ''} D={D} "
                     f"({nbytes / 1e6:.1f} MB moved)")
            _print(title, rows, "x separate")
            results.append(dict(workload=title, kind="fp8_append", T=T, with_q=with_q, rows=rows))
    # MLA (DeepSeek-V3: kv_lora_rank 512, rope dim 64, 128 heads for q_pe), paged(64).
    L, R, H = 512, 64, (128 if CUDA else 4)
    for T in ((16, 8192) if CUDA else (16, 256)) if "mla" in parts else ():
        for cache_dtype in (dt, FP8):
            B = 16 if T == 16 else 1
            per = T // B
            bs = 64
            nblk = -(-(per + 256) // bs)
            bt = torch.randperm(B * nblk, device=DEV).view(B, nblk).to(torch.int32)
            cache = torch.zeros(B * nblk, bs, L + R, device=DEV).to(cache_dtype)
            before = torch.randint(0, 256, (B,), device=DEV, dtype=torch.int32)
            kv_c, k_pe = torch.randn(T, L, device=DEV, dtype=dt), torch.randn(T, R, device=DEV, dtype=dt)
            q_pe = torch.randn(T, H, 128 + R, device=DEV, dtype=dt)[..., 128:]
            cu = torch.arange(0, T + 1, per, device=DEV, dtype=torch.int32)
            rows_b = torch.repeat_interleave(torch.arange(B, device=DEV), per)
            idx = before.long()[rows_b] + torch.arange(T, device=DEV) % per
            blk, off = bt[rows_b, idx // bs].long(), idx % bs
            scale = torch.full((1,), 0.02, device=DEV) if cache_dtype == FP8 else None

            def separate_mla():  # vLLM's unfused formula: rotate, concat, write
                rope_ext.apply_rope(q_pe, idx, layout="thd", interleaved=True, inplace=True)
                kr = rope_ext.apply_rope(k_pe[:, None], idx, layout="thd", interleaved=True)[:, 0]
                row = torch.cat([kv_c, kr], -1)
                cache[blk, off] = row if scale is None else (row.float() / scale).clamp(-448, 448).to(FP8)

            cb = cache.element_size()
            nbytes = 2 * (kv_c.numel() + k_pe.numel()) + cb * T * (L + R) + 4 * T * H * R
            fns = [("rope_ext append_mla", lambda: rope_ext.append_mla(kv_c, k_pe, cache, before, block_table=bt,
                                                                         q_pe=q_pe, cu_seqlens=cu, scale=scale)),
                   ("separate: rope + cat (+ quantize) + index_put", separate_mla)]
            rows = _rows(fns, nbytes, timer, bw, base="separate: rope + cat (+ quantize) + index_put")
            title = (f"append_mla T={T} L={L} R={R} + q_pe H={H}, {'fp8' if cache_dtype == FP8 else 'bf16'} "
                     f"paged(64) cache ({nbytes / 1e6:.1f} MB moved)")
            _print(title, rows, "x separate")
            results.append(dict(workload=title, kind="mla_append", T=T, rows=rows))
    return results


def attn_suite(timer, bw, quick=False, fp8_only=False):
    """Issue 9's attention suite; `timer` and `bw`: a bench/timing.py Timer (run.py's
    graph timer for this suite) and the copy bandwidth run.py measured. Returns run.py-style results: dicts with 'workload' and 'rows'.
    fp8_only: issue 20's rows alone (bench/run.py --suite fp8)."""
    print("\nattention suite: decode (Q-RoPE fused) and append_kv (K-RoPE at cache write)"
          + (f" (L2 flush: {timing.FLUSH})" if CUDA else " [CPU: tiny shapes, wall clock]"))
    if fp8_only:
        return fp8_suite(timer, bw, quick)
    # ATTN_PARTS="decode,append": only these parts (a short A/B run), like ATTN_BATCHES.
    parts = dict(decode=decode_suite, append=append_suite, prefill=prefill_suite, fp8=fp8_suite)
    wanted = os.environ.get("ATTN_PARTS", ",".join(parts)).split(",")
    return [r for name in wanted for r in parts[name](timer, bw, quick)]


def plot_attn(results, path):
    """Decode time against context length: fused (hybrid, hybrid_simt) vs separate and the
    peers, one panel per batch size; solid contiguous, dashed paged. Needs matplotlib (else says so)."""
    try:
        import matplotlib
    except ImportError:
        print(f"--plot-attn {path}: matplotlib is not installed, no plot written", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dec = [r for r in results if r.get("kind") == "decode"]
    Bs = sorted({r["B"] for r in dec})
    fig, axes = plt.subplots(1, len(Bs), figsize=(5.5 * len(Bs), 4.5), squeeze=False)
    names = [("rope_ext hybrid", "C0"), ("rope_ext hybrid_simt", "C4"), ("separate", "C1"),
             ("torch.compile(separate)", "C3"), ("flash_attn_with_kvcache", "C5"), ("flashinfer decode", "C6")]
    for ax, B in zip(axes[0], Bs):
        for paged, ls in ((False, "-"), (True, "--")):
            pts = sorted((r for r in dec if r["B"] == B and r["paged"] == paged), key=lambda r: r["ctx"])
            for name, color in names:
                xs, ys = [], []
                for r in pts:
                    row = next((x for x in r["rows"] if x["impl"] == name and "us" in x), None)
                    if row:
                        xs.append(r["ctx"])
                        ys.append(row["us"])
                if xs:
                    ax.plot(xs, ys, "o" + ls, color=color, label=f"{name} ({'paged' if paged else 'contiguous'})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"decode attention, B={B}, Hq 32, Hk 8, D 128")
        ax.set_xlabel("context length")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("µs per call (CUDA graph, cold L2)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit("run the attention suite through bench/run.py: python bench/run.py --suite attn [--quick]")
