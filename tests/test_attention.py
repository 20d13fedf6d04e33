"""RoPE fused into attention: append_kv (rotate K once, write the KV cache) and
attention_decode (Q-RoPE on load, split-KV), rope_attention (prefill), on the CPU always
and on CUDA where there is a GPU.

Truth: rope_ext.reference.rope_attention_float64 (rotation in float64 with the float32
inv_freq, attention in float64), written without the kernels' index code. Tolerances,
stated once (o is a convex combination of rows of v, so its error scales with max|v|):
    |o - o_f64| <= ATTN_TOL[dtype] * max|v|      |lse - lse_f64| <= LSE_TOL[dtype]
fp16/bf16 include one rounding of K when append_kv writes it (the hybrid cache holds
rotated K in the cache dtype) and one of the output. Caches start as NaN: a kernel that
reads a slot it must not (past cache_seqlens, another sequence's block) fails.
"""
import pytest
import torch

import rope_ext
from rope_ext import reference as ref
from conftest import DEVICES, assert_close_f64, randn, ulp

ATTN_TOL = {torch.float32: 5e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}
LSE_TOL = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 6e-2}
OPS = torch.ops.rope_ext
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
NAN = float("nan")


def decode_dtypes(device):
    """attention_decode on CUDA: fp16/bf16 (fp32 accumulation); the CPU path also takes fp32."""
    return [torch.float16, torch.bfloat16] + ([torch.float32] if device == "cpu" else [])


def assert_attn_close(o, lse, want_o, want_lse, v_scale, what=""):
    dt = o.dtype
    o64, l64 = o.double().cpu(), lse.double().cpu()
    wo, wl = want_o.cpu(), want_lse.cpu()
    assert torch.isfinite(o64).all(), f"{what}: non-finite output"
    err = (o64 - wo).abs().max().item()
    assert err <= ATTN_TOL[dt] * v_scale, f"{what}: o max err {err:.3e} > {ATTN_TOL[dt] * v_scale:.3e}"
    fin = torch.isfinite(wl)
    assert torch.equal(torch.isfinite(l64), fin), f"{what}: lse finite where the truth is not (or vice versa)"
    assert (l64[~fin] == float("-inf")).all(), f"{what}: lse of an empty row must be -inf"
    if fin.any():
        lerr = (l64[fin] - wl[fin]).abs().max().item()
        assert lerr <= LSE_TOL[dt], f"{what}: lse max err {lerr:.3e}"


# ---------------------------------------------------------------------------- cache builders
def new_cache(B, cap, Hk, D, dtype, device, paged, block_size=16, spare_blocks=3, head_major=False):
    """NaN-filled k/v caches of capacity >= cap per sequence; paged: [num_blocks,
    block_size, Hk, D] with a shuffled block table (blocks of different sequences
    interleave, spare blocks unused). head_major: stored [B, Hk, cap, D] / [num_blocks,
    Hk, block_size, D] (FlashInfer's HND) and passed as the [.., slot, Hk, D] view."""
    def full(rows, slots):
        shape = (rows, Hk, slots, D) if head_major else (rows, slots, Hk, D)
        t = torch.full(shape, NAN, dtype=dtype, device=device)
        return t.transpose(1, 2) if head_major else t

    if not paged:
        return full(B, cap), full(B, cap), None
    max_blocks = -(-cap // block_size)
    nb = B * max_blocks + spare_blocks
    bt = torch.randperm(nb)[: B * max_blocks].view(B, max_blocks).to(torch.int32).to(device)
    return full(nb, block_size), full(nb, block_size), bt


def random_lengths(B, lo, cap):
    """Cache lengths in [lo, cap]: the capacity, the smallest, and random others (not
    multiples of the block size as a rule)."""
    lens = torch.randint(lo, cap + 1, (B,))
    lens[0] = cap
    if B > 1:
        lens[1] = lo
    return lens


ROPE_CFGS = {
    "default": dict(),
    "partial": dict(rotary_dim=32),
    "interleaved": dict(interleaved=True),
    "partial_interleaved": dict(rotary_dim=16, interleaved=True),
    "llama3_inv_freq": "inv_freq",
    "cos_sin_cache": "cache",
}


def rope_kwargs(cfg, D, device):
    c = ROPE_CFGS[cfg]
    if c == "inv_freq":
        f = rope_ext.inv_freq(D, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        return dict(inv_freq=f.to(device))
    if c == "cache":
        return dict(cos_sin_cache=ref.cos_sin_table(D, 10000.0, 6000, device))
    return dict(c)


def key_positions(mode, B, cap, device):
    """[B, cap] rotary position of every cache index, and the position keywords of
    append_kv / attention_decode that produce it."""
    idx = torch.arange(cap, device=device)[None].expand(B, cap)
    if mode == "default":
        return idx, {}
    if mode == "offset_int":
        return idx + 1000, dict(offsets=1000)
    if mode == "offset_tensor":
        off = torch.randint(0, 3000, (B,), device=device)
        return idx + off[:, None], dict(offsets=off)
    if mode == "explicit":  # positions that are not the cache index
        return torch.randint(0, 5000, (B, cap), device=device), None
    raise ValueError(mode)


def same_bits(a, b):
    """Bit-equal tensors (NaN-filled caches included)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.view(view), b.view(view))


def decode_step(step, q, kd, vd, kc, vc, prefix, shared, *, rotate_k=True, **decode_kw):
    """The decode step two ways; returns (o, lse). step "two": append_kv, then
    attention_decode over prefix + q_len keys. "one": attention_decode(k=kd, v=vd) over
    prefix (one launch where variant 5 runs), its cache writes held bit for bit to
    append_kv's (run on a copy). shared: the keywords both ops take (block_table,
    positions / offsets, frequencies, scales)."""
    prefix = prefix.to(torch.int32)
    q_len = q.shape[1]
    if step == "two":
        rope_ext.append_kv(kd, vd, kc, vc, prefix, rotate_k=rotate_k, **shared)
        return rope_ext.attention_decode(q, kc, vc, prefix + q_len, return_lse=True, **shared, **decode_kw)
    kc2, vc2 = kc.clone(), vc.clone()
    rope_ext.append_kv(kd, vd, kc2, vc2, prefix, rotate_k=rotate_k, **shared)
    seq = prefix.clone()
    out = rope_ext.attention_decode(q, kc, vc, seq, return_lse=True, k=kd, v=vd, **shared, **decode_kw)
    assert torch.equal(seq, prefix), "cache_seqlens is not modified"
    assert same_bits(kc, kc2) and same_bits(vc, vc2), "the step writes the cache as append_kv does"
    return out


def fill_and_decode(device, dtype, *, paged, G, q_len, Hk=2, D=64, B=3, cap=80, cfg="default", pos_mode="default",
                    impl="auto", num_splits=None, max_seqlen=None, block_size=16, causal=True, step="two",
                    head_major=False, q_layout="contiguous"):
    """Prefill (varlen append_kv), then the decode step (decode_step: append + decode, or
    attention_decode with k, v); returns (o, lse, want_o, want_lse, v_scale). q_layout:
    how the decode's q is laid out in memory (q_view)."""
    Hq = G * Hk
    full = impl == "full_fusion"
    rkw = rope_kwargs(cfg, D, device)
    lens = random_lengths(B, q_len, cap).to(device)
    prefix = lens - q_len
    k_full, v_full = randn((B, cap, Hk, D), dtype, device), randn((B, cap, Hk, D), dtype, device)
    q = randn((B, q_len, Hq, D), dtype, device)
    kpos, pkw = key_positions(pos_mode, B, cap, device)
    kc, vc, bt = new_cache(B, cap, Hk, D, dtype, device, paged, block_size, head_major=head_major)
    # Prefill: packed sequences of different lengths (some empty).
    cu = torch.zeros(B + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(prefix, 0)
    kp = torch.cat([k_full[b, : prefix[b]] for b in range(B)])
    vp = torch.cat([v_full[b, : prefix[b]] for b in range(B)])
    zeros = torch.zeros(B, dtype=torch.int32, device=device)
    ekw = dict(pkw) if pkw is not None else dict(positions=torch.cat([kpos[b, : prefix[b]] for b in range(B)]))
    rope_ext.append_kv(kp, vp, kc, vc, zeros, cu_seqlens=cu, block_table=bt, rotate_k=not full, **ekw, **rkw)
    # The decode step: q_len new tokens per sequence at cache index prefix[b] + j.
    sel = prefix[:, None] + torch.arange(q_len, device=device)[None]  # [B, q_len]
    kd = torch.stack([k_full[b, sel[b]] for b in range(B)])
    vd = torch.stack([v_full[b, sel[b]] for b in range(B)])
    qpos = torch.gather(kpos, 1, sel)
    dkw = dict(pkw) if pkw is not None else dict(positions=qpos)
    o, lse = decode_step(step, q_view(q, q_layout), kd, vd, kc, vc, prefix, dict(block_table=bt, **dkw, **rkw),
                         rotate_k=not full,
                         impl=impl, num_splits=num_splits, max_seqlen=max_seqlen, causal=causal)
    want_o, want_lse = ref.rope_attention_float64(q, k_full, v_full, qpos, kpos, lens, causal=causal, **rkw)
    return o, lse, want_o, want_lse, v_full.abs().max().item()


def q_view(q, layout):
    """q's values in another memory layout: "contiguous"; "strided" (feature stride Hq);
    "misaligned" (rows 2 bytes off a 16-byte boundary); "fused" (the q slice of a fused
    [B, q_len, (Hq + 2) * D] projection: aligned rows, a longer token stride); "fused_odd"
    (the same with one spare element per token: token rows not 16-byte aligned)."""
    B, q_len, Hq, D = q.shape
    if layout == "contiguous":
        return q
    if layout == "strided":
        return q.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "misaligned":
        buf = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)
        out = buf[1:].view(q.shape)
    else:
        width = (Hq + 2) * D + (1 if layout == "fused_odd" else 0)
        buf = torch.full((B, q_len, width), NAN, dtype=q.dtype, device=q.device)
        out = buf[..., : Hq * D].view(B, q_len, Hq, D)
    out.copy_(q)
    return out


# ---------------------------------------------------------------------------- append_kv then decode
@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_head_major_caches(device, paged, step):
    """Caches stored head-major (a kv head's slots contiguous: [B, Hk, cap, D] or
    [num_blocks, Hk, block_size, D]) and passed as their [.., slot, Hk, D] views: the
    layout the docs recommend for fp8 caches (DRAM page locality, docs/attention.md)."""
    for G, q_len, D in ((4, 1, 128), (1, 3, 64)):
        o, lse, wo, wl, vs = fill_and_decode(device, torch.bfloat16, paged=paged, G=G, q_len=q_len, D=D, cap=150,
                                             step=step, head_major=True)
        assert_attn_close(o, lse, wo, wl, vs, f"head-major G={G} q_len={q_len} D={D} paged={paged}")


@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
@pytest.mark.parametrize("q_len", [1, 5, 16])
@pytest.mark.parametrize("G", [1, 4, 8])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_append_then_decode_matches_float64(device, paged, G, q_len, step):
    """append_kv (varlen prefill) then the decode step (append_kv + attention_decode, or
    attention_decode with k, v) equals float64 rope + attention over the whole sequence;
    random cache lengths (q_len .. capacity: an empty history too), shuffled block tables,
    GQA ratios 1/4/8, q_len 1..16, causal inside the q block."""
    for dtype in decode_dtypes(device):
        o, lse, wo, wl, vs = fill_and_decode(device, dtype, paged=paged, G=G, q_len=q_len, step=step)
        assert_attn_close(o, lse, wo, wl, vs, f"{dtype}")


@pytest.mark.parametrize("impl", ["auto", "hybrid_simt", "full_fusion"])
def test_decode_step_beyond_one_launch(device, impl):
    """The decode step where one launch does not apply (q_len > 8, the older kernels,
    k and v misaligned views): append_kv's kernel, then the decode; same results."""
    o, lse, wo, wl, vs = fill_and_decode(device, torch.bfloat16, paged=True, G=2, q_len=17, cap=90, impl=impl,
                                         step="one")
    assert_attn_close(o, lse, wo, wl, vs, f"q_len 17 {impl}")
    B, Hk, D, dt = 2, 2, 64, torch.bfloat16
    kc, vc, _ = new_cache(B, 20, Hk, D, dt, device, paged=False)
    kc[:, :5], vc[:, :5] = randn((B, 5, Hk, D), dt, device), randn((B, 5, Hk, D), dt, device)
    buf = randn((B * Hk * D * 2 + 1,), dt, device)
    k, v = buf[1:B * Hk * D + 1].view(B, 1, Hk, D), buf[B * Hk * D + 1:].view(B, 1, Hk, D)  # 2-byte aligned rows
    q = randn((B, 1, 4, D), dt, device)
    sl = torch.tensor([5, 3], dtype=torch.int32, device=device)
    o, lse = decode_step("one", q, k, v, kc, vc, sl, {}, rotate_k=impl != "full_fusion", impl=impl)
    kc2, vc2 = kc.clone(), vc.clone()
    want = decode_step("two", q, k, v, kc2, vc2, sl, {}, rotate_k=impl != "full_fusion", impl=impl)
    assert torch.equal(o, want[0]) and torch.equal(lse, want[1]), "misaligned k, v: the two-launch road, same bits"


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_equals_rope_plus_sdpa(device, paged):
    """The decode path (append_kv of a prefill, append_kv of the step, attention_decode)
    gives what the separate path gives over the whole sequence: apply_rope_qk of all
    tokens + causal scaled_dot_product_attention, last q_len rows."""
    B, L, Hq, Hk, D, q_len = 2, 37, 8, 2, 64, 3
    dt = torch.float16
    qa, ka, va = randn((B, L, Hq, D), dt, device), randn((B, L, Hk, D), dt, device), randn((B, L, Hk, D), dt, device)
    qr, kr = rope_ext.apply_rope_qk(qa, ka)
    want = torch.nn.functional.scaled_dot_product_attention(
        qr.float().transpose(1, 2), kr.float().transpose(1, 2), va.float().transpose(1, 2), is_causal=True,
        enable_gqa=True).transpose(1, 2)[:, -q_len:]
    kc, vc, bt = new_cache(B, 48, Hk, D, dt, device, paged)
    zero = torch.zeros(B, dtype=torch.int32, device=device)
    rope_ext.append_kv(ka[:, :-q_len], va[:, :-q_len], kc, vc, zero, block_table=bt)
    rope_ext.append_kv(ka[:, -q_len:], va[:, -q_len:], kc, vc, zero + L - q_len, block_table=bt)
    o = rope_ext.attention_decode(qa[:, -q_len:], kc, vc, zero + L, block_table=bt)
    err = (o.float() - want).abs().max().item()
    assert err <= ATTN_TOL[dt] * va.abs().max().item(), err


@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
@pytest.mark.parametrize("cfg", list(ROPE_CFGS))
@pytest.mark.parametrize("pos_mode", ["default", "offset_int", "offset_tensor", "explicit"])
def test_rotary_options(device, cfg, pos_mode, step):
    """Partial rotary, GPT-J pairs, scaled inv_freq, a cos/sin cache; positions = cache
    index, + int / per-sequence offsets, or explicit positions unrelated to the index."""
    o, lse, wo, wl, vs = fill_and_decode(device, torch.bfloat16, paged=True, G=4, q_len=3, cfg=cfg, pos_mode=pos_mode,
                                         step=step)
    assert_attn_close(o, lse, wo, wl, vs, f"{cfg} {pos_mode}")


@pytest.mark.parametrize("D", [64, 128, 256])
def test_head_dims(device, D):
    for paged in (False, True):
        o, lse, wo, wl, vs = fill_and_decode(device, torch.float16, paged=paged, G=4, q_len=2, D=D, cap=70,
                                             cfg="partial" if D == 64 else "default")
        assert_attn_close(o, lse, wo, wl, vs, f"D={D} paged={paged}")


@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
def test_non_causal(device, step):
    o, lse, wo, wl, vs = fill_and_decode(device, torch.bfloat16, paged=False, G=2, q_len=4, causal=False, step=step)
    assert_attn_close(o, lse, wo, wl, vs, "causal=False")


@pytest.mark.parametrize("cfg", ["default", "partial_interleaved", "cos_sin_cache"])
@pytest.mark.parametrize("pos_mode", ["default", "offset_tensor"])
def test_full_fusion_variant(device, cfg, pos_mode):
    """Variant 3: the cache holds un-rotated K (append_kv(rotate_k=False)), rotated in the
    attention loop at index + offsets."""
    for paged in (False, True):
        o, lse, wo, wl, vs = fill_and_decode(device, torch.bfloat16, paged=paged, G=4, q_len=3, cfg=cfg,
                                             pos_mode=pos_mode, impl="full_fusion")
        assert_attn_close(o, lse, wo, wl, vs, f"full fusion {cfg} {pos_mode} paged={paged}")


@cuda
@pytest.mark.parametrize("num_splits", [1, 2, 7, 64])
def test_forced_splits_cuda(num_splits):
    """Every split count gives the same answer (the combine step; splits with no key)."""
    o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=True, G=4, q_len=2, cap=300,
                                         num_splits=num_splits)
    assert_attn_close(o, lse, wo, wl, vs, f"num_splits={num_splits}")


