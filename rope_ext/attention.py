"""RoPE fused into attention, where fusion pays (docs/attention.md).

    append_kv         rotate the new K once (and Q in place) and write K, V into the KV
                      cache slots of the new tokens: one launch (bf16/fp16/fp32 caches,
                      or fp8 e4m3 with k_scale / v_scale: quantized in the same launch)
    append_mla        DeepSeek MLA: rotate k_pe (and q_pe in place) and write
                      [kv_c | rotated k_pe] into the latent cache: the same launch
    attention_decode  decode attention over the cache with Q-RoPE applied while Q is
                      loaded (K in the cache is already rotated); split-KV + combine
    rope_attention    prefill: apply_rope_qk + torch's scaled_dot_product_attention;
                      impl="fused" forces the decode kernel (auto takes it only for
                      S <= FUSED_MAX_Q without grad, where it measured faster)

Caches (vLLM / FlashInfer layouts), head dim contiguous:
    contiguous  k_cache, v_cache [B, max_len, Hk, D]
    paged       k_cache, v_cache [num_blocks, block_size, Hk, D] + block_table [B, max_blocks]
                (slot i of sequence b: block block_table[b, i // block_size], row i % block_size)
    Any strides with 16-byte rows: a cache stored head-major ([B, Hk, max_len, D] or
    [num_blocks, Hk, block_size, D], FlashInfer's HND) is passed as its .transpose(1, 2)
    view. For fp8 caches that is the faster layout to read (docs/attention.md).
FP8 caches (vLLM's kv_cache_dtype="fp8"): torch.float8_e4m3fn k_cache / v_cache with
float32 k_scale, v_scale tensors ([1]: per tensor, [Hk]: per kv head). An element holds
x / scale, saturated to +-448 and rounded once (as (x / scale).clamp(-448, 448)
.to(torch.float8_e4m3fn)); attention_decode multiplies by the scales as it reads.
The frequency keywords (base, inv_freq, cos_sin_cache, rotary_dim, interleaved) mean
what they mean for rope_ext.apply_rope: same kernels' sin/cos, same HF float32 table.
"""
import torch

from . import _C
from ._ops import ops
from ._args import DEFAULT_BASE, _factor_arg, _freq_args, _offsets_arg, _ops_intercepted, _raw
from .api import apply_rope, apply_rope_qk

#: attention_decode variants: "hybrid" = variant 5 (tensor cores, csrc/cuda/decode_mma.cuh),
#: "hybrid_simt" = variant 2 and "full_fusion" = variant 3 (attention_variants.cuh, kept
#: as measured comparisons); impl="auto" picks "hybrid".
DECODE_IMPLS = ("hybrid", "hybrid_simt", "full_fusion")
#: rope_attention paths; impl="auto" picks "fused" only where it measured faster (FUSED_MAX_Q).
PREFILL_IMPLS = ("fused", "separate")
#: Largest number of query tokens for which rope_attention(impl="auto") takes the fused
#: kernel (CUDA, fp16/bf16, no grad); 0: never. Set from the H100 prefill rows of
#: bench/attn.py (`--suite attn`): PREFILL_MEASURED below.
FUSED_MAX_Q = 0
PREFILL_MEASURED = ("H100, CUDA graph, cold L2, Hq 32, Hk 8, D 128, bf16 (issue 18 run 4): fused / separate "
                    "0.27x (B 1, S 1), 0.58x (S 4), 0.60x (S 16), 0.35x (S 64); B 8: 0.30x, 0.77x, 0.47x, 0.10x. "
                    "The separate path (rope + SDPA) wins at every S, so auto never fuses.")


# The ops' argument names in their schemas' order: the positional order of the eager
# entries without the dispatcher (rope_ext._C.<op>_direct, csrc/attention_ops.cpp).
_ARG_NAMES = {name: tuple(a.name for a in getattr(ops, name).default._schema.arguments)
              for name in ("append_kv", "attention_decode", "attention_decode_append")}


