"""Pure-PyTorch references, taking the same arguments as rope_ext.apply_rope.

rope_naive    recomputes inv_freq, cos and sin on every call (the HF-style eager
              formula: fp32 frequencies and fp32 angles, fp32 math, cast back).
rope_cached   gathers cos/sin rows from a precomputed fp32 table (the vLLM / HF
              cache style); the table is built once per (R, frequencies, device).
rope_float64  the ground truth: float64 everywhere, the angle pos * inv_freq exact
              from the float32 inverse frequencies checkpoints were trained with
              (HF's formula, rope_ext.inv_freq), which the kernels use too.

These are written independently of the kernels' index code (layouts, positions,
pairing are spelled out here again) so that a shared mistake cannot hide.
"""
import torch

from .frequencies import inv_freq as _canonical_inv_freq
from .context_parallel import context_parallel_positions

_TO_BSHD = {"bshd": (0, 1, 2, 3), "sbhd": (1, 0, 2, 3), "bhsd": (0, 2, 1, 3)}


def _as_bshd(x, layout):
    if layout == "thd":
        return x[None]
    if layout not in _TO_BSHD:
        raise ValueError(f"unknown layout {layout!r}")
    return x.permute(_TO_BSHD[layout])


def _from_bshd(y, layout):
    return y[0] if layout == "thd" else y.permute(_TO_BSHD[layout])  # the permutations are involutions