@cuda
def test_long_context_splits_cuda():
    """B = 1, a long context (auto split count > 1) and the max_seqlen hint."""
    for max_seqlen in (None, 5000):
        o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=False, G=4, q_len=1, B=1, cap=5000, Hk=8,
                                             D=128, max_seqlen=max_seqlen)
        assert_attn_close(o, lse, wo, wl, vs, f"long context max_seqlen={max_seqlen}")


def test_empty_sequences_give_zeros(device):
    """cache_seqlens 0 (batch padding): zeros and lse = -inf, no NaN; rows of a
    sequence shorter than q_len that see no key likewise."""
    dtype = torch.float16
    B, Hk, G, D, q_len = 3, 2, 2, 64, 4
    kc, vc, _ = new_cache(B, 32, Hk, D, dtype, device, paged=False)
    kc[:, :2] = randn((B, 2, Hk, D), dtype, device)
    vc[:, :2] = randn((B, 2, Hk, D), dtype, device)
    q = randn((B, q_len, Hk * G, D), dtype, device)
    lens = torch.tensor([0, 2, 0], dtype=torch.int32, device=device)
    o, lse = rope_ext.attention_decode(q, kc, vc, lens, return_lse=True)
    assert torch.isfinite(o).all()
    assert (o[0] == 0).all() and (o[2] == 0).all() and (lse[0] == float("-inf")).all()
    # Sequence 1 holds 2 tokens for 4 query tokens: query j sits at index j - 2; j < 2 sees nothing.
    assert (o[1, :2] == 0).all() and (lse[1, :2] == float("-inf")).all()
    assert torch.isfinite(lse[1, 2:]).all()
    qpos = lens[:, None].long() - q_len + torch.arange(q_len, device=device)  # negative: rows with no key
    qr = ref.rope_float64(q, qpos.clamp_min(0))
    wo, wl = ref.attention_float64(qr, kc.nan_to_num(), vc.nan_to_num(), lens)  # the cache holds rotated keys
    assert_attn_close(o, lse, wo, wl, 8.0, "empty rows")


# ---------------------------------------------------------------------------- append_kv on its own
@cuda
@pytest.mark.parametrize("shape", [0, 1, 2, 3, 4, 5, "5-128"])
def test_append_kernel_shapes_bit_equal_cuda(shape):
    """append_kv's kernels and shapes (rope_ext._C.set_append_shape: kernel 1's items per
    thread and blocks per SM, 0-2; the bulk kernel's bytes per block, 3-4, and the lean
    kernel, 5, where they apply) only repartition the same per-element work: caches and q
    bit-equal to auto's (for these 15 tokens the lean kernel where it applies, else kernel
    1 with shape 1), over NaN-filled caches (an unwritten slot stays
    NaN and shows), for bf16 / fp16 / fp32 / fp8 caches, paged and contiguous, varlen and
    batched, GPT-J and neox, partial rotary, q in place, v with its own head dim (MLA),
    q as a slice of a fused projection, head-major caches (the bulk kernel's per-head
    stores) and the scalar path. "5-128": the lean kernel with its blocks kept at 128
    threads (set_append_lean_min_block) instead of halved to cover the SMs."""
    dev, B, Hk, Hq = "cuda", 3, 2, 8
    min_block = 128 if shape == "5-128" else 0
    shape = 5 if shape == "5-128" else shape
    cases = [dict(dt=torch.bfloat16), dict(dt=torch.float16, interleaved=True), dict(dt=torch.float32, rotary_dim=32),
             dict(dt=torch.bfloat16, fp8=True), dict(dt=torch.bfloat16, Dv=96), dict(dt=torch.bfloat16, strided=True),
             dict(dt=torch.bfloat16, fused=True), dict(dt=torch.float16, heads_apart=True),
             dict(dt=torch.bfloat16, head_major=True), dict(dt=torch.bfloat16, fp8=True, head_major=True),
             # >= 2 tokens per SM: auto takes the bulk kernel, several tokens per block
             dict(dt=torch.bfloat16, head_major=True, T=1024), dict(dt=torch.bfloat16, fp8=True, head_major=True,
                                                                    T=1024, Dv=96)]
    for c in cases:
        for paged in (False, True):
            for varlen in (False, True):
                dt, D, Dv = c["dt"], 64, c.get("Dv", 64)
                T = c.get("T", 5)
                lens = torch.randint(0, 40, (B,), dtype=torch.int32, device=dev)
                shape_k = (B * T, Hk, D) if varlen else (B, T, Hk, D)
                k = randn(shape_k, dt, dev)
                if c.get("strided"):  # not 16-byte vectors: the scalar path
                    k = randn(shape_k[:-1] + (2 * D,), dt, dev)[..., ::2]
                v = randn(shape_k[:-1] + (Dv,), dt, dev)
                q = randn(shape_k[:-2] + (Hq, D), dt, dev)
                if c.get("fused"):  # q, k, v: views of one projection [..., (Hq + 2 Hk) D]
                    qkv = randn(shape_k[:-2] + ((Hq + 2 * Hk) * D,), dt, dev)
                    q = qkv[..., : Hq * D].unflatten(-1, (Hq, D))
                    k = qkv[..., Hq * D:(Hq + Hk) * D].unflatten(-1, (Hk, D))
                    v = qkv[..., (Hq + Hk) * D:].unflatten(-1, (Hk, D))
                if c.get("heads_apart"):  # 16-byte rows, but a token's heads not adjacent: no bulk copy
                    k = randn((Hk,) + shape_k[:-2] + (D,), dt, dev).movedim(0, -2)
                kw = dict(q=None, interleaved=c.get("interleaved", False), rotary_dim=c.get("rotary_dim"))
                if varlen:
                    kw["cu_seqlens"] = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=dev)
                kc0, vc0, bt = new_cache(B, max(64, 40 + T), Hk, D, dt, dev, paged=paged,  # one block table
                                         head_major=c.get("head_major", False))        # for both runs
                if Dv != D:
                    vc0 = torch.full(vc0.shape[:-1] + (Dv,), NAN, dtype=dt, device=dev)
                scales = {}
                if c.get("fp8"):
                    hm = c.get("head_major", False)  # the bulk kernel's per-head stores
                    kc0, vc0 = (torch.full(x.transpose(1, 2).shape if hm else x.shape, 0x7F, dtype=torch.uint8,
                                           device=dev).view(torch.float8_e4m3fn) for x in (kc0, vc0))
                    if hm:
                        kc0, vc0 = kc0.transpose(1, 2), vc0.transpose(1, 2)
                    scales = dict(k_scale=torch.full((Hk,), 0.07, device=dev), v_scale=torch.full((1,), 0.03, device=dev))
                out = []
                for sh in (-1, shape):  # auto, then the forced shape
                    kc, vc, qq = kc0.clone(), vc0.clone(), q.clone()
                    rope_ext._C.set_append_shape(sh)
                    rope_ext._C.set_append_lean_min_block(min_block if sh == shape else 0)
                    try:
                        rope_ext.append_kv(k, v, kc, vc, lens, block_table=bt, **dict(kw, q=qq), **scales)
                    finally:
                        rope_ext._C.set_append_shape(-1)
                        rope_ext._C.set_append_lean_min_block(0)
                    torch.cuda.synchronize()
                    out.append((kc, vc, qq))
                what = f"{c} paged={paged} varlen={varlen}"
                for a, b in zip(*out):
                    assert same_bits(a, b), f"shape {shape} differs from the default: {what}"