def _call(name, args, opts):
    """ops.<name>(*args, **opts); for a plain eager call (tensors whose memory is what they
    hold, _raw, none needing grad; nobody tracing or intercepting ops) the same C++
    function without the dispatcher, ~2-2.5 us of host less a call (bench/overhead.py,
    run 5 of the twenty-fifth session)."""
    direct = not _ops_intercepted()
    if direct:
        for t in (*args, *opts.values()):
            if isinstance(t, torch.Tensor) and (not _raw(t) or t.requires_grad):
                direct = False
                break
    if not direct:
        return getattr(ops, name)(*args, **opts)
    return getattr(_C, name + "_direct")(*args, *(opts[n] for n in _ARG_NAMES[name][len(args):]))


def _tensor_or_none(t, name):
    if t is not None and not isinstance(t, torch.Tensor):
        raise TypeError(f"rope_ext: {name} must be a torch.Tensor or None, got {type(t).__name__}")


def _rotary_args(offsets, base, inv_freq, cos_sin_cache, rotary_dim):
    """(offsets tensor or None, int offset, base, rotary_dim) after the Python-level checks."""
    for name, t in (("inv_freq", inv_freq), ("cos_sin_cache", cos_sin_cache)):
        _tensor_or_none(t, name)
    base, rotary_dim = _freq_args(base, inv_freq, cos_sin_cache, rotary_dim)
    offset, offsets_t = _offsets_arg(offsets)
    return offsets_t, offset, base, rotary_dim


def _scales(k_scale, v_scale):
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"rope_ext: {name} must be a float32 torch.Tensor ([1] or [Hk]) or None, got "
                            f"{type(t).__name__} (a tensor keeps the call CUDA-graph safe)")
    return k_scale, v_scale


def _check_tensors(**kw):
    for name, t in kw.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rope_ext: {name} must be a torch.Tensor, got {type(t).__name__}")


def append_kv(k, v, k_cache, v_cache, cache_seqlens, *, positions=None, block_table=None, q=None, cu_seqlens=None,
              offsets=None, base=DEFAULT_BASE, inv_freq=None, cos_sin_cache=None, rotary_dim=None, interleaved=False,
              rotate_k=True, k_scale=None, v_scale=None, attention_factor=1.0):
    """Rotate K (and Q, in place, when given) and write rotated K and V into the cache
    slots of the new tokens, in one launch. Returns None; k_cache, v_cache (and q) are
    written.

    k, v: [B, T, Hk, D] (token t of sequence b goes to cache index cache_seqlens[b] + t),
       or varlen [Ttot, Hk, D] with cu_seqlens [B+1] (token j of sequence n goes to
       cache_seqlens[n] + j). Any strides: q, k, v may be views of one fused projection
       output [T, (Hq + 2 Hk) * D].
    k_cache, v_cache: [B, max_len, Hk, D], or paged [num_blocks, block_size, Hk, D] with
       block_table int32 [B, max_blocks]; same dtype as k; head dim contiguous.
    cache_seqlens: int32 [B], tokens already in the cache BEFORE this append (not
       modified: add the new token counts yourself afterwards).
    positions: rotary positions of the new tokens, [B, T] or [T] ([Ttot] varlen); default:
       the cache index (+ offsets, an int or an int tensor [B]).
    q: [B, T, Hq, D] / [Ttot, Hq, D], rotated in place with the same positions.
    rotate_k=False writes K un-rotated (the cache of attention_decode(impl="full_fusion")).
    base / inv_freq / cos_sin_cache / rotary_dim / interleaved / attention_factor: as
       rope_ext.apply_rope.
    k_scale, v_scale: float32 tensors [1] or [Hk], required with (and only with) fp8
       (torch.float8_e4m3fn) caches: K is rotated in fp32, divided by k_scale, saturated
       and rounded once; V likewise with v_scale; q stays in its dtype.
    v may have its own head dim (v_cache's): MLA's latent (append_mla) is written that way.

    Bad input raises (nothing written): cache too small for the new tokens, block table
    entries out of range, shape / dtype / device mismatches. The value checks (seqlens,
    block table, cu_seqlens, positions) need the values on the host: always done for CPU
    tensors, for CUDA tensors after rope_ext.set_value_checks(True); without them the
    kernel drops a token whose slot does not exist (never writes out of bounds).
    Not differentiable.
    """
    _check_tensors(k=k, v=v, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens)
    for name, t in (("positions", positions), ("block_table", block_table), ("q", q), ("cu_seqlens", cu_seqlens)):
        _tensor_or_none(t, name)
    offsets_t, offset, base, rotary_dim = _rotary_args(offsets, base, inv_freq, cos_sin_cache, rotary_dim)
    k_scale, v_scale = _scales(k_scale, v_scale)
    # The options by name: the schemas' order is csrc/attention_options.h's alone.
    _call("append_kv", (k, v, k_cache, v_cache, cache_seqlens),
          dict(cu_seqlens=cu_seqlens, q=q, positions=positions, block_table=block_table, offsets=offsets_t,
               offset=offset, inv_freq=inv_freq, cos_sin_cache=cos_sin_cache, base=base, rotary_dim=rotary_dim,
               interleaved=bool(interleaved), rotate_k=bool(rotate_k), k_scale=k_scale, v_scale=v_scale,
               attention_factor=_factor_arg(attention_factor)))


