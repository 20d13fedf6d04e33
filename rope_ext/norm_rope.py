"""Per-head RMSNorm fused with RoPE (the q/k norms of Qwen3 and Gemma 3).

    y = rope(x / sqrt(mean(x^2 over the head dim) + eps) * (weight + weight_offset))

Qwen3: weight_offset = 0; Gemma 3 (whose RMSNorm scales by 1 + weight): weight_offset = 1.
One kernel reads x once and writes y once (csrc/cuda/norm_rope_variants.cuh); fp32
arithmetic, one rounding at the store (HF's Qwen3 norm rounds to the input dtype before
the weight: the two differ by at most one rounding of that intermediate).
Differentiable with respect to x and weight (a fused backward kernel: dx and the
weight's gradient in one pass).
"""
import torch

from . import _C
from ._ops import norm_rope_grads, ops, tensor_opts
from ._args import (DEFAULT_BASE, _LAYOUT_CODE, _bshd_view, _check_layout_rank, _check_qk_shapes, _from_bshd,
                    _op_options, _ops_intercepted, _raw)

#: Variants of the fused norm + rope kernel; "auto" (the default) picks among them.
NORM_ROPE_IMPLS = tuple(_C.norm_rope_impl_names())


def _weight(w, name):
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"rope_ext: {name} must be a torch.Tensor [head_dim], got {type(w).__name__}")
    return w


def _num(v, name):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"rope_ext: {name} must be a number, got {type(v).__name__}")
    return float(v)


def _run(xs, names, weights, wnames, positions, eps, weight_offset, layout, offsets, base, impl, cu_seqlens,
         rotary_dim, interleaved, inv_freq, cos_sin_cache, attention_factor, cp_size, cp_rank, cp_group, sections,
         sections_interleaved):
    if len(xs) == 2:
        _check_qk_shapes(xs[0], xs[1], layout)
    for x, n in zip(xs, names):
        _check_layout_rank(x, layout, n)
    ws = [_weight(w, n) for w, n in zip(weights, wnames)]
    opts = _op_options(layout, positions, offsets, base, impl, cu_seqlens, rotary_dim, interleaved, inv_freq,
                       cos_sin_cache, attention_factor, cp_size, cp_rank, cp_group, sections, sections_interleaved)
    eps, weight_offset = _num(eps, "eps"), _num(weight_offset, "weight_offset")
    eager = _eager_ok(xs + ws, opts)
    if eager and not (torch.is_grad_enabled() and any(t.requires_grad for t in xs + ws)):
        # (the [B, S, H, D] forms made in C++, without view ops: bench/overhead.py)
        return list(_C.norm_rope_direct(xs, ws, eps, weight_offset, _LAYOUT_CODE[layout], *opts))
    x4 = [_bshd_view(x, layout) for x in xs]
    if eager:
        out = _NormRopeFn.apply(len(x4), eps, weight_offset, opts, *x4, *ws)
    else:
        out = ops.norm_rope(x4, ws, eps, weight_offset, *opts)
    return [_from_bshd(o, layout) for o in out]


def _eager_ok(tensors, opts):
    """Plain eager call (nobody tracing or intercepting ops): the C++ functions are called
    directly, with the autograd.Function below; torch.compile, modes and subclasses take
    the registered ops (their register_autograd). The same functions either way: the
    direct path only skips the dispatcher and torch.library's Python autograd wrapper
    (bench/NOTES.md: fwd+bwd host time 880 -> ... us per call on the CPU box)."""
    if _ops_intercepted():
        return False
    return all(_raw(t) for t in tensors) and all(t is None or _raw(t) for t in tensor_opts(opts))


class _NormRopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, n, eps, weight_offset, opts, *tensors):
        xs, ws = list(tensors[:n]), list(tensors[n:])
        ctx.save_for_backward(*tensors)
        ctx.n, ctx.eps, ctx.weight_offset, ctx.opts = n, eps, weight_offset, opts
        return tuple(_C.norm_rope_direct(xs, ws, eps, weight_offset, _LAYOUT_CODE["bshd"], *opts))

    @staticmethod
    def backward(ctx, *grads):
        n = ctx.n
        saved = ctx.saved_tensors
        xs, ws = list(saved[:n]), list(saved[n:])
        # create_graph: the op, whose Autograd kernel (norm_rope_ops.cpp) makes a double
        # backward an error; the direct call's outputs would silently act as constants.
        out = norm_rope_grads(grads, xs, ws, ctx.eps, ctx.weight_offset, ctx.opts, direct=not torch.is_grad_enabled())
        return (None, None, None, None, *out)


def rms_norm_rope(x, weight, positions=None, *, eps=1e-6, weight_offset=0.0, layout="bshd", offsets=None,
                  base=DEFAULT_BASE, impl="auto", cu_seqlens=None, rotary_dim=None, interleaved=False, inv_freq=None,
                  cos_sin_cache=None, attention_factor=1.0, cp_size=1, cp_rank=0, cp_group=None, sections=None,
                  sections_interleaved=False):
    """RMSNorm over the head dim of x (weight [D]), then RoPE, in one kernel; returns a new
    tensor of x's shape and dtype. Layouts, positions and frequency keywords as
    rope_ext.apply_rope (not in place). impl: "auto", "warp" (scalar, any strides) or
    "tile" (16-byte access). Head dims up to 512."""
    return _run([x], ["x"], [weight], ["weight"], positions, eps, weight_offset, layout, offsets, base, impl,
                cu_seqlens, rotary_dim, interleaved, inv_freq, cos_sin_cache, attention_factor, cp_size, cp_rank,
                cp_group, sections, sections_interleaved)[0]


def rms_norm_rope_qk(q, k, q_weight, k_weight, positions=None, *, eps=1e-6, weight_offset=0.0, layout="bshd",
                     offsets=None, base=DEFAULT_BASE, impl="auto", cu_seqlens=None, rotary_dim=None,
                     interleaved=False, inv_freq=None, cos_sin_cache=None, attention_factor=1.0, cp_size=1, cp_rank=0,
                     cp_group=None, sections=None, sections_interleaved=False):
    """rms_norm_rope of q (q_weight) and k (k_weight) in one launch; returns (q_out, k_out)."""
    qo, ko = _run([q, k], ["q", "k"], [q_weight, k_weight], ["q_weight", "k_weight"], positions, eps, weight_offset,
                  layout, offsets, base, impl, cu_seqlens, rotary_dim, interleaved, inv_freq, cos_sin_cache,
                  attention_factor, cp_size, cp_rank, cp_group, sections, sections_interleaved)
    return qo, ko