LEAN_CASES = {  # append_kv cases the lean kernel (1c) covers, each against kernel 1
    "bf16": dict(),
    "fp16_gptj": dict(dt=torch.float16, interleaved=True),
    "fp32": dict(dt=torch.float32),
    "fp32_gptj": dict(dt=torch.float32, interleaved=True),  # 4 bytes hold no GPT-J pair: W 8
    "fp8_fp32": dict(dt=torch.float32, fp8=True),
    "d512_gptj": dict(D=512, Hq=2, interleaved=True),  # 256 chunks at 4 bytes: W 8
    "d128_gqa": dict(D=128, Hq=16),
    "d256_no_q": dict(D=256, Hq=0),
    "hk1": dict(Hk=1, Hq=4),
    "positions": dict(positions=True),
    "offsets": dict(offsets=True),
    "offset_scale_inv_freq": dict(offset=1000003, inv_freq=True, attention_factor=0.7),
    "varlen_empty_seqs": dict(varlen=(0, 3, 0, 1, 4, 0)),
    "varlen_31_seqs": dict(varlen=tuple([1] * 31)),
    "fp8_per_head": dict(fp8=True),
    "fp8_gptj_varlen": dict(fp8=True, interleaved=True, varlen=(2, 0, 3)),
    "block_1": dict(block_size=1),
    "head_major": dict(head_major=True),
    # index tensors of the other width (the kernel loads them as raw words, either width)
    "varlen_offsets_int64": dict(varlen=(2, 0, 3, 1), offsets=True, index64=True),
    "batched_int64": dict(index64=True),
    "varlen_positions_int32": dict(varlen=(1, 2, 0, 2), positions=True, pos32=True),
    "varlen_offsets_int32_strided": dict(varlen=(2, 1, 0, 3), offsets=True, off32=True, strided=True),
    "batched_positions_int32_strided": dict(positions=True, pos32=True, index64=True, strided=True),
}