def append_mla(kv_c, k_pe, cache, cache_seqlens, *, positions=None, block_table=None, q_pe=None, cu_seqlens=None,
               offsets=None, base=DEFAULT_BASE, inv_freq=None, cos_sin_cache=None, interleaved=True,
               attention_factor=1.0, scale=None):
    """DeepSeek MLA (V2/V3) cache append: rotate k_pe (and q_pe, in place) and write
    [kv_c | rotated k_pe] into the latent cache, in one launch (append_kv's kernel with
    the latent as a V of its own head dim). Returns None; cache (and q_pe) are written.

    kv_c: [Ttot, L] (varlen, with cu_seqlens [B+1]) or [B, T, L] (L = kv_lora_rank).
    k_pe: [Ttot, R] / [Ttot, 1, R], or [B, T, R] / [B, T, 1, R] (R = qk_rope_head_dim).
    cache: [num_blocks, block_size, L + R] with block_table [B, max_blocks], or
       [B, max_len, L + R]; bf16 / fp16 / fp32 (kv_c's dtype), or torch.float8_e4m3fn with
       `scale` (a float32 tensor [1], used for kv_c and k_pe alike, as vLLM's
       concat_and_cache_mla does).
    q_pe: [Ttot, H, R] / [B, T, H, R], rotated in place (may be a strided slice of q).
    interleaved=True: DeepSeek's GPT-J pairing. positions / offsets / cache_seqlens /
       base / inv_freq / cos_sin_cache / attention_factor: as append_kv (for DeepSeek's
       yarn: inv_freq, attention_factor = rope_ext.inv_freq(R, base, rope_scaling,
       return_attention_factor=True)).
    """
    _check_tensors(kv_c=kv_c, k_pe=k_pe, cache=cache, cache_seqlens=cache_seqlens)
    if kv_c.dim() not in (2, 3):
        raise ValueError(f"rope_ext: kv_c must be [Ttot, L] (varlen) or [B, T, L], got shape {tuple(kv_c.shape)}")
    if k_pe.dim() == kv_c.dim():
        k_pe = k_pe.unsqueeze(-2)
    if k_pe.dim() != kv_c.dim() + 1 or k_pe.shape[:-2] != kv_c.shape[:-1] or k_pe.shape[-2] != 1:
        raise ValueError(f"rope_ext: k_pe must be kv_c's tokens x R ({'[Ttot, R]' if kv_c.dim() == 2 else '[B, T, R]'}, "
                         f"or with a head dim of 1), got k_pe {tuple(k_pe.shape)} for kv_c {tuple(kv_c.shape)}")
    L, R = kv_c.shape[-1], k_pe.shape[-1]
    if cache.dim() != 3 or cache.shape[-1] != L + R:
        raise ValueError(f"rope_ext: cache must be [num_blocks, block_size, L + R] (paged) or [B, max_len, L + R] with "
                         f"L + R = {L} + {R} = {L + R}, got shape {tuple(cache.shape)}")
    if scale is not None and not isinstance(scale, torch.Tensor):
        raise TypeError(f"rope_ext: scale must be a float32 torch.Tensor [1] or None, got {type(scale).__name__}")
    if scale is not None and scale.numel() != 1:
        raise ValueError(f"rope_ext: scale must hold one value (the latent cache has one scale), got shape "
                         f"{tuple(scale.shape)}")
    # The two parts of each cache row as [.., 1, L] and [.., 1, R] caches of one kv head.
    v_cache, k_cache = cache[..., :L].unsqueeze(-2), cache[..., L:].unsqueeze(-2)
    append_kv(k_pe, kv_c.unsqueeze(-2), k_cache, v_cache, cache_seqlens, positions=positions, block_table=block_table,
              q=q_pe, cu_seqlens=cu_seqlens, offsets=offsets, base=base, inv_freq=inv_freq,
              cos_sin_cache=cos_sin_cache, interleaved=interleaved, k_scale=scale, v_scale=scale,
              attention_factor=attention_factor)