def positions_bs(B, S, positions=None, offsets=None, cu_seqlens=None, device=None, cp_size=1, cp_rank=0,
                 axes=False):
    """int64 [B, S] position of every token, by the rules of apply_rope; with axes=True
    positions have a leading axis dimension ([A, B, S] / [A, S]) and the result is [A, B, S]."""
    if positions is not None:
        p = positions.to(device=device, dtype=torch.int64)
        if axes:
            return p[:, None, :].expand(p.shape[0], B, S) if p.dim() == 2 else p.expand(p.shape[0], B, S)
        return p.expand(B, S)
    if cu_seqlens is not None:
        cu = cu_seqlens.to(device=device, dtype=torch.int64)
        idx = torch.arange(S, device=device, dtype=torch.int64)
        seq = torch.searchsorted(cu[1:] // cp_size, idx, right=True).clamp(max=cu.numel() - 2)
        if cp_size > 1:
            local = context_parallel_positions(cp_size, cp_rank, cu_seqlens=cu, device=device)
        else:
            local = idx - cu[seq]
        start = offsets.to(device=device, dtype=torch.int64)[seq] if isinstance(offsets, torch.Tensor) else (offsets or 0)
        return (local + start)[None]
    if cp_size > 1:
        idx = context_parallel_positions(cp_size, cp_rank, seq_len=S * cp_size, device=device)
    else:
        idx = torch.arange(S, device=device, dtype=torch.int64)
    if isinstance(offsets, torch.Tensor):
        return idx[None] + offsets.to(device=device, dtype=torch.int64)[:, None]
    return (idx + (offsets or 0))[None].expand(B, S)


def pair_axes(R, sections=None, sections_interleaved=False):
    """int64 [R/2]: the position axis that rotates each pair (M-RoPE / axial)."""
    half = R // 2
    if not sections:
        return torch.zeros(half, dtype=torch.int64)
    if sections_interleaved:  # Qwen3-VL: h at i % 3 == 1, w at i % 3 == 2, inside 3 * section
        ax = torch.zeros(half, dtype=torch.int64)
        for a in (1, 2):
            ax[a:3 * sections[a]:3] = a
        return ax
    return torch.repeat_interleave(torch.arange(len(sections)), torch.tensor(sections))


def _rotate(x, cos, sin, R, interleaved):
    """x [B, S, H, D] (compute dtype), cos/sin [B, S, R/2] -> rotated x."""
    xr, tail = x[..., :R], x[..., R:]
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
    else:
        x0, x1 = xr[..., : R // 2], xr[..., R // 2:]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    o0, o1 = x0 * c - x1 * s, x1 * c + x0 * s
    rot = torch.stack([o0, o1], dim=-1).flatten(-2) if interleaved else torch.cat([o0, o1], dim=-1)
    return torch.cat([rot, tail], dim=-1)


def _reference(x, positions, layout, offsets, base, cu_seqlens, rotary_dim, interleaved, inv_freq, cos_sin_cache,
               inplace, mode, inverse=False, attention_factor=1.0, cp_size=1, cp_rank=0, sections=None,
               sections_interleaved=False):
    x4 = _as_bshd(x, layout)
    B, S, H, D = x4.shape
    R = D if rotary_dim is None else rotary_dim
    pos = positions_bs(B, S, positions, offsets, cu_seqlens, x.device, cp_size, cp_rank, axes=bool(sections))
    if sections:  # [A, B, S] -> each pair's own axis: [B, S, R/2]
        ax = pair_axes(R, sections, sections_interleaved).to(x.device)
        pos_pair = pos.permute(1, 2, 0)[..., ax]
    else:
        pos_pair = pos[..., None].expand(B, S, R // 2)
    ct = torch.float64 if mode == "float64" else torch.float32
    if cos_sin_cache is not None:
        table = cos_sin_cache.to(ct)
        cols = torch.arange(R // 2, device=x.device)
        cos, sin = table[pos_pair, cols], table[pos_pair, cols + R // 2]
    elif mode == "float64":
        f = (inv_freq if inv_freq is not None else _canonical_inv_freq(R, float(base))).to(x.device, torch.float64)
        ang = pos_pair.to(torch.float64) * f  # exact: pos < 2^29, f has 24 bits
        cos, sin = ang.cos(), ang.sin()
    elif mode == "cached":
        table = cos_sin_table(R, base, int(pos.max()) + 1 if pos.numel() else 1, x.device, inv_freq)
        cols = torch.arange(R // 2, device=x.device)
        cos, sin = table[pos_pair, cols], table[pos_pair, cols + R // 2]
    else:  # naive: HF-style fp32 frequencies and angles, recomputed every call
        f = inv_freq if inv_freq is not None else _canonical_inv_freq(R, float(base))
        ang = pos_pair.float() * f.to(x.device, torch.float32)
        cos, sin = ang.cos(), ang.sin()
    cos, sin = cos * attention_factor, sin * attention_factor
    if inverse:
        sin = -sin
    out = _from_bshd(_rotate(x4.to(ct), cos, sin, R, interleaved), layout)
    if mode == "float64":
        return out
    out = out.to(x.dtype)
    if inplace:
        return x.copy_(out)
    return out


_TABLES = {}


def cos_sin_table(rotary_dim, base=10000.0, max_position=4096, device="cpu", inv_freq=None):
    """fp32 [max_position, R] table, cos in the first R/2 columns, sin in the rest (the
    vLLM / FlashInfer convention, also accepted by apply_rope as cos_sin_cache).
    Built from fp32 angles, as HF and vLLM do, with HF's float32 frequencies (computed
    on the CPU, as HF does at init). Returns a new tensor of exactly max_position rows,
    the caller's own (the table behind it is cached and grown as needed, never handed
    out: an in-place op of one caller cannot reach another's table)."""
    key = (rotary_dim, float(base), str(device), None if inv_freq is None else tuple(inv_freq.tolist()))
    t = _TABLES.get(key)
    if t is None or t.shape[0] < max_position:
        n = max(max_position, 1 if t is None else 2 * t.shape[0])
        f = inv_freq if inv_freq is not None else _canonical_inv_freq(rotary_dim, float(base))
        ang = torch.arange(n, device=device, dtype=torch.float32)[:, None] * f.to(device, torch.float32)
        t = torch.cat([ang.cos(), ang.sin()], dim=-1)
        _TABLES[key] = t
    return t[:max_position].clone()


def _make(mode, doc):
    def ref(x, positions=None, *, layout="bshd", offsets=None, base=10000.0, impl=None, cu_seqlens=None,
            rotary_dim=None, interleaved=False, inv_freq=None, cos_sin_cache=None, inplace=False, inverse=False,
            attention_factor=1.0, cp_size=1, cp_rank=0, sections=None, sections_interleaved=False):
        return _reference(x, positions, layout, offsets, base, cu_seqlens, rotary_dim, interleaved, inv_freq,
                          cos_sin_cache, inplace, mode, inverse, attention_factor, cp_size, cp_rank, sections,
                          sections_interleaved)

    ref.__name__ = ref.__qualname__ = f"rope_{mode}"
    ref.__doc__ = doc + "\n\nSame arguments as rope_ext.apply_rope (impl is ignored); inverse=True rotates by -theta."
    return ref


rope_naive = _make("naive", "Reference: cos/sin recomputed every call, fp32 math, returns x's dtype.")
rope_cached = _make("cached", "Reference: cos/sin gathered from a precomputed fp32 table, returns x's dtype.")
rope_float64 = _make("float64", "Ground truth in float64 (returns float64; inplace is ignored).")


def apply_cos_sin(x, cos, sin):
    """The cached formula on [..., S, D] x with cos/sin [S, D] (HF's rotate_half form):
    x * cos + rotate_half(x) * sin. Used by the bench as the torch.compile baseline."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def rms_norm_rope_float64(x, weight, positions=None, *, eps=1e-6, weight_offset=0.0, layout="bshd", **rope_kwargs):
    """Ground truth of rope_ext.rms_norm_rope in float64 (differentiable: the backward
    reference is autograd through it): RMSNorm over the head dim, weight + weight_offset,
    then rope_float64 with the same keywords."""
    x64 = x if x.dtype == torch.float64 else x.double()
    # The head dim is the last dimension in every layout.
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * (weight.double() + weight_offset)
    return rope_float64(y, positions, layout=layout, **rope_kwargs)


def attention_float64(q, k, v, seqlens=None, *, causal=True, softmax_scale=None):
    """Ground-truth attention in float64, written without the kernels' index code.

    q [B, q_len, Hq, D] and k, v [B, L, Hk, D] (already rotated; any dtype, computed in
    float64), Hq a multiple of Hk (query head h reads kv head h // (Hq / Hk)). Sequence b
    has seqlens[b] valid keys (default L); query token j sits at key index
    seqlens[b] - q_len + j and with causal=True sees keys up to it, else all valid keys.
    A row that sees no key gives zeros and lse = -inf. Returns (o float64 [B, q_len, Hq, D],
    lse float64 [B, q_len, Hq], natural log)."""
    B, q_len, Hq, D = q.shape
    L, Hk = k.shape[1], k.shape[2]
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    G = Hq // Hk
    # Query head h = kv head h // G, member h % G: the group's heads share K and V without
    # copies (a float64 K expanded G times was GBs at the tests' larger shapes).
    qd, kd, vd = q.double().reshape(B, q_len, Hk, G, D), k.double(), v.double()
    s = (torch.einsum("bjkgd,bikd->bkgji", qd, kd) * scale).reshape(B, Hq, q_len, L)
    n = torch.full((B,), L, device=q.device) if seqlens is None else seqlens.to(q.device, torch.int64)
    key = torch.arange(L, device=q.device)
    visible = key[None, None, :] < n[:, None, None]  # [B, 1, L]
    if causal:
        qidx = n[:, None] - q_len + torch.arange(q_len, device=q.device)[None, :]  # [B, q_len]
        visible = visible & (key[None, None, :] <= qidx[:, :, None])
    visible = visible[:, None].expand(B, Hq, q_len, L)
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf where nothing is visible
    p = torch.where(visible, torch.exp(s - lse.clamp_min(-1e300)[..., None]), torch.zeros_like(s))
    o = torch.einsum("bkgji,bikd->bjkgd", p.reshape(B, Hk, G, q_len, L), vd).reshape(B, q_len, Hq, vd.shape[-1])
    return o, lse.permute(0, 2, 1)


def rope_attention_float64(q, k, v, q_positions, k_positions, seqlens=None, *, causal=True, softmax_scale=None,
                           **rope_kwargs):
    """rope_float64 of q (positions [B, q_len]) and k (positions [B, L]), then
    attention_float64; rope_kwargs as rope_float64 (base, inv_freq, cos_sin_cache,
    rotary_dim, interleaved)."""
    qr = rope_float64(q, q_positions, **rope_kwargs)
    kr = rope_float64(k, k_positions, **rope_kwargs)
    return attention_float64(qr, kr, v, seqlens, causal=causal, softmax_scale=softmax_scale)
