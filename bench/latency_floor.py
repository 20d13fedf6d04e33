"""The floor under a small call in this harness (issues 18, 19: append_kv T = 16 <= 4 us,
small rope ahead of torch.compile): what a launch costs, and what each DRAM round trip
on a kernel's dependent chain adds, timed as the suites time (one call in a CUDA graph,
the L2 flushed before every replay, the median; bench/timing.py's graph_us).

    python bench/latency_floor.py [--reps 200] [--refs [--ncu]]

Rows (Triton kernels, one warp, 128 B stored):
  store only                 the launch, one store: nothing on the chain
  chain of n loads           n dependent loads, each from another 4 KB line of a cold
                             buffer (load i's value is load i+1's index), then the store
  n independent loads        the same n lines loaded at once, summed, stored
and rope_ext's small calls beside them: append_kv T = 16 (16 sequences of one token,
varlen as the attn suite, and batched [16, 1]) and the rope of [1, 16, 32, 128] bf16.
The marginal cost of one round trip tells how many a call may have on its chain and
stay under a target: a varlen append needs cu_seqlens -> the sequence's cache length
-> its slot before its stores.

--refs (the question of issues 18 and 19: is rope_ext's small-call gap its kernels'
structure, or the sin/cos it computes where the peers read a table?): minimal Triton
kernels written here (not a peer's code) that do exactly the work of rope_ext's small
calls, each with its sin/cos three ways: "table" (the row of an fp32 cos/sin table
gathered at the position, as vLLM / FlashInfer / Liger read; one more dependent load),
"accurate" (computed as rope_ext does, the angle in turns from a hi/lo frequency pair,
then libdevice sinpi/cospi: no table, no FP64) and "tl.sin" (the fp32 angle's sin/cos:
wrong past ~10^4 positions, a floor only). Every row timed in turns
(timing.graph_us_interleaved) beside rope_ext's call and a same-size copy:
  append T = 16 (batched [16, 1], Hk 8, D 128, bf16, one program per token x 4 warps,
  and per (token, head) x 1 warp): load cache_seqlens[b], rotate K, store K and V at
  the token's slot;
  rope bshd bf16 [1, S, 32, 128] out of place at S = 16, 64 (0.12, 0.5 MB; torch.compile
  in the same turns) and in place at S = 1024, 4096 (8, 32 MB; Liger there when
  importable): one program per token, 4 warps, positions 0..S-1.
rope_ext's append (batched) and out-of-place rope rows run again with `inv_freq=` HF's
table placed after the input and in a 2 MB page of its own (freq_placements; the pages
printed): the twenty-seventh session's question whether the table's page costs time.
"""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from timing import graph_us, graph_us_interleaved, profile_once, same_size_copy  # noqa: E402

try:  # triton >= 3.0 (the portable path; .cuda before it)
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover
    from triton.language.extra.cuda import libdevice

DEV = "cuda"
STRIDE = 1024  # int32 elements between the lines a chain visits (4 KB)


@triton.jit
def _chain(a_ptr, out_ptr, N: tl.constexpr):
    i = tl.zeros((), dtype=tl.int32)
    for _ in tl.static_range(N):
        i = tl.load(a_ptr + i)
    offs = tl.arange(0, 32)
    tl.store(out_ptr + offs, offs + i)


@triton.jit
def _parallel(a_ptr, out_ptr, N: tl.constexpr, STRIDE: tl.constexpr):
    s = tl.zeros((), dtype=tl.int32)
    for j in tl.static_range(N):
        s += tl.load(a_ptr + j * STRIDE)
    offs = tl.arange(0, 32)
    tl.store(out_ptr + offs, offs + s)