def _int_or_none(v, name):
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"rope_ext: {name} must be an int or None, got {type(v).__name__}")
    if v <= 0:
        raise ValueError(f"rope_ext: {name} must be > 0, got {v}")
    return v


def attention_decode(q, k_cache, v_cache, cache_seqlens, *, positions=None, block_table=None, offsets=None,
                     softmax_scale=None, return_lse=False, causal=True, base=DEFAULT_BASE, inv_freq=None,
                     cos_sin_cache=None, rotary_dim=None, interleaved=False, max_seqlen=None, num_splits=None,
                     impl="auto", k_scale=None, v_scale=None, attention_factor=1.0, k=None, v=None):
    """Decode attention with Q-RoPE fused into the kernel's Q load; with k and v, the
    whole decode step (append the new K/V, then attend) in one launch.

    q: [B, q_len, Hq, D] UN-rotated (q_len <= 16 is the designed range; Hq a multiple
       of Hk: GQA); float16/bfloat16 (float32 too on the CPU); fp32 accumulation.
    k_cache, v_cache: as append_kv (contiguous or paged with block_table), K already
       rotated (append_kv). CUDA: head dim 64, 128 or 256, 16-byte aligned rows.
    cache_seqlens: int32 [B], valid tokens per sequence INCLUDING the q tokens: query
       token j sits at cache index cache_seqlens[b] - q_len + j, and (causal=True) sees
       the keys up to and including it; causal=False: every key below cache_seqlens[b].
       A sequence of length 0 gives zeros (lse = -inf). A query token at a negative index
       (q_len > cache_seqlens[b]: not in the cache) sees no key, causal or not: zeros,
       lse = -inf, on the CPU and CUDA alike; with causal=False and 0 < cache_seqlens[b] <
       q_len the call is refused (ValueError) where values are checked (CPU always, CUDA
       under rope_ext.set_value_checks(True)). A NaN score (a NaN in q or in a visible
       key) makes its row NaN, output and lse, as softmax does.
    positions: rotary positions of the query tokens [B, q_len] or [q_len]; default the
       cache index (+ offsets: int or int tensor [B]).
    k_scale, v_scale: with fp8 (torch.float8_e4m3fn) caches, float32 [1] or [Hk]: keys and
       values are read as element * scale (exact in the MMA's 16-bit inputs; k_scale
       folds into the score scale, v_scale into the output). impl "hybrid"/"auto" only.
    k, v: the step's new keys and values [B, q_len, Hk, D] (un-rotated K; any strides,
       e.g. head slices of one fused projection), as flash-attn's flash_attn_with_kvcache
       takes them: K is rotated (fp8: quantized) and both are written at cache indices
       cache_seqlens[b] + j, exactly as append_kv writes them, and the query tokens attend
       over cache_seqlens[b] + q_len keys. Here cache_seqlens counts the tokens BEFORE the
       step (not modified: add q_len yourself afterwards). On CUDA with impl "auto" /
       "hybrid", q_len <= 8 with G * q_len <= 16 (G = Hq / Hk) and 16-byte aligned rows
       with contiguous features this is one launch (the kernel's last split builds the new
       keys' tile itself); otherwise append_kv's kernel runs first.
    softmax_scale: default 1 / sqrt(D). return_lse: also return lse [B, q_len, Hq]
       (float32, natural log).
    max_seqlen: optional host-side bound on cache_seqlens (an int; with k, v: before the
       step): the split count is
       chosen from it instead of the capacity. Never read from the device (CUDA-graph safe).
    num_splits: force the number of key splits (CUDA; default: chosen from the shapes).
    impl: "auto" (= "hybrid": the cache holds rotated K; tensor-core kernel), "hybrid_simt"
       (the same contract on the older CUDA-core kernel, kept for the bench), or
       "full_fusion" (the cache holds UN-rotated K, append_kv(rotate_k=False), rotated on
       every read at position index + offsets; kept for the bench: it loses, see
       docs/attention.md). On the CPU every impl runs the one reference path.

    Returns o [B, q_len, Hq, D] in q's dtype (and lse). Not differentiable (rope_attention's
    separate path is).
    """
    _check_tensors(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens)
    for name, t in (("positions", positions), ("block_table", block_table)):
        _tensor_or_none(t, name)
    offsets_t, offset, base, rotary_dim = _rotary_args(offsets, base, inv_freq, cos_sin_cache, rotary_dim)
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"rope_ext: softmax_scale must be a number or None, got {type(softmax_scale).__name__}")
        softmax_scale = float(softmax_scale)
    if not isinstance(impl, str):
        raise TypeError(f"rope_ext: impl must be a str ('auto' or one of {DECODE_IMPLS}), got {type(impl).__name__}")
    k_scale, v_scale = _scales(k_scale, v_scale)
    if (k is None) != (v is None):
        raise ValueError("rope_ext: give k and v together (the decode step's new tokens), or neither")
    # The options by name: the schemas' order is csrc/attention_options.h's alone.
    opts = dict(positions=positions, block_table=block_table, offsets=offsets_t, offset=offset, inv_freq=inv_freq,
                cos_sin_cache=cos_sin_cache, base=base, rotary_dim=rotary_dim, interleaved=bool(interleaved),
                softmax_scale=softmax_scale, causal=bool(causal), max_seqlen=_int_or_none(max_seqlen, "max_seqlen"),
                num_splits=_int_or_none(num_splits, "num_splits"), impl=impl, k_scale=k_scale, v_scale=v_scale,
                attention_factor=_factor_arg(attention_factor))
    if k is None:
        o, lse = _call("attention_decode", (q, k_cache, v_cache, cache_seqlens), opts)
    else:
        _check_tensors(k=k, v=v)
        o, lse = _call("attention_decode_append", (q, k, v, k_cache, v_cache, cache_seqlens), opts)
    return (o, lse) if return_lse else o