@cuda
@pytest.mark.parametrize("lean_bytes", [8, 4])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("case", list(LEAN_CASES))
def test_append_lean_kernel_cuda(case, paged, lean_bytes):
    """The lean kernel (1c, auto's below 2 tokens per SM), with 8- and 4-byte chunks
    (set_append_lean_bytes; fp32 GPT-J keeps 8), writes the caches and q bit-equal
    to kernel 1 (shape 1) over NaN-filled caches, and did run (last_append_kernel): GQA,
    no q, one kv head, GPT-J, fp32, fp8 with per-head scales, explicit positions, per-
    sequence offsets, a scalar offset with inv_freq and attention_factor, packed sequences
    with empty ones and up to 31 of them, block size 1, head-major caches, int64 cache
    lengths / cu_seqlens / block tables, int32 positions and offsets, index tensors with an
    element stride of 2 (every other entry garbage); the rows also against the float64
    rotation."""
    c = LEAN_CASES[case]
    dev, dt = "cuda", c.get("dt", torch.bfloat16)
    B, T, Hk, Hq, D = 3, 2, c.get("Hk", 2), c.get("Hq", 8), c.get("D", 64)
    varlen = c.get("varlen")
    if varlen:
        B = len(varlen)
        n_new = torch.tensor(varlen)
    else:
        n_new = torch.full((B,), T)
    Ttot = int(n_new.sum())
    lens = torch.randint(0, 30, (B,), dtype=torch.int32)
    shape = (Ttot,) if varlen else (B, T)
    k, v = randn(shape + (Hk, D), dt, dev), randn(shape + (Hk, D), dt, dev)
    q = randn(shape + (Hq, D), dt, dev) if Hq else None
    kw = dict(interleaved=c.get("interleaved", False))
    idt = torch.int64 if c.get("index64") else torch.int32
    if varlen:
        kw["cu_seqlens"] = torch.cat([torch.zeros(1), n_new.cumsum(0)]).to(idt).to(dev)
    seq = torch.repeat_interleave(torch.arange(B), n_new)
    j = torch.cat([torch.arange(n) for n in n_new.tolist()]) if Ttot else torch.zeros(0, dtype=torch.long)
    idx = lens[seq].long() + j  # cache index of each token (flat order)
    pos = idx.clone()
    if c.get("positions"):
        p = torch.randint(0, 200000, shape, dtype=torch.int32 if c.get("pos32") else torch.int64)
        kw["positions"] = p.to(dev)
        pos = p.reshape(-1).long()
    if c.get("offsets"):
        off = torch.randint(0, 70000, (B,), dtype=torch.int32 if c.get("off32") else torch.int64)
        kw["offsets"] = off.to(dev)
        pos = idx + off[seq].long()
    if c.get("offset"):
        kw["offsets"] = c["offset"]  # an int: every sequence's offset
        pos = idx + c["offset"]
    if c.get("inv_freq"):
        kw["inv_freq"] = rope_ext.inv_freq(D, 500000.0, {"rope_type": "llama3", "factor": 8.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 8192}).to(dev)
    if c.get("attention_factor"):
        kw["attention_factor"] = c["attention_factor"]
    kc0, vc0, bt = new_cache(B, 40, Hk, D, dt, dev, paged=paged, block_size=c.get("block_size", 16),
                             head_major=c.get("head_major", False))
    if bt is not None:
        bt = bt.to(idt)
    # "strided": every index tensor a view with element stride 2 (garbage between entries)
    spread = (lambda t: torch.stack([t, torch.full_like(t, -7)], -1)[..., 0]) if c.get("strided") else (lambda t: t)
    for name in ("cu_seqlens", "positions", "offsets"):
        if isinstance(kw.get(name), torch.Tensor):
            kw[name] = spread(kw[name])
    bt = spread(bt) if bt is not None else None
    scales = {}
    if c.get("fp8"):
        kc0, vc0 = (torch.full(x.shape, 0x7F, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
                    for x in (kc0, vc0))
        scales = dict(k_scale=torch.rand(Hk, device=dev) * 0.1 + 0.02, v_scale=torch.tensor([0.03], device=dev))
    out = []
    for sh in (5, 1):  # lean, then kernel 1
        kc, vc = kc0.clone(), vc0.clone()
        qq = q.clone() if q is not None else None
        try:
            rope_ext._C.set_append_shape(sh)
            rope_ext._C.set_append_lean_bytes(lean_bytes)
            rope_ext.append_kv(k, v, kc, vc, spread(lens.to(idt).to(dev)), block_table=bt, q=qq, **kw, **scales)
            torch.cuda.synchronize()
            ran = rope_ext._C.last_append_kernel()
        finally:
            rope_ext._C.set_append_shape(-1)
            rope_ext._C.set_append_lean_bytes(0)
        assert ran == (3 if sh == 5 else 1), f"{case}: shape {sh} ran kernel {ran}"
        if sh == 5:  # the width it ran at: 4 where asked and a 4-byte chunk holds a pair in <= 128 chunks a row
            w4_ok = not (dt == torch.float32 and kw["interleaved"]) and (D if kw["interleaved"] else D // 2) // (4 // dt.itemsize) <= 128
            want_w = 4 if lean_bytes == 4 and w4_ok else 8
            assert rope_ext._C.last_append_lean_bytes() == want_w, (case, rope_ext._C.last_append_lean_bytes(), want_w)
        out.append((kc, vc, qq))
    for a, b in zip(*out):
        if a is not None:
            assert same_bits(a, b), f"{case} paged={paged}: the lean kernel differs from kernel 1"
    kc, vc, qq = out[0]
    rkw = {x: kw[x] for x in ("interleaved", "inv_freq", "attention_factor") if x in kw}
    flat = lambda x: x.reshape(Ttot, -1, D)  # noqa: E731
    if qq is not None:
        want = ref.rope_float64(flat(q), pos.to(dev), layout="thd", **rkw)
        assert_close_f64(flat(qq), want, 8.0, f"{case}: q in place")
    if not c.get("fp8"):  # (fp8 rows: bit-equal to kernel 1 above, whose truth test_fp8_mla holds)
        rows_k = cache_rows(kc, bt, seq.to(dev), idx.to(dev))
        assert_close_f64(rows_k, ref.rope_float64(flat(k), pos.to(dev), layout="thd", **rkw), 8.0, f"{case}: k")
        assert torch.equal(cache_rows(vc, bt, seq.to(dev), idx.to(dev)), flat(v)), f"{case}: v copied exactly"


@pytest.mark.skipif(not rope_ext.WITH_CUDA, reason="the knob is in CUDA builds")
def test_append_lean_bytes_checked():
    """The lean append kernel's chunk-bytes knob takes 0 (the rule), 4 or 8, else a ValueError."""
    try:
        for bad in (1, 2, 16, -4):
            with pytest.raises(ValueError, match="set_append_lean_bytes"):
                rope_ext._C.set_append_lean_bytes(bad)
    finally:
        rope_ext._C.set_append_lean_bytes(0)


def cache_rows(cache, bt, seq, idx):
    """The cache rows [T, Hk, D] of tokens (seq, idx): contiguous or paged (bt)."""
    if bt is None:
        return cache[seq, idx]
    bs = cache.shape[1]
    return cache[bt[seq, idx // bs].long(), idx % bs]


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_append_kv_fused_projection_and_q(device, paged, dtype):
    """q, k, v as strided views of one fused projection [T, (Hq + 2 Hk) * D] (varlen):
    one call rotates q in place, writes rotated k and exact v into the new slots, and
    leaves every other slot untouched."""
    Hq, Hk, D, B = 8, 2, 64, 3
    cap = 48
    before = torch.tensor([5, 0, 17], dtype=torch.int32)
    new = torch.tensor([3, 9, 1])
    T = int(new.sum())
    qkv = randn((T, (Hq + 2 * Hk) * D), dtype, device)
    q = qkv[:, : Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D:(Hq + Hk) * D].view(T, Hk, D)
    v = qkv[:, (Hq + Hk) * D:].view(T, Hk, D)
    q0, k0, v0 = q.clone(), k.clone(), v.clone()
    cu = torch.tensor([0, 3, 12, 13], dtype=torch.int32, device=device)
    kc, vc, bt = new_cache(B, cap, Hk, D, dtype, device, paged, block_size=8)
    rope_ext.append_kv(k, v, kc, vc, before.to(device), cu_seqlens=cu, block_table=bt, q=q, rotary_dim=48)
    seq = torch.repeat_interleave(torch.arange(B), new)
    idx = before[seq].long() + torch.cat([torch.arange(n) for n in new.tolist()])  # cache index of each token
    pos = idx.to(device)
    assert_close_f64(q, ref.rope_float64(q0, pos, layout="thd", rotary_dim=48), 8.0, "q in place")
    assert torch.equal(k, k0) and torch.equal(v, v0), "k and v are inputs only"

    def rows(cache):  # the cache rows of every token, [T, Hk, D]
        return cache_rows(cache, bt, seq.to(device), idx.to(device))

    assert_close_f64(rows(kc), ref.rope_float64(k0, pos, layout="thd", rotary_dim=48), 8.0, "k in the cache")
    assert torch.equal(rows(vc), v0), "v is copied exactly"
    if device == "cpu":  # the same helpers as apply_rope: the same bits
        assert torch.equal(rows(kc), rope_ext.apply_rope(k0, pos, layout="thd", rotary_dim=48))
    # Nothing else was written.
    written = torch.zeros(kc.shape[:2], dtype=torch.bool)
    if paged:
        written[bt[seq.to(device), (idx // 8).to(device)].long().cpu(), (idx % 8)] = True
    else:
        written[seq, idx] = True
    assert torch.isnan(kc.cpu()[~written]).all() and torch.isnan(vc.cpu()[~written]).all()


def test_append_kv_batched_matches_varlen(device):
    """The batched form [B, T, Hk, D] and the varlen form give the same cache: the float64
    truth in the new slots, NaN (untouched) everywhere else."""
    B, T, Hk, D = 2, 5, 2, 64
    k, v = randn((B, T, Hk, D), torch.bfloat16, device), randn((B, T, Hk, D), torch.bfloat16, device)
    sl = torch.tensor([3, 11], dtype=torch.int32, device=device)
    a = new_cache(B, 32, Hk, D, torch.bfloat16, device, False)
    b = new_cache(B, 32, Hk, D, torch.bfloat16, device, False)
    rope_ext.append_kv(k, v, a[0], a[1], sl, interleaved=True)
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32, device=device)
    rope_ext.append_kv(k.flatten(0, 1), v.flatten(0, 1), b[0], b[1], sl, cu_seqlens=cu, interleaved=True)
    pos = sl[:, None].long() + torch.arange(T, device=device)
    want_k = ref.rope_float64(k, pos, interleaved=True)
    for kc, vc, _ in (a, b):
        for s in range(B):
            new = slice(int(sl[s]), int(sl[s]) + T)
            assert_close_f64(kc[s, new], want_k[s], 8.0, f"k of sequence {s}")
            assert torch.equal(vc[s, new], v[s]), "v is copied exactly"
            kc[s, new], vc[s, new] = float("nan"), float("nan")
        assert torch.isnan(kc).all() and torch.isnan(vc).all(), "only the new slots are written"


@pytest.mark.parametrize("B", [37, 300], ids=["lens-early", "lens-per-token"])
def test_append_kv_varlen_many_sequences(device, B):
    """Varlen appends of many sequences, some with no new token: the kernel loads every
    sequence's cache length up front when B <= 256 (its block size) and per token
    otherwise; both write the float64 truth into exactly the new slots."""
    Hk, D, cap = 2, 64, 24
    new = torch.randint(0, 4, (B,))
    new[::7] = 0
    T = int(new.sum())
    before = torch.randint(0, cap - 3, (B,), dtype=torch.int32)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(new, 0)
    k, v = randn((T, Hk, D), torch.bfloat16, device), randn((T, Hk, D), torch.bfloat16, device)
    kc, vc, _ = new_cache(B, cap, Hk, D, torch.bfloat16, device, False)
    rope_ext.append_kv(k, v, kc, vc, before.to(device), cu_seqlens=cu.to(device))
    seq = torch.repeat_interleave(torch.arange(B), new)
    idx = before[seq].long() + (torch.arange(T) - cu[seq].long())
    sd, idd = seq.to(device), idx.to(device)
    assert_close_f64(kc[sd, idd], ref.rope_float64(k, idd, layout="thd"), 8.0, "k in the cache")
    assert torch.equal(vc[sd, idd], v), "v is copied exactly"
    kc[sd, idd], vc[sd, idd] = float("nan"), float("nan")
    assert torch.isnan(kc).all() and torch.isnan(vc).all(), "only the new slots are written"


@pytest.mark.parametrize("rotary_dim,interleaved", [(64, False), (6, False), (10, True)])
def test_append_kv_scalar_path(device, rotary_dim, interleaved):
    """Inputs the 16-byte kernel cannot take (feature stride != 1, a rotary half of 3
    pairs) go through the scalar path of the same kernel: the same cache as contiguous
    input, and float64-exact to one rounding."""
    B, T, Hk, D = 2, 3, 2, 64
    k, v = randn((B, T, Hk, D), torch.float16, device), randn((B, T, Hk, D), torch.float16, device)
    kt = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    vt = v.transpose(-1, -2).contiguous().transpose(-1, -2)
    sl = torch.tensor([0, 7], dtype=torch.int32, device=device)
    a = new_cache(B, 16, Hk, D, torch.float16, device, False)
    b = new_cache(B, 16, Hk, D, torch.float16, device, False)
    kw = dict(rotary_dim=rotary_dim, interleaved=interleaved)
    rope_ext.append_kv(k, v, a[0], a[1], sl, **kw)
    rope_ext.append_kv(kt, vt, b[0], b[1], sl, **kw)
    assert torch.equal(a[0].nan_to_num(), b[0].nan_to_num()) and torch.equal(a[1].nan_to_num(), b[1].nan_to_num())
    pos = sl[:, None].long() + torch.arange(T, device=device)
    assert_close_f64(a[0][0, :3], ref.rope_float64(k, pos, **kw)[0], 8.0, "k of sequence 0")
    assert_close_f64(a[0][1, 7:10], ref.rope_float64(k, pos, **kw)[1], 8.0, "k of sequence 1")


def test_kv_halves_of_one_buffer(device):
    """k_cache and v_cache as the two halves of one [num_blocks, 2, block_size, Hk, D]
    buffer (FlashInfer's layout) are disjoint views: accepted, and equal to separate caches."""
    B, Hk, D, bs = 2, 2, 64, 8
    kv = torch.zeros(5, 2, bs, Hk, D, dtype=torch.bfloat16, device=device)
    bt = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32, device=device)
    k, v = randn((B, 5, Hk, D), torch.bfloat16, device), randn((B, 5, Hk, D), torch.bfloat16, device)
    sl = torch.tensor([2, 9], dtype=torch.int32, device=device)
    rope_ext.append_kv(k, v, kv[:, 0], kv[:, 1], sl, block_table=bt)
    kc, vc = torch.zeros_like(kv[:, 0]), torch.zeros_like(kv[:, 1])
    rope_ext.append_kv(k, v, kc, vc, sl, block_table=bt)
    assert torch.equal(kv[:, 0], kc) and torch.equal(kv[:, 1], vc)
    # The new slots hold the float64 truth (rotated k, exact v).
    for s in range(B):
        idx = int(sl[s]) + torch.arange(5)
        blk, off = bt[s, (idx // bs).to(device)].long(), (idx % bs).to(device)
        pos = (int(sl[s]) + torch.arange(5, device=device))[None]
        assert_close_f64(kv[blk, 0, off], ref.rope_float64(k[s:s + 1], pos)[0], 8.0, f"k of sequence {s}")
        assert torch.equal(kv[blk, 1, off], v[s]), "v is copied exactly"
    q = randn((B, 1, 4, D), torch.bfloat16, device)
    o = rope_ext.attention_decode(q, kv[:, 0], kv[:, 1], sl + 5, block_table=bt)
    assert torch.equal(o, rope_ext.attention_decode(q, kc, vc, sl + 5, block_table=bt))
    # Against the truth: the slots gathered into contiguous [B, L, Hk, D] caches.
    L = int(sl.max()) + 5
    slot = torch.arange(L)
    rows = [kv[bt[s, (slot // bs).to(device)].long(), :, (slot % bs).to(device)] for s in range(B)]  # [L, 2, Hk, D]
    kd, vd = torch.stack([r[:, 0] for r in rows]), torch.stack([r[:, 1] for r in rows])
    qpos = (sl + 4).long()[:, None]
    wo, _ = ref.attention_float64(ref.rope_float64(q, qpos), kd, vd, sl + 5)
    assert (o.double().cpu() - wo.cpu()).abs().max().item() <= ATTN_TOL[torch.bfloat16] * v.abs().max().item()


# ---------------------------------------------------------------------------- rope_attention (prefill)
@pytest.mark.parametrize("S", [1, 7, 16, 40])
@pytest.mark.parametrize("impl", ["auto", "fused", "separate"])
def test_rope_attention(device, S, impl):
    B, Hq, Hk, D = 2, 8, 2, 64
    dtype = torch.bfloat16
    q, k, v = randn((B, S, Hq, D), dtype, device), randn((B, S, Hk, D), dtype, device), randn((B, S, Hk, D), dtype, device)
    for positions in (None, torch.randint(0, 4000, (B, S), device=device), torch.arange(5, 5 + S, device=device)):
        for causal in (True, False):
            out = rope_ext.rope_attention(q, k, v, positions, causal=causal, impl=impl, rotary_dim=32)
            pos = torch.arange(S, device=device)[None].expand(B, S) if positions is None else positions.expand(B, S)
            wo, _ = ref.rope_attention_float64(q, k, v, pos, pos, causal=causal, rotary_dim=32)
            assert out.shape == q.shape and out.dtype == dtype
            err = (out.double().cpu() - wo.cpu()).abs().max().item()
            assert err <= ATTN_TOL[dtype] * v.abs().max().item(), f"positions={positions is not None} causal={causal}: {err}"


def test_as_cache_aligns_a_misaligned_contiguous_view():
    """rope_attention's fused path hands k, v to attention_decode as caches, which CUDA needs
    16-byte aligned: a contiguous view at an odd offset must be copied (t.contiguous() is a
    no-op on it)."""
    from rope_ext.attention import _as_cache
    buf = torch.randn(1 + 2 * 3 * 2 * 64).to(torch.bfloat16)
    k = buf[1:].view(2, 3, 2, 64)
    assert k.is_contiguous() and k.data_ptr() % 16 != 0
    c = _as_cache(k)
    assert c.data_ptr() % 16 == 0 and torch.equal(c, k)


def test_rope_attention_gqa_heads_checked(device):
    """Hq not a multiple of Hk: rope_attention's own ValueError, before q or k is touched
    (it rotated both, then SDPA raised)."""
    q, k, v = (randn((1, 4, h, 16), torch.float32, device) for h in (3, 2, 2))
    q0, k0 = q.clone(), k.clone()
    for impl in ("auto", "separate"):
        with pytest.raises(ValueError, match="multiple of"):
            rope_ext.rope_attention(q, k, v, impl=impl)
    assert torch.equal(q, q0) and torch.equal(k, k0)


def combine_shape(num_splits, loads=0):
    """The combine kernel's (loads per warp, warps per row) that the host should pick
    (attention_dispatch.cu, combine_shape), written out independently."""
    if loads == 0:
        loads = 4 if num_splits <= 4 else 8 if num_splits <= 64 else 16
    warps = 1
    while warps < 8 and loads * warps < num_splits:
        warps *= 2
    return loads, warps


@cuda
@pytest.mark.parametrize("loads", [0, 4, 8, 16])
@pytest.mark.parametrize("num_splits", [3, 12, 19, 40, 100, 300])
def test_combine_nan_and_empty_cuda(num_splits, loads):
    """The combine kernel with one warp per row (3 splits; 12 at 16 loads per warp: no
    shared-memory merge), several warps per row and rounds of loads (19 splits at 16 loads
    per warp: 2 warps, 40: 4, 100 and 300: 8, 300 in three rounds; at 4 loads 300 splits take
    10 rounds), every forced loads count: a NaN key in one late split makes its row NaN
    (output and lse), a sequence without keys gives zeros and lse -inf, and a finite one
    matches the same call without splits."""
    D, cap = 64, 640
    kc, vc = randn((3, cap, 1, D), torch.bfloat16, "cuda"), randn((3, cap, 1, D), torch.bfloat16, "cuda")
    kc[0, 517, 0, 3] = NAN
    q = randn((3, 1, 1, D), torch.bfloat16, "cuda")
    lens = torch.tensor([600, 0, 333], dtype=torch.int32, device="cuda")
    rope_ext._C.set_decode_cluster_merge(False)
    rope_ext._C.set_decode_combine_loads(loads)
    try:
        o, lse = rope_ext.attention_decode(q, kc, vc, lens, return_lse=True, num_splits=num_splits, impl="hybrid")
        assert rope_ext._C.last_decode_plan() == (num_splits, False)
        assert rope_ext._C.last_decode_combine() == combine_shape(num_splits, loads)
    finally:
        rope_ext._C.set_decode_cluster_merge(True)
        rope_ext._C.set_decode_combine_loads(0)
    for bad in (1, 32, -4):
        with pytest.raises(ValueError, match="loads"):
            rope_ext._C.set_decode_combine_loads(bad)
    o1, l1 = rope_ext.attention_decode(q, kc, vc, lens, return_lse=True, num_splits=1, impl="hybrid")
    assert torch.isnan(o[0].float()).all() and torch.isnan(lse[0]).all(), o[0].flatten()[:4].tolist()
    assert torch.equal(o[1], torch.zeros_like(o[1])) and torch.isneginf(lse[1]).all()
    # Row 2 against the float64 truth, and split against unsplit: the P.V MMAs take P rounded
    # to bf16 (up to 2^-8 relative), after a different running max in each split, so the
    # two differ by up to 2^-7 * max|v| before their own output roundings (one ulp). (An
    # absolute 2e-2 failed once on an H100: scale 2 puts |o| at 4-8, one ulp 0.031.)
    qr = ref.rope_float64(q[2:], (lens[2:, None] - 1).long())
    wo, wl = ref.attention_float64(qr, kc[2:], vc[2:], lens[2:])
    assert_attn_close(o[2:], lse[2:], wo, wl, 8.0, f"{num_splits} splits")
    a, b = o[2].double().cpu(), o1[2].double().cpu()
    vmax = vc[2, :333].double().abs().max().item()
    bound = 2.0**-7 * vmax + ulp(torch.maximum(a.abs(), b.abs()), torch.bfloat16)
    assert ((a - b).abs() <= bound).all(), ((a - b).abs().max().item(), vmax)
    assert (lse[2] - l1[2]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("where", ["q", "all_keys", "one_key"])
def test_decode_nan_propagates(device, where):
    """A NaN score gives NaN (output and lse), as softmax and SDPA do: an all-NaN row was
    taken for a row without keys (zeros, lse = -inf) on the CPU."""
    D, n = 64, 40
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    kc, vc = randn((1, 48, 1, D), dt, device), randn((1, 48, 1, D), dt, device)
    q = randn((1, 1, 1, D), dt, device)
    if where == "q":
        q.fill_(NAN)
    elif where == "all_keys":
        kc[:, :n] = NAN
    else:
        kc[0, 7, 0, 3] = NAN
    lens = torch.tensor([n], dtype=torch.int32, device=device)
    o, lse = rope_ext.attention_decode(q, kc, vc, lens, return_lse=True)
    assert torch.isnan(o.float()).all(), f"{where}: {o.flatten()[:4].tolist()}"
    assert torch.isnan(lse).all(), f"{where}: lse {lse.flatten().tolist()}"


def test_rope_attention_grad_takes_the_separate_path(device):
    B, S, Hq, Hk, D = 1, 6, 4, 2, 32
    q, k, v = (randn((B, S, h, D), torch.float32, device).requires_grad_() for h in (Hq, Hk, Hk))
    out = rope_ext.rope_attention(q, k, v)
    g = randn(out.shape, torch.float32, device)
    out.backward(g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    pos = torch.arange(S, device=device)[None]
    wo, _ = ref.rope_attention_float64(q64, k64, v64, pos, pos)
    wo.backward(g.double())
    for a, b in ((q, q64), (k, k64), (v, v64)):
        assert (a.grad.double() - b.grad).abs().max().item() < 1e-4
    with pytest.raises(RuntimeError, match="not differentiable"):
        rope_ext.rope_attention(q, k, v, impl="fused")


# ---------------------------------------------------------------------------- bad input
def bad_cases(dev):
    """(what, call, exception, pattern, check_values): each call must raise before
    writing anything. check_values: a value check (CUDA: needs set_value_checks)."""
    dt = torch.bfloat16
    B, Hk, D = 2, 2, 64
    kc, vc, _ = new_cache(B, 16, Hk, D, dt, dev, paged=False)
    pk, pv, bt = new_cache(B, 16, Hk, D, dt, dev, paged=True, block_size=8)
    k, v = randn((B, 3, Hk, D), dt, dev), randn((B, 3, Hk, D), dt, dev)
    q = randn((B, 1, 4, D), dt, dev)
    sl = torch.tensor([2, 5], dtype=torch.int32, device=dev)
    bad_bt = bt.clone()
    bad_bt[1, 0] = pk.shape[0]  # one past the last block
    i32 = dict(dtype=torch.int32, device=dev)
    return [
        ("cache too small", lambda: rope_ext.append_kv(k, v, kc, vc, torch.tensor([2, 14], **i32)), ValueError,
         "cache is too small", True),
        ("append block table out of range", lambda: rope_ext.append_kv(k, v, pk, pv, sl, block_table=bad_bt), ValueError,
         "block_table entries", True),
        ("append negative seqlens", lambda: rope_ext.append_kv(k, v, kc, vc, torch.tensor([-1, 0], **i32)), ValueError,
         "cache_seqlens must be >= 0", True),
        ("decode seqlens past capacity", lambda: rope_ext.attention_decode(q, kc, vc, torch.tensor([2, 17], **i32)),
         ValueError, "seqlens past capacity", True),
        ("decode block table out of range", lambda: rope_ext.attention_decode(q, pk, pv, sl, block_table=bad_bt),
         ValueError, "block_table entries", True),
        ("cu_seqlens end", lambda: rope_ext.append_kv(k[0], v[0], kc, vc, sl, cu_seqlens=torch.tensor([0, 1, 2], **i32)),
         ValueError, "cu_seqlens must end", True),
        ("k heads vs cache", lambda: rope_ext.append_kv(k[:, :, :1], v[:, :, :1], kc, vc, sl), ValueError,
         "heads but k_cache has", False),
        ("Hq not a multiple of Hk", lambda: rope_ext.attention_decode(randn((B, 1, 3, D), dt, dev), kc, vc, sl),
         ValueError, "multiple of the cache's kv heads", False),
        ("k head dim", lambda: rope_ext.append_kv(k[..., :32], v[..., :32], kc, vc, sl), ValueError,
         "head dim of k", False),
        ("q head dim", lambda: rope_ext.attention_decode(q[..., :32], kc, vc, sl), ValueError, "head dim of q", False),
        ("q dtype vs cache", lambda: rope_ext.attention_decode(q.half(), kc, vc, sl), TypeError,
         "k_cache must have the dtype of q", False),
        ("k dtype vs cache", lambda: rope_ext.append_kv(k.half(), v.half(), kc, vc, sl), TypeError,
         "k_cache must have the dtype of k", False),
        ("cache last dim strided", lambda: rope_ext.attention_decode(
            q, kc.transpose(-1, -2).contiguous().transpose(-1, -2), vc, sl), ValueError, "contiguous last", False),
        ("append cache last dim strided", lambda: rope_ext.append_kv(
            k, v, kc, vc.transpose(-1, -2).contiguous().transpose(-1, -2), sl), ValueError, "contiguous last", False),
        ("v_cache shape", lambda: rope_ext.append_kv(k, v, kc, vc[:, :8], sl), ValueError, "v_cache must have the shape",
         False),
        ("q aliases k", lambda: rope_ext.append_kv(k, v, kc, vc, sl, q=k), ValueError, "must not share memory with k",
         False),
        ("same cache twice", lambda: rope_ext.append_kv(k, v, kc, kc, sl), ValueError, "must not share memory", False),
        ("seqlens shape", lambda: rope_ext.attention_decode(q, kc, vc, sl[:1]), ValueError, "cache_seqlens must have shape",
         False),
        ("seqlens float", lambda: rope_ext.attention_decode(q, kc, vc, sl.float()), TypeError, "cache_seqlens must be an int",
         False),
        ("contiguous cache batch", lambda: rope_ext.attention_decode(q, kc[:1], vc[:1], sl), ValueError,
         "k_cache must hold B", False),
        ("block_table shape", lambda: rope_ext.attention_decode(q, pk, pv, sl, block_table=bt[:1]), ValueError,
         "block_table must have shape", False),
        ("positions shape", lambda: rope_ext.attention_decode(q, kc, vc, sl, positions=torch.zeros(B, 2, **i32)),
         ValueError, "positions must have shape", False),
        ("positions and offsets", lambda: rope_ext.append_kv(k, v, kc, vc, sl, positions=torch.zeros(3, **i32),
                                                             offsets=3), ValueError, "not both", False),
        ("unknown impl", lambda: rope_ext.attention_decode(q, kc, vc, sl, impl="fast"), ValueError, "impl must be", False),
        ("full fusion with positions", lambda: rope_ext.attention_decode(q, kc, vc, sl, impl="full_fusion",
                                                                         positions=torch.zeros(B, 1, **i32)),
         ValueError, "full_fusion", False),
        ("rotary_dim odd", lambda: rope_ext.append_kv(k, v, kc, vc, sl, rotary_dim=7), ValueError, "rotary_dim", False),
        ("not a tensor", lambda: rope_ext.append_kv(k, v, kc, vc, [2, 5]), TypeError, "cache_seqlens must be a torch.Tensor",
         False),
        ("step k without v", lambda: rope_ext.attention_decode(q, kc, vc, sl, k=k[:, :1]), ValueError,
         "k and v together", False),
        ("step k tokens vs q", lambda: rope_ext.attention_decode(q, kc, vc, sl, k=k, v=v), ValueError,
         "one new token per query token", False),
        ("step k dtype", lambda: rope_ext.attention_decode(q, kc, vc, sl, k=k[:, :1].half(), v=v[:, :1].half()),
         TypeError, "k must have the dtype of q", False),
        ("step cache too small", lambda: rope_ext.attention_decode(q, kc, vc, torch.tensor([2, 16], **i32), k=k[:, :1],
                                                                   v=v[:, :1]), ValueError, "cache is too small", True),
        ("step bad num_splits", lambda: rope_ext.attention_decode(q, kc, vc, sl, k=k[:, :1], v=v[:, :1], num_splits=-1),
         ValueError, "num_splits must be", False),
    ], (kc, vc, pk, pv, k, v, q)


BAD_NAMES = [c[0] for c in bad_cases("cpu")[0]]


@pytest.mark.parametrize("what", BAD_NAMES)
def test_bad_input_raises_clearly(device, what):
    cases, tensors = bad_cases(device)
    _, call, exc, pat, value_check = next(c for c in cases if c[0] == what)
    before = [t.clone() for t in tensors]
    if device == "cuda" and value_check:
        rope_ext.set_value_checks(True)
    try:
        with pytest.raises(exc, match=pat):
            call()
    finally:
        rope_ext.set_value_checks(False)
    for t, b in zip(tensors, before):
        assert torch.equal(t.nan_to_num(), b.nan_to_num()) and torch.equal(t.isnan(), b.isnan()), "nothing written"
    if device == "cuda":
        torch.cuda.synchronize()  # the context is still healthy


@cuda
def test_decode_rows_per_kv_head_limit_cuda():
    """Variant 5 maps a query row to its token through a float reciprocal of the group
    size, exact below 2^22 rows per kv head: more raise a ValueError naming the limit
    (impl hybrid and auto), before anything runs."""
    D = 64
    q = torch.empty(1, 1 << 22, 1, D, dtype=torch.bfloat16, device="cuda")  # 512 MB, never read
    kc, vc, _ = new_cache(1, 16, 1, D, torch.bfloat16, "cuda", paged=False)
    sl = torch.tensor([16], dtype=torch.int32, device="cuda")
    for impl in ("hybrid", "auto"):
        with pytest.raises(ValueError, match=r"q_len \* \(Hq / Hk\) below 2\^22"):
            rope_ext.attention_decode(q, kc, vc, sl, impl=impl)
    del q
    torch.cuda.synchronize()


@cuda
def test_cuda_kernel_drops_slots_out_of_range():
    """Without value checks (CUDA default) a token whose slot does not exist (past the
    capacity, or a block id out of range) is dropped: nothing outside the cache changes,
    the other tokens are written."""
    dt = torch.bfloat16
    B, Hk, D, cap = 2, 2, 64, 16
    guard = torch.full((B + 2, cap, Hk, D), NAN, dtype=dt, device="cuda")
    kc, vc_buf = guard[1:B + 1], torch.full((B + 2, cap, Hk, D), NAN, dtype=dt, device="cuda")
    vc = vc_buf[1:B + 1]
    k, v = randn((B, 4, Hk, D), dt, "cuda"), randn((B, 4, Hk, D), dt, "cuda")
    rope_ext.append_kv(k, v, kc, vc, torch.tensor([2, 14], dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert torch.isnan(guard[0]).all() and torch.isnan(guard[B + 1]).all()
    assert torch.isnan(vc_buf[0]).all() and torch.isnan(vc_buf[B + 1]).all()
    assert torch.isfinite(kc[0, 2:6]).all() and torch.isfinite(kc[1, 14:16]).all()
    # Paged: block ids one past the last block are dropped, on write and on read. The
    # cache sits inside a NaN guard buffer, so a write through a bad id would show.
    nb, bs = 2 * B, 8
    big_k = torch.full((nb + 2, bs, Hk, D), NAN, dtype=dt, device="cuda")
    big_v = torch.full_like(big_k, NAN)
    pk, pv = big_k[1:nb + 1], big_v[1:nb + 1]
    pk.zero_()
    pv.zero_()
    bt = torch.arange(nb, dtype=torch.int32, device="cuda").view(B, 2)
    bt[1, 1] = nb  # out of range: sequence 1's tokens at indices 8.. are dropped
    rope_ext.append_kv(k, v, pk, pv, torch.tensor([0, 6], dtype=torch.int32, device="cuda"), block_table=bt)
    o = rope_ext.attention_decode(randn((B, 1, 4, D), dt, "cuda"), pk, pv,
                                  torch.tensor([4, 10], dtype=torch.int32, device="cuda"), block_table=bt)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all(), "keys in a bad block are skipped, not read"
    assert torch.isnan(big_k[0]).all() and torch.isnan(big_k[nb + 1]).all()
    assert torch.isnan(big_v[0]).all() and torch.isnan(big_v[nb + 1]).all()
    assert (pk[2, 6:8] != 0).any() and (pk[0, :4] != 0).any(), "the valid tokens are written"


# ---------------------------------------------------------------------------- op layer
def op_samples(device):
    dt = torch.bfloat16
    B, Hk, D = 2, 2, 64
    kc, vc, _ = new_cache(B, 24, Hk, D, dt, device, paged=False)
    kc.normal_()
    vc.normal_()
    pk, pv, bt = new_cache(B, 24, Hk, D, dt, device, paged=True, block_size=8)
    pk.normal_()
    pv.normal_()
    k, v, q = randn((B, 3, Hk, D), dt, device), randn((B, 3, Hk, D), dt, device), randn((B, 3, 4, D), dt, device)
    sl = torch.tensor([2, 9], dtype=torch.int32, device=device)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32, device=device)
    pos = torch.randint(0, 100, (B, 3), device=device)
    f = rope_ext.inv_freq(D, 500.0, device=device)
    # fp8 caches (per kv head / per tensor scales) and MLA's latent + rope halves of one cache row.
    fk, fv = (torch.randn(B, 24, Hk, D, device=device).to(torch.float8_e4m3fn) for _ in range(2))
    ks, vs = torch.rand(Hk, device=device) + 0.5, torch.rand(1, device=device) + 0.5
    L, R = 96, 32
    latent = torch.randn(6, 8, L + R, device=device, dtype=dt)
    lbt = torch.tensor([[0, 2, 4], [5, 1, 3]], dtype=torch.int32, device=device)
    kv_c, k_pe, q_pe = randn((3, 1, L), dt, device), randn((3, 1, R), dt, device), randn((3, 4, R), dt, device)
    mla = (latent[..., L:].unsqueeze(-2), latent[..., :L].unsqueeze(-2))
    A, D_, S = "append_kv", "attention_decode", "attention_decode_append"
    return [
        (A, (k, v, kc, vc, sl), {}),
        (A, (k, v, pk, pv, sl), dict(positions=pos, block_table=bt, q=q.clone(), inv_freq=f, interleaved=True)),
        (A, (k[0], v[0], kc, vc, sl), dict(cu_seqlens=cu, offset=5, rotary_dim=32, rotate_k=False)),
        (A, (k, v, fk, fv, sl), dict(q=q.clone(), k_scale=ks, v_scale=vs, attention_factor=1.2)),
        (A, (k_pe, kv_c, *mla, sl), dict(cu_seqlens=cu, block_table=lbt, q=q_pe, interleaved=True)),
        (D_, (q, kc, vc, sl + 3), {}),
        (D_, (q, pk, pv, sl + 3), dict(positions=pos, block_table=bt, inv_freq=f, interleaved=True, softmax_scale=0.3,
                                       max_seqlen=12, impl="hybrid")),
        (D_, (q[:, :1], kc, vc, sl), dict(offsets=torch.tensor([1, 7], device=device), rotary_dim=32, causal=False,
                                          impl="full_fusion")),
        (D_, (q, fk, fv, sl + 3), dict(k_scale=ks, v_scale=vs, attention_factor=1.1)),
        (S, (q, k, v, kc, vc, sl), {}),
        (S, (q, k, v, pk, pv, sl), dict(positions=pos, block_table=bt, inv_freq=f, interleaved=True, softmax_scale=0.3,
                                        max_seqlen=12, num_splits=3, impl="hybrid")),
        (S, (q, k, v, fk, fv, sl), dict(k_scale=ks, v_scale=vs, attention_factor=1.1)),
    ]


# The attention ops' options at the API's defaults (every argument after an op's tensors).
ATTN_DEFAULTS = dict(cu_seqlens=None, q=None, positions=None, block_table=None, offsets=None, offset=0, inv_freq=None,
                     cos_sin_cache=None, base=10000.0, rotary_dim=-1, interleaved=False, rotate_k=True,
                     softmax_scale=None, causal=True, max_seqlen=0, num_splits=0, impl="auto", k_scale=None,
                     v_scale=None, attention_factor=1.0)


def op_args(name, tensors, kw):
    """(args, kwargs) of an attention op: its tensors, then every option by name (the given
    ones, the rest at ATTN_DEFAULTS); the schemas' order is csrc/attention_options.h's."""
    names = [a.name for a in getattr(OPS, name).default._schema.arguments][len(tensors):]
    unknown = set(kw) - set(names)
    assert not unknown, f"{name} has no options {unknown}"
    return tensors, {n: kw.get(n, ATTN_DEFAULTS[n]) for n in names}


@pytest.mark.parametrize("i", range(12))
def test_opcheck(device, i):
    name, tensors, kw = op_samples(device)[i]
    args, kwargs = op_args(name, tensors, kw)
    # test_schema runs the op under torch's SchemaCheckMode, which multiplies the inputs
    # and has no float8 kernels ("mul_cpu_reduced_float" not implemented for
    # Float8_e4m3fn): the fp8 samples take the other checks.
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    utils = utils if fp8 else ("test_schema",) + utils
    torch.library.opcheck(getattr(OPS, name).default, args, kwargs, test_utils=utils)


def test_compile_fullgraph(device):
    """append_kv + attention_decode in one compiled graph, no graph break, equal to eager."""
    dt = torch.bfloat16
    B, Hk, D = 2, 2, 64
    k, v, q = randn((B, 2, Hk, D), dt, device), randn((B, 2, Hk, D), dt, device), randn((B, 2, 8, D), dt, device)
    sl = torch.tensor([3, 10], dtype=torch.int32, device=device)

    def step(q, k, v, kc, vc, sl, bt):
        rope_ext.append_kv(k, v, kc, vc, sl, block_table=bt)
        o, lse = rope_ext.attention_decode(q, kc, vc, sl + k.shape[1], block_table=bt, return_lse=True)
        return o * 1, lse

    def one_call(q, k, v, kc, vc, sl, bt):
        o, lse = rope_ext.attention_decode(q, kc, vc, sl, block_table=bt, return_lse=True, k=k, v=v)
        return o * 1, lse

    for paged in (False, True):
        kc, vc, bt = new_cache(B, 24, Hk, D, dt, device, paged=paged, block_size=8)
        kc.zero_()
        vc.zero_()
        kc2, vc2 = kc.clone(), vc.clone()
        want = step(q, k, v, kc, vc, sl, bt)
        for backend in ("aot_eager", "inductor"):
            torch._dynamo.reset()
            kc3, vc3 = kc2.clone(), vc2.clone()
            got = torch.compile(step, fullgraph=True, backend=backend)(q, k, v, kc3, vc3, sl, bt)
            for a, b in zip(want, got):
                assert torch.equal(a, b), backend
            assert torch.equal(kc3, kc) and torch.equal(vc3, vc), f"{backend}: cache writes kept"
            # The one-call step: the same cache writes; its output within the tolerance of
            # the two-launch one (the new keys are summed in another order on CUDA).
            torch._dynamo.reset()
            kc4, vc4 = kc2.clone(), vc2.clone()
            got = torch.compile(one_call, fullgraph=True, backend=backend)(q, k, v, kc4, vc4, sl, bt)
            assert torch.equal(kc4, kc) and torch.equal(vc4, vc), f"{backend}: one-call cache writes kept"
            assert (got[0].float() - want[0].float()).abs().max().item() <= ATTN_TOL[dt] * v.abs().max().item()
    # rope_attention's fused path (and the separate one) trace without a graph break too.
    kk, vv = randn((B, 2, Hk, D), dt, device), randn((B, 2, Hk, D), dt, device)
    pos = torch.randint(0, 99, (B, 2), device=device)
    for impl in ("fused", "separate"):
        for p in (None, pos):
            torch._dynamo.reset()
            f = torch.compile(lambda a, b, c, p: rope_ext.rope_attention(a, b, c, p, impl=impl), fullgraph=True,
                              backend="aot_eager")
            assert torch.equal(f(q, kk, vv, p), rope_ext.rope_attention(q, kk, vv, p, impl=impl)), (impl, p is None)


@cuda
def test_cuda_graph_capture():
    """append_kv + attention_decode captured once (no host sync inside), replayed with new
    cache lengths and inputs written into the captured buffers."""
    dt = torch.bfloat16
    B, Hk, G, D, cap = 4, 2, 4, 128, 512
    kc, vc, bt = new_cache(B, cap, Hk, D, dt, "cuda", paged=True, block_size=16)
    kc.zero_()
    vc.zero_()
    k, v, q = randn((B, 1, Hk, D), dt, "cuda"), randn((B, 1, Hk, D), dt, "cuda"), randn((B, 1, Hk * G, D), dt, "cuda")
    sl = torch.tensor([0, 5, 100, 400], dtype=torch.int32, device="cuda")
    sl_after = sl + 1

    def step():
        rope_ext.append_kv(k, v, kc, vc, sl, block_table=bt)
        return rope_ext.attention_decode(q, kc, vc, sl_after, block_table=bt, return_lse=True)

    kc1, vc1 = kc.clone(), vc.clone()

    def one_call():  # the decode step in one launch, into its own copy of the cache
        return rope_ext.attention_decode(q, kc1, vc1, sl, block_table=bt, return_lse=True, k=k, v=v)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
            one_call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, lse = step()
        o1, lse1 = one_call()
    for lens in ([7, 0, 300, 511], [1, 2, 3, 4]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        sl_after.copy_(sl + 1)
        for t in (k, v, q):
            t.copy_(randn(t.shape, dt, "cuda"))
        g.replay()
        torch.cuda.synchronize()
        kc2, vc2 = kc.clone(), vc.clone()
        rope_ext.append_kv(k, v, kc2, vc2, sl, block_table=bt)
        want_o, want_lse = rope_ext.attention_decode(q, kc2, vc2, sl_after, block_table=bt, return_lse=True)
        assert torch.equal(kc, kc2) and torch.equal(o, want_o) and torch.equal(lse, want_lse), lens
        assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2), f"one call: cache writes {lens}"
        assert_attn_close(o1, lse1, want_o.double(), want_lse.double(), v.abs().max().item(), f"one call {lens}")


def test_reference_matches_sdpa():
    """The float64 reference itself, against torch's SDPA (full causal square case)."""
    B, S, Hq, Hk, D = 2, 9, 6, 2, 16
    q, k, v = torch.randn(B, S, Hq, D), torch.randn(B, S, Hk, D), torch.randn(B, S, Hk, D)
    o, _ = ref.attention_float64(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(1, 2), k.double().transpose(1, 2), v.double().transpose(1, 2), is_causal=True,
        enable_gqa=True).transpose(1, 2)
    assert (o - want).abs().max().item() < 1e-12


def test_exports():
    assert set(("append_kv", "attention_decode", "rope_attention")) <= set(rope_ext.__all__)


# ---------------------------------------------------------------------------- decode kernels on CUDA
@cuda
@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
@pytest.mark.parametrize("impl", ["hybrid", "hybrid_simt"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("G,q_len,Hk", [(1, 1, 4), (4, 1, 2), (8, 1, 1), (4, 3, 2), (8, 2, 1), (1, 16, 2), (4, 16, 1),
                                        (8, 16, 1)])
def test_decode_kernel_matrix_cuda(impl, D, G, q_len, Hk, step):
    """Each CUDA decode kernel against the float64 truth: head dims 64/128/256, GQA
    groups 1/4/8 (Hk 1 too), q_len 1..16 (variant 5: up to 8 rows, 9..16 rows, several
    16-row groups), contiguous and paged caches with block sizes 1, 16 and 64, random
    lengths (not multiples of the 16-key tile) in fp16 and bf16."""
    for paged, bs in ((False, 16), (True, 1), (True, 16), (True, 64)):
        dtype = torch.float16 if bs == 16 else torch.bfloat16
        o, lse, wo, wl, vs = fill_and_decode("cuda", dtype, paged=paged, G=G, q_len=q_len, Hk=Hk, D=D, cap=150,
                                             block_size=bs, impl=impl, step=step)
        assert_attn_close(o, lse, wo, wl, vs, f"{impl} D={D} G={G} q_len={q_len} paged={paged} block={bs}")


@cuda
@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
@pytest.mark.parametrize("D,G,q_len,cfg", [(128, 4, 1, "default"), (64, 1, 5, "interleaved"), (128, 8, 2, "partial"),
                                           (256, 3, 3, "partial_interleaved"), (128, 16, 1, "cos_sin_cache"),
                                           (128, 3, 7, "default"), (64, 6, 5, "interleaved")])
def test_decode_q_layouts_cuda(D, G, q_len, cfg, step):
    """Variant 5 copies q's rows into shared memory 16 bytes at a time where they allow it
    (features contiguous, rows 16-byte aligned) and loads q element by element otherwise:
    every layout of q_view gives the contiguous q's output and lse bit for bit (the same
    values reach the rotation and the MMAs), and that is the float64 truth's. Several
    tokens per query (rows of a kv head spanning tokens), group sizes 1..16, and row
    groups of 16 rows that start inside a token (G 3 x q_len 7, G 6 x q_len 5: the second
    group's first row is head 1 of token 5, head 4 of token 2)."""
    got = {}
    for layout in ("contiguous", "strided", "misaligned", "fused", "fused_odd"):
        torch.manual_seed(1234)
        o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=True, G=G, q_len=q_len, Hk=2, D=D, cap=150,
                                             cfg=cfg, impl="hybrid", step=step, q_layout=layout)
        assert_attn_close(o, lse, wo, wl, vs, f"q {layout} D={D} G={G} q_len={q_len} {cfg}")
        got[layout] = (o, lse)
    for layout, (o, lse) in got.items():
        assert torch.equal(o, got["contiguous"][0]) and torch.equal(lse, got["contiguous"][1]), f"q {layout}"


@cuda
@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
@pytest.mark.parametrize("num_splits", [1, 3, 5, 19, 40, 100, 1024])
def test_tensor_core_splits_cuda(num_splits, step):
    """Variant 5 with forced split counts: splits round up to whole 16-key tiles, so high
    counts leave splits with no key at all (lse -inf partials) that the combine ignores;
    lengths 1 and a few keys sit inside one tile. The combine kernel's shape follows the
    count (3: 4 loads, one warp per row; 5: 8 loads; 19: 8 loads x 4 warps, 40: x 8; 100: 16
    x 8; 1024: 16 x 8 in 8 rounds of loads); D 256 has two feature groups per lane."""
    for D in (128, 256) if num_splits >= 40 else (128,):
        for B, cap in ((3, 300), (4, 17)):
            o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=True, G=4, q_len=1, B=B, cap=cap, D=D,
                                                 num_splits=num_splits, impl="hybrid", step=step)
            assert_attn_close(o, lse, wo, wl, vs, f"num_splits={num_splits} cap={cap} D={D}")


@cuda
@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
@pytest.mark.parametrize("paged,block_size", [(False, 16), (True, 16), (True, 4)], ids=["contiguous", "paged16", "paged4"])
def test_split_chunk_cuda(chunk, paged, block_size):
    """Variant 5's splits taking chunks of 2^(chunk-1) tiles round-robin
    (rope_ext._C.set_decode_split_chunk; the rule takes 4 tiles, chunk 3) against one key
    range each (0), on the same data: each against the float64 truth, and their lse within
    1e-4 of each other (a tile skipped or read twice moves it by ~1e-2). Split counts with
    empty splits, one chunk per split, partial and several rounds (cap 1300 at 2 splits:
    chunks of 16 tiles wrap); several tokens per query (causal limits inside a chunk), the
    one-call step (its new tile stays the last split's), both merges. Bad knob values raise."""
    for ns, q_len, step, cap in ((2, 1, "two", 1300), (3, 4, "one", 300), (7, 2, "two", 517), (31, 1, "two", 1000),
                                 (64, 3, "one", 300)):
        got = {}
        for k in (0, chunk):
            rope_ext._C.set_decode_split_chunk(k)
            try:
                torch.manual_seed(ns * 10 + chunk)
                o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=paged, block_size=block_size, G=4,
                                                     q_len=q_len, B=3, cap=cap, D=128, num_splits=ns, impl="hybrid",
                                                     step=step)
                assert rope_ext._C.last_decode_plan()[0] == ns
                assert rope_ext._C.last_decode_split_chunk() == k
            finally:
                rope_ext._C.set_decode_split_chunk(-1)
            what = f"chunk={k} num_splits={ns} q_len={q_len} {step}"
            assert_attn_close(o, lse, wo, wl, vs, what)
            got[k] = (o, lse)
        (o0, l0), (o1, l1) = got[0], got[chunk]
        fin = torch.isfinite(l0)
        assert torch.equal(torch.isfinite(l1), fin), what
        assert (l1[fin] - l0[fin]).abs().max().item() <= 1e-4, what
        assert (o1.double() - o0.double()).abs().max().item() <= 2 * ATTN_TOL[torch.bfloat16] * vs, what
    # The rule's default: 4-tile chunks wherever there are splits, one range without.
    fill_and_decode("cuda", torch.bfloat16, paged=paged, block_size=block_size, G=4, q_len=1, B=3, cap=300, D=128,
                    num_splits=5, impl="hybrid")
    assert rope_ext._C.last_decode_split_chunk() == 3
    fill_and_decode("cuda", torch.bfloat16, paged=paged, block_size=block_size, G=4, q_len=1, B=3, cap=300, D=128,
                    num_splits=1, impl="hybrid")
    assert rope_ext._C.last_decode_split_chunk() == 0
    for bad in (-2, 13):
        with pytest.raises(ValueError, match="set_decode_split_chunk"):
            rope_ext._C.set_decode_split_chunk(bad)


@cuda
@pytest.mark.parametrize("loads", [0, 4, 8, 16])
@pytest.mark.parametrize("D", [128, 256])
def test_combine_loads_cuda(D, loads):
    """The combine kernel's instances (4, 8, 16 splits loaded per warp at once; one and two
    feature groups per lane) at split counts below, at and past one warp's loads (warps
    per row 1-8, rounds past 8 warps), against the float64 truth; the shape taken is the
    host rule's."""
    rope_ext._C.set_decode_cluster_merge(False)
    rope_ext._C.set_decode_combine_loads(loads)
    try:
        for ns in (2, 3, 4, 5, 8, 9, 16, 17, 31, 32, 33, 64, 129):
            torch.manual_seed(ns)
            o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=False, G=4, q_len=1, B=3, cap=300, D=D,
                                                 num_splits=ns, impl="hybrid")
            assert rope_ext._C.last_decode_plan() == (ns, False)
            assert rope_ext._C.last_decode_combine() == combine_shape(ns, loads), ns
            assert_attn_close(o, lse, wo, wl, vs, f"num_splits={ns} loads={loads} D={D}")
    finally:
        rope_ext._C.set_decode_cluster_merge(True)
        rope_ext._C.set_decode_combine_loads(0)


@cuda
@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
@pytest.mark.parametrize("D,G,q_len", [(128, 4, 1), (64, 8, 1), (256, 1, 3), (128, 4, 16)])
def test_cluster_merge_and_combine_kernel_cuda(D, G, q_len, step):
    """Variant 5's two split merges: in the thread-block cluster (2..16 splits, sm_90) and
    by the combine kernel (rope_ext._C.set_decode_cluster_merge(False); always past 16
    splits). Both against the float64 truth, and against each other (they differ only in
    the order of the merge's fp32 sums); 4 row groups per kv head at q_len 16, G 4.
    (fp8 caches: test_fp8_mla.test_fp8_decode_cluster_merge.)"""
    # B * Hk * row groups * splits <= the SM count, so the cluster merge is taken (<= 16 splits).
    kw = dict(paged=True, G=G, q_len=q_len, B=1 if q_len == 16 else 3, cap=300, D=D, impl="hybrid", step=step)
    for ns in (2, 5, 8, 13, 16, 17):
        got = []
        for cluster in (True, False):
            torch.manual_seed(ns)
            rope_ext._C.set_decode_cluster_merge(cluster)
            try:
                o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, num_splits=ns, **kw)
                plan = rope_ext._C.last_decode_plan()
            finally:
                rope_ext._C.set_decode_cluster_merge(True)
            assert plan == (ns, cluster and ns <= 16), (ns, cluster, plan)
            assert_attn_close(o, lse, wo, wl, vs, f"num_splits={ns} cluster={cluster}")
            got.append((o.float(), lse))
        (o1, l1), (o2, l2) = got
        assert (o1 - o2).abs().max().item() <= 2 * ATTN_TOL[torch.bfloat16] * vs, f"num_splits={ns}: merges differ"
        fin = torch.isfinite(l2)
        assert torch.equal(torch.isfinite(l1), fin) and (l1[fin] - l2[fin]).abs().max().item() <= 1e-4, ns


@cuda
@pytest.mark.parametrize("step", ["two", "one"], ids=["append+decode", "one_call"])
def test_decode_plan_rules_cuda(step):
    """Variant 5's automatic split plan (decode_plan) beyond Hq 32 / Hk 8 / D 128: D 256
    (16-bit cache) at B = 1 through the combine kernel (its clusters of 16 did not all fit
    and ran in two waves; smaller ones were no faster than the combine kernel); few kv
    heads at long contexts (Hk 2, ctx 8192; Hk 1) split 32 / 64 ways through the combine kernel;
    a plan that takes a cluster (Hk 8, ctx 2048 and 4096: 8 splits) has all its clusters resident at
    once; Hk 8 at ctx 8192 keeps the short rule's 8 splits (~64 CTAs) through the combine kernel
    (1024 keys a split: past the cluster's 512), and B = 2 at ctx 8192 and 16384 takes 8 too
    (kLongerSplits: 128 CTAs); B = 16 (a grid of >= 90% of the SMs) takes one split at D 64
    and 128 at any length (ctx 4096; 8208 keys, where the fourteenth session's rule split);
    B = 5, 10 and 20 at ctx 4096 take the wave rule's 2, 1 and 3 (on 132 SMs); at D 64 (90% of
    the SMs, per-SM balance only) B = 8, 10 and 12 take 2, 3 and 4.
    Each result against the float64 truth."""
    dev = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for D, G, Hk, cap, B in ((256, 2, 8, 8192, 1), (128, 16, 2, 8192, 1), (128, 8, 1, 8192, 1), (128, 4, 8, 2048, 1),
                             (128, 4, 8, 4096, 1), (128, 4, 8, 8192, 1), (128, 4, 8, 4096, 2), (128, 4, 8, 8192, 2),
                             (128, 4, 8, 16384, 2)):
        o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=False, G=G, q_len=1, Hk=Hk, D=D, B=B,
                                             cap=cap, impl="hybrid", step=step)
        splits, cluster = rope_ext._C.last_decode_plan()
        what = f"D={D} G={G} Hk={Hk} B={B} ctx={cap}: plan ({splits}, {cluster})"
        if D == 256:  # the split count follows the SM count (the efficiency rule)
            assert splits > 1 and not cluster, what
        elif Hk == 2:  # (>= 64 SMs: 32 splits of 2 CTAs in one wave)
            assert (splits, cluster) == (32, False) or sms < 64, what
        elif Hk == 1:  # MQA: 64 splits (the SM count on a smaller GPU)
            assert (splits, cluster) == (min(64, sms), False) or sms < 32, what
        elif cap >= 8192:  # (>= 64 SMs per sequence; B = 2 too: at least kLongerSplits)
            assert (splits, cluster) == (8, False) or sms < 64 * B, what
        else:
            assert (splits, cluster) == (8, True) or sms < 64 * B, what
            if cluster:
                assert rope_ext._C.decode_max_clusters("bfloat16", D, False, G, splits, dev) >= B * Hk, what  # all resident
        assert_attn_close(o, lse, wo, wl, vs, what)
    # A grid of >= 90% of the SMs (B = 16 at Hk 8 on 132) takes one split, D 64 and 128
    for D in (128, 64):
        o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=False, G=4, q_len=1, Hk=8, D=D, B=16,
                                             cap=4096, impl="hybrid", step=step)
        what = f"B=16 D={D} ctx=4096: plan {rope_ext._C.last_decode_plan()}"
        assert rope_ext._C.last_decode_plan() == (1, False) or not 128 <= sms <= 142, what
        assert_attn_close(o, lse, wo, wl, vs, what)
    # The wave rule (kWaveEff): B = 5 at ctx 4096 takes 2 splits (80 CTAs), B = 10 one (80),
    # B = 20 three (480: one split's 160 CTAs leave 28 SMs with two); D 64: B = 8 two (128),
    # B = 10 three (240: 2 splits' 160 leave 28 SMs with two), B = 12 four (384)
    for D, B, want in ((128, 5, 2), (128, 10, 1), (128, 20, 3), (64, 8, 2), (64, 10, 3), (64, 12, 4)):
        o, lse, wo, wl, vs = fill_and_decode("cuda", torch.bfloat16, paged=False, G=4, q_len=1, Hk=8, D=D, B=B,
                                             cap=4096, impl="hybrid", step=step)
        what = f"B={B} D={D} ctx=4096: plan {rope_ext._C.last_decode_plan()}"
        assert rope_ext._C.last_decode_plan() == (want, False) or sms != 132, what
        assert_attn_close(o, lse, wo, wl, vs, what)
    # ... at any length (8208 keys: past the fourteenth session's 8192), equal to 2 splits' result
    kc = torch.randn(16, 8208, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc, q = torch.randn_like(kc), torch.randn(16, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((16,), 8208, dtype=torch.int32, device="cuda")
    o = rope_ext.attention_decode(q, kc, vc, lens, impl="hybrid")
    what = f"B=16 ctx=8208: plan {rope_ext._C.last_decode_plan()}"
    assert rope_ext._C.last_decode_plan() == (1, False) or not 128 <= sms <= 142, what
    o2 = rope_ext.attention_decode(q, kc, vc, lens, impl="hybrid", num_splits=2)
    assert torch.isfinite(o).all() and (o.float() - o2.float()).abs().max().item() < 2e-2, what
    assert rope_ext._C.decode_max_clusters("bfloat16", 128, False, 4, 8, dev) > 0
    assert rope_ext._C.decode_max_clusters("float16", 64, True, 4, 17, dev) == 0  # past the cluster limit
    with pytest.raises(ValueError, match="D must be 64, 128 or 256"):
        rope_ext._C.decode_max_clusters("bfloat16", 96, False, 4, 8, dev)
    with pytest.raises(ValueError, match="dtype must be 'bfloat16' or 'float16'"):
        rope_ext._C.decode_max_clusters("float32", 128, False, 4, 8, dev)
    with pytest.raises(ValueError, match="no device"):
        rope_ext._C.decode_max_clusters("bfloat16", 128, False, 4, 8, torch.cuda.device_count())


@cuda
def test_tensor_core_short_and_empty_cuda():
    """Variant 5 with sequence lengths 0 and 1 in one batch (zeros and lse -inf for the
    empty one), against the float64 truth."""
    dt = torch.bfloat16
    B, Hk, G, D = 3, 2, 4, 128
    kc, vc, _ = new_cache(B, 64, Hk, D, dt, "cuda", paged=False)
    kc[:, :1] = randn((B, 1, Hk, D), dt, "cuda")
    vc[:, :1] = randn((B, 1, Hk, D), dt, "cuda")
    q = randn((B, 1, Hk * G, D), dt, "cuda")
    lens = torch.tensor([0, 1, 1], dtype=torch.int32, device="cuda")
    o, lse = rope_ext.attention_decode(q, kc, vc, lens, return_lse=True, impl="hybrid")
    assert (o[0] == 0).all() and (lse[0] == float("-inf")).all()
    qr = ref.rope_float64(q, (lens[:, None].long() - 1).clamp_min(0))
    wo, wl = ref.attention_float64(qr, kc.nan_to_num(), vc.nan_to_num(), lens)
    assert_attn_close(o, lse, wo, wl, 8.0, "lengths 0 and 1")