def cases():
    a = torch.zeros(16 * STRIDE, dtype=torch.int32, device=DEV)
    a[torch.arange(15, device=DEV) * STRIDE] = (torch.arange(15, device=DEV, dtype=torch.int32) + 1) * STRIDE
    out = torch.empty(32, dtype=torch.int32, device=DEV)
    rows = [("store only (Triton, 1 warp)", lambda: _chain[(1,)](a, out, N=0, num_warps=1))]
    for n in (1, 2, 3, 4):
        rows.append((f"chain of {n} dependent load{'s' if n > 1 else ''}",
                     lambda n=n: _chain[(1,)](a, out, N=n, num_warps=1)))
    for n in (2, 4):
        rows.append((f"{n} independent loads", lambda n=n: _parallel[(1,)](a, out, N=n, STRIDE=STRIDE, num_warps=1)))
    Hk, D = 8, 128
    k = torch.randn(16, Hk, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc = torch.zeros(16, 4096 + 1, Hk, D, device=DEV, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    before = torch.randint(0, 4096, (16,), dtype=torch.int32, device=DEV)
    cu = torch.arange(17, dtype=torch.int32, device=DEV)
    rows.append(("append_kv T=16 varlen (16 sequences)", lambda: rope_ext.append_kv(k, v, kc, vc, before, cu_seqlens=cu)))
    kb, vb = k.view(16, 1, Hk, D), v.view(16, 1, Hk, D)
    rows.append(("append_kv T=16 batched [16, 1]", lambda: rope_ext.append_kv(kb, vb, kc, vc, before)))
    x = torch.randn(1, 16, 32, 128, device=DEV, dtype=torch.bfloat16)
    rows.append(("rope [1,16,32,128] bf16 out of place", lambda: rope_ext.apply_rope(x)))
    rows.append(("rope [1,16,32,128] bf16 in place", lambda: rope_ext.apply_rope(x, inplace=True)))
    return rows


# ------------------------------------------------------------------ --refs: minimal kernels
TABLE, ACCURATE, TLSIN = 0, 1, 2
SIN_MODES = (("table", TABLE), ("accurate", ACCURATE), ("tl.sin", TLSIN))


@triton.jit
def _sincos(pos, d, cs_ptr, hi_ptr, lo_ptr, HALF: tl.constexpr, MODE: tl.constexpr):
    """sin, cos of pos * inv_freq[d] (pos an int32 scalar, d the pair indices)."""
    if MODE == 0:  # a row of the fp32 table [max_pos, 2 * HALF]: cos, then sin
        row = cs_ptr + pos.to(tl.int64) * (2 * HALF)
        c = tl.load(row + d)
        s = tl.load(row + HALF + d)
    elif MODE == 1:  # rope_ext's default: turns, exact product, sinpi/cospi of 2r
        p = pos.to(tl.float32)
        hi = tl.load(hi_ptr + d)
        lo = tl.load(lo_ptr + d)
        t = p * hi
        e = tl.fma(p, hi, -t)
        r = (t - libdevice.rint(t)) + tl.fma(p, lo, e)
        s = libdevice.sinpi(2.0 * r)
        c = libdevice.cospi(2.0 * r)
    else:
        a = pos.to(tl.float32) * tl.load(hi_ptr + d) * 6.283185307179586
        s = tl.sin(a)
        c = tl.cos(a)
    return s, c


@triton.jit
def _append_ref(k_ptr, v_ptr, kc_ptr, vc_ptr, len_ptr, cs_ptr, hi_ptr, lo_ptr, cap,
                HK: tl.constexpr, HB: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr):
    """Batched append of one token per sequence: program (b, head block of HB heads)."""
    b = tl.program_id(0)
    h = tl.program_id(1) * HB + tl.arange(0, HB)[:, None]
    d = tl.arange(0, D // 2)[None, :]
    src = b * (HK * D) + h * D + d
    k1 = tl.load(k_ptr + src).to(tl.float32)
    k2 = tl.load(k_ptr + src + D // 2).to(tl.float32)
    v1 = tl.load(v_ptr + src)
    v2 = tl.load(v_ptr + src + D // 2)
    n = tl.load(len_ptr + b)  # the one index load: the slot, and the position
    s, c = _sincos(n, d, cs_ptr, hi_ptr, lo_ptr, D // 2, MODE)
    dst = (b.to(tl.int64) * cap + n) * (HK * D) + h * D + d
    tl.store(kc_ptr + dst, (k1 * c - k2 * s).to(kc_ptr.dtype.element_ty))
    tl.store(kc_ptr + dst + D // 2, (k2 * c + k1 * s).to(kc_ptr.dtype.element_ty))
    tl.store(vc_ptr + dst, v1)
    tl.store(vc_ptr + dst + D // 2, v2)


@triton.jit
def _rope_ref(x_ptr, o_ptr, cs_ptr, hi_ptr, lo_ptr, H: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr):
    """bshd [1, S, H, D] (contiguous), position = the token's index; program = a token."""
    t = tl.program_id(0)
    h = tl.arange(0, H)[:, None]
    d = tl.arange(0, D // 2)[None, :]
    at = t.to(tl.int64) * (H * D) + h * D + d
    x1 = tl.load(x_ptr + at).to(tl.float32)
    x2 = tl.load(x_ptr + at + D // 2).to(tl.float32)
    s, c = _sincos(t, d, cs_ptr, hi_ptr, lo_ptr, D // 2, MODE)
    tl.store(o_ptr + at, (x1 * c - x2 * s).to(o_ptr.dtype.element_ty))
    tl.store(o_ptr + at + D // 2, (x2 * c + x1 * s).to(o_ptr.dtype.element_ty))


def _freq_tables(D, max_pos):
    """HF's float32 inverse frequencies (rope_ext.inv_freq) in turns as a hi/lo pair, and
    the fp32 cos/sin table the peers read (reference.cos_sin_table: cos, then sin)."""
    turns = rope_ext.inv_freq(D, 10000.0).double() / (2 * torch.pi)
    hi = turns.float()
    lo = (turns - hi.double()).float()
    return hi.to(DEV), lo.to(DEV), ref.cos_sin_table(D, 10000.0, max_pos, DEV)


PAGE = 21  # log2 of the 2 MB pages the caching allocator's segments are mapped in


def freq_placements(D, near):
    """The frequencies' page question (twenty-seventh session): do the inv_freq loads cost
    more when the table sits in a 2 MB page of its own than in the input's? Returns HF's
    inv_freq twice with a label each: allocated right after `near` (best fit usually puts
    it in near's small-pool segment, so its page, but not always: the label says which
    happened) and at the head of a 4 MB large-pool block (another segment, another page),
    plus that block (kept alive by the rows). rope_ext's default table is made at the
    process's first call, so where it lies depends on the order of allocations; it is not
    printed here."""
    f = rope_ext.inv_freq(D, 10000.0)
    near_t = f.to(DEV)
    holder = torch.empty(2**20, dtype=torch.float32, device=DEV)  # 4 MB: the large pool
    own = holder[: f.numel()]
    own.copy_(f)
    pages = [t.data_ptr() >> PAGE for t in (near, near_t, own)]
    print(f"  pages (ptr >> {PAGE}): input {pages[0]}, inv_freq allocated after it {pages[1]}, own page {pages[2]}")
    same = "in the input's page" if pages[1] == pages[0] else "allocated after the input, another page"
    return [(same, near_t), ("in its own page", own)], holder


def append_ref_rows():
    B, Hk, D, cap = 16, 8, 128, 4097
    hi, lo, cs = _freq_tables(D, cap)
    k = torch.randn(B, 1, Hk, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc = torch.zeros(B, cap, Hk, D, device=DEV, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    lens = torch.randint(0, cap - 1, (B,), dtype=torch.int32, device=DEV)
    rows = {}
    for name, mode in SIN_MODES:
        for hb, warps in ((Hk, 4), (1, 1)):
            rows[f"Triton append, {name}, {B}x{Hk // hb} programs x {warps} warp{'s' if warps > 1 else ''}"] = (
                lambda mode=mode, hb=hb, warps=warps: _append_ref[(B, Hk // hb)](
                    k, v, kc, vc, lens, cs, hi, lo, cap, HK=Hk, HB=hb, D=D, MODE=mode, num_warps=warps))
    rows["rope_ext append_kv batched [16, 1]"] = lambda: rope_ext.append_kv(k, v, kc, vc, lens)
    cu = torch.arange(B + 1, dtype=torch.int32, device=DEV)
    kt, vt = k.view(B, Hk, D), v.view(B, Hk, D)
    rows["rope_ext append_kv varlen (16 sequences)"] = lambda: rope_ext.append_kv(kt, vt, kc, vc, lens, cu_seqlens=cu)
    placed, keep = freq_placements(D, k)
    for tag, f in placed:
        rows[f"rope_ext append_kv batched, inv_freq {tag}"] = (
            lambda f=f, keep=keep: rope_ext.append_kv(k, v, kc, vc, lens, inv_freq=f))
    rows["same-size copy (k and v)"] = same_size_copy(2 * k.numel(), k.dtype)
    a = torch.zeros(32, dtype=torch.int32, device=DEV)
    out = torch.empty(32, dtype=torch.int32, device=DEV)
    rows["store only (Triton, 1 warp)"] = lambda: _chain[(1,)](a, out, N=0, num_warps=1)

    def check():  # the Triton kernels write rope_ext's cache contents (bf16 roundings apart)
        want_k = kc.clone()
        rope_ext.append_kv(k, v, want_k, vc.clone(), lens)
        for _, f in placed:
            got_k = kc.clone()
            rope_ext.append_kv(k, v, got_k, vc.clone(), lens, inv_freq=f)
            assert torch.equal(got_k, want_k), "append_kv with inv_freq= differs from the default table's"
        for name, mode in SIN_MODES[:2]:
            got = kc.clone().zero_()
            _append_ref[(B, 1)](k, v, got, vc, lens, cs, hi, lo, cap, HK=Hk, HB=Hk, D=D, MODE=mode, num_warps=4)
            sl = (torch.arange(B, device=DEV), lens.long())
            err = (got[sl].float() - want_k[sl].float()).abs().max().item()
            print(f"  check: Triton append ({name}) vs rope_ext's cache rows: max |diff| {err:.3g}")
    return rows, check


def rope_ref_rows(S, inplace, peers):
    H, D = 32, 128
    hi, lo, cs = _freq_tables(D, S)
    x = torch.randn(1, S, H, D, device=DEV).to(torch.bfloat16)
    o = x if inplace else torch.empty_like(x)
    rows = {}
    for name, mode in SIN_MODES:
        rows[f"Triton rope, {name}, {S} programs x 4 warps"] = (
            lambda mode=mode: _rope_ref[(S,)](x, o, cs, hi, lo, H=H, D=D, MODE=mode, num_warps=4))
    rows["rope_ext apply_rope"] = lambda: rope_ext.apply_rope(x, inplace=inplace)
    if not inplace:
        placed, keep = freq_placements(D, x)
        for tag, f in placed:
            rows[f"rope_ext apply_rope, inv_freq {tag}"] = (
                lambda f=f, keep=keep: rope_ext.apply_rope(x, inv_freq=f))
    if inplace and peers is not None and "Liger" in peers.mods:
        from run import hf_cos_sin
        cos, sin = hf_cos_sin(S, D, x.dtype)
        pos = torch.arange(S, device=DEV)
        rows.update({k: f for k, f in peers.x_fns(x.view(S, H, D), cos, sin, pos, cs).items() if k == "Liger"})
    if not inplace:
        from run import hf_cos_sin
        cos, sin = hf_cos_sin(S, D, x.dtype)
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        rows["torch.compile (HF's cos/sin tables)"] = lambda: comp(x, cos.view(S, 1, D), sin.view(S, 1, D))
    rows["same-size copy"] = same_size_copy(x.numel(), x.dtype)

    def check():
        if inplace:
            return
        want = rope_ext.apply_rope(x)
        for _, f in placed:
            assert torch.equal(rope_ext.apply_rope(x, inv_freq=f), want), "apply_rope with inv_freq= differs"
        for name, mode in SIN_MODES[:2]:
            _rope_ref[(S,)](x, o, cs, hi, lo, H=H, D=D, MODE=mode, num_warps=4)
            print(f"  check: Triton rope ({name}) vs rope_ext: max |diff| {(o.float() - want.float()).abs().max().item():.3g}")
    return rows, check


def refs_ncu():
    """--refs --ncu: each append row once inside the profiler range (after a warm-up), for
    `ncu --profile-from-start off --cache-control all`: the kernels' own durations,
    instructions and stalls, without the graph launch around them."""
    rows, _ = append_ref_rows()
    rows = {k: f for k, f in rows.items() if "copy" not in k and "store only" not in k}
    profile_once(rows)
    print("profiled, in order:", "; ".join(rows))


def refs(reps):
    try:
        from run import Peers
        peers = Peers()
    except Exception as e:  # noqa: BLE001
        print(f"  peers: n/a ({type(e).__name__}: {e})")
        peers = None
    blocks = [("append_kv T = 16", append_ref_rows())]
    for S, ip in ((16, False), (64, False), (1024, True), (4096, True)):
        mb = S * 32 * 128 * 2 / 2**20
        blocks.append((f"rope bshd bf16 [1, {S}, 32, 128] ({mb:g} MB) {'in place' if ip else 'out of place'}",
                       rope_ref_rows(S, ip, peers)))
    for title, (rows, check) in blocks:
        print(f"{title}: us in turns, median of {reps}")
        check()
        us, errs = graph_us_interleaved(rows, reps)
        for name, t in us.items():
            print(f"  {name:<58}{t:>8.2f}")
        for name, e in errs.items():
            print(f"  {name:<58}     n/a ({type(e).__name__}: {str(e).splitlines()[0][:70]})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--refs", action="store_true", help="the minimal Triton kernels, in turns (see above)")
    ap.add_argument("--ncu", action="store_true", help="with --refs: the append rows once each, for ncu")
    args = ap.parse_args()
    if args.ncu and not args.refs:
        ap.error("--ncu goes with --refs")
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}")
    if args.refs:
        refs_ncu() if args.ncu else refs(args.reps)
        return
    print("us: one call in a CUDA graph after the suites' L2 flush, median of", args.reps)
    base = None
    for name, fn in cases():
        try:
            us = graph_us(fn, args.reps)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:<44} n/a: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        base = us if base is None else base
        print(f"  {name:<44}{us:>8.2f}{us - base:>+8.2f} over the store-only kernel")


if __name__ == "__main__":
    main()