def _needs_grad(*ts):
    return torch.is_grad_enabled() and any(t.requires_grad for t in ts)


def _as_cache(t):
    """t [B, S, H, D] as a contiguous-layout cache: unit head-dim stride, 16-byte aligned rows.
    The fallback is a copy, not t.contiguous(): that returns a contiguous but misaligned view
    (a slice at an odd offset) unchanged, which attention_decode on CUDA then rejects."""
    if torch.compiler.is_compiling():  # no data pointers while tracing
        return t.contiguous()
    V = 16 // t.element_size()
    ok = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s % V == 0 for s in t.stride()[:-1])
    return t if ok else t.clone(memory_format=torch.contiguous_format)


def _sdpa(q, k, v, causal, softmax_scale):
    Hq, Hk = q.shape[2], k.shape[2]
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale,
        enable_gqa=Hq != Hk)
    return o.transpose(1, 2)


def rope_attention(q, k, v, positions=None, *, causal=True, softmax_scale=None, base=DEFAULT_BASE, inv_freq=None,
                   cos_sin_cache=None, rotary_dim=None, interleaved=False, impl="auto"):
    """Attention of RoPE-rotated q and k (prefill): q [B, S, Hq, D], k, v [B, S, Hk, D]
    (Hq a multiple of Hk), all un-rotated; positions [B, S] or [S] (default 0..S-1).
    Returns [B, S, Hq, D] in q's dtype. causal: query i sees keys 0..i.

    impl="auto": the fused decode kernel (Q-RoPE on load; attention_decode with k, v as
    the cache) when S <= FUSED_MAX_Q on CUDA without grad (where it measured faster:
    PREFILL_MEASURED), else the separate path, rope_ext.apply_rope_qk +
    torch.nn.functional.scaled_dot_product_attention (the backend torch picks).
    impl="fused" / "separate" force one. AUTOGRAD goes through the
    separate path only: with inputs that require grad, auto takes it and "fused" raises.
    The fused path rotates K inside the kernel when positions are the default (one
    launch: attention_decode's full-fusion variant), else rotates K with apply_rope first.
    """
    _check_tensors(q=q, k=k, v=v)
    _tensor_or_none(positions, "positions")
    if impl not in ("auto",) + PREFILL_IMPLS:
        raise ValueError(f"rope_ext: impl must be 'auto', 'fused' or 'separate', got {impl!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"rope_ext: {name} must be 4-D [B, S, H, D], got shape {tuple(t.shape)}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"rope_ext: q [B, S, Hq, D] and k, v [B, S, Hk, D] must agree, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    Hq_, Hk_ = q.shape[2], k.shape[2]
    if (Hq_ % Hk_ if Hk_ else Hq_):
        raise ValueError(f"rope_ext: q's heads (Hq = {Hq_}) must be a multiple of k's and v's (Hk = {Hk_}), "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    rkw = dict(base=base, inv_freq=inv_freq, cos_sin_cache=cos_sin_cache, rotary_dim=rotary_dim,
               interleaved=interleaved)
    grad = _needs_grad(q, k, v)
    if impl == "fused" and grad:
        raise RuntimeError("rope_ext: rope_attention(impl='fused') is not differentiable; use impl='separate' or 'auto'")
    B, S, Hq, D = q.shape
    fused = impl == "fused" or (impl == "auto" and not grad and q.is_cuda
                                and S <= FUSED_MAX_Q and D in (64, 128, 256)
                                and q.dtype in (torch.float16, torch.bfloat16) and q.dtype == k.dtype == v.dtype)
    if not fused:
        qr, kr = apply_rope_qk(q, k, positions, **rkw)
        return _sdpa(qr, kr, v, causal, softmax_scale)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=q.device)
    R = D if rotary_dim is None else rotary_dim
    if positions is None and (R % 8 == 0 if interleaved else (R // 2) % 8 == 0):
        # Default positions: keys at their index, so the full-fusion kernel rotates them
        # in its loop (S <= 16 keys: cheaper than a second launch).
        return attention_decode(q, _as_cache(k), _as_cache(v), seqlens, softmax_scale=softmax_scale, causal=causal,
                                impl="full_fusion", **rkw)
    kr = apply_rope(k, positions, **rkw)
    return attention_decode(q, _as_cache(kr), _as_cache(v), seqlens, positions=positions, softmax_scale=softmax_scale,
                            causal=causal, impl="hybrid", **rkw)
