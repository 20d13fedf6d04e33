"""The public Python API: apply_rope, apply_rope_qk, rope.

Each call maps its layout onto the kernels' strided [B, S, H, D] view (a permute or
an unsqueeze: never a copy of x), checks the Python-level arguments, and calls one
C++ op (csrc/rope_ops.cpp), which checks the rest and launches one kernel.
"""
import torch

from . import _C
from ._ops import ops, rope_grads, tensor_opts
from ._args import (  # the argument helpers, shared with norm_rope.py and attention.py
    IMPLS, LAYOUTS, DEFAULT_BASE, _to_bshd, _check_qk_shapes, _from_bshd, _op_options, _check_inplace, _LAYOUT_CODE,
    _is_compiling, _ops_intercepted, _raw)


class _InplaceRope(torch.autograd.Function):
    """In-place rotation of tensors that need grad: backward = rotation by -theta."""

    @staticmethod
    def forward(ctx, opts, *xs):
        (ops.rope_ if len(xs) == 1 else ops.rope_qk_)(*xs, *opts)
        ctx.mark_dirty(*xs)
        ctx.opts = opts
        return xs if len(xs) > 1 else xs[0]

    @staticmethod
    def backward(ctx, *grads):
        return (None, *rope_grads(grads, ctx.opts))




def _direct_ok(xs, rank, opts, allow_grad=False):
    """Whether the call may skip the dispatcher (rope_ext._C.rope_direct): plain
    tensors of the layout's rank (that do not require grad, unless allow_grad), and
    nobody tracing or intercepting ops (torch.compile, a TorchFunction/TorchDispatch
    mode, a subclass, a torch.func transform)."""
    if _ops_intercepted():
        return False
    for x in xs:
        if not _raw(x) or x.dim() != rank or (x.requires_grad and not allow_grad):
            return False
    # The index and frequency tensors: None or plain tensors (this runs on every eager call).
    for t in tensor_opts(opts):
        if t is not None and not _raw(t):
            return False
    return True


class _DirectRope(torch.autograd.Function):
    """Eager out-of-place calls that need grad: rope_direct forward and backward (the
    rotation by -theta), without the dispatcher and torch.library's Python autograd
    wrapper, which cost ~0.3 ms of host time per fwd+bwd (bench/NOTES.md). torch.compile
    and modes take the registered ops and their register_autograd instead."""

    @staticmethod
    def forward(ctx, code, opts, *xs):
        ctx.code, ctx.opts = code, opts
        ctx.metas = [(x.shape, x.dtype, x.device) for x in xs]
        return tuple(_C.rope_direct(list(xs), code, False, *opts))

    @staticmethod
    def backward(ctx, *grads):
        code = ctx.code
        if torch.is_grad_enabled():
            # create_graph=True (double backward): rope_direct's outputs carry no history, so
            # the second derivative through grad_out would silently be zero; the backward is
            # itself a rotation, recorded as one.
            rotate = lambda gs, opts: _DirectRope.apply(code, opts, *gs)  # noqa: E731
        else:
            rotate = lambda gs, opts: tuple(_C.rope_direct(gs, code, False, *opts))  # noqa: E731
        return (None, None, *rope_grads(grads, ctx.opts, rotate, ctx.metas))


def _run(xs, layout, opts, inplace):
    code = _LAYOUT_CODE.get(layout)
    if (code is not None and not inplace and torch.is_grad_enabled()
            and any(isinstance(x, torch.Tensor) and x.requires_grad for x in xs)
            and _direct_ok(xs, 3 if code == 3 else 4, opts, allow_grad=True)):
        return _DirectRope.apply(code, opts, *xs)
    if code is not None and _direct_ok(xs, 3 if code == 3 else 4, opts):
        # The same C++ run() as the ops, minus the dispatcher and the Python views
        # (bench/overhead.py has the per-call costs).
        if inplace:
            _C.rope_direct(xs, code, True, *opts)
            return tuple(xs)
        return tuple(_C.rope_direct(xs, code, False, *opts))
    if len(xs) == 2:
        _check_qk_shapes(xs[0], xs[1], layout)
    x4 = [_to_bshd(x, layout, name) for x, name in zip(xs, ("x", "k") if len(xs) == 1 else ("q", "k"))]
    if not inplace:
        out = ops.rope(*x4, *opts) if len(x4) == 1 else ops.rope_qk(*x4, *opts)
        out = (out,) if len(x4) == 1 else out
        return tuple(_from_bshd(o, layout) for o in out)
    names = ("x",) if len(xs) == 1 else ("q", "k")
    for x, name in zip(xs, names):
        _check_inplace(x, name)
    if torch.is_grad_enabled() and any(x.requires_grad for x in xs):
        if len(x4) == 2 and (_is_compiling() or any(x._is_view() for x in x4)):
            # autograd refuses a Function that marks two views dirty and returns both (the
            # layouts' permuted views, a projection's .view(), fused-qkv head slices), and
            # refuses it only after forward has written them: one launch per tensor here
            # (and under torch.compile, which cannot trace _is_view).
            for x in x4:
                _InplaceRope.apply(opts, x)
        else:
            _InplaceRope.apply(opts, *x4)
    else:
        (ops.rope_ if len(x4) == 1 else ops.rope_qk_)(*x4, *opts)
    return tuple(xs)


_COMMON_DOC = """
    x: [B, S, H, D] (layout="bshd"), [S, B, H, D] ("sbhd"), [B, H, S, D] ("bhsd") or
       [T, H, D] ("thd", packed sequences), float32/float16/bfloat16 (float64 too), any strides.
    positions: int32/int64 [B, S] or [S] ([T] for thd). Default: arange(S) + offsets,
       or for thd with cu_seqlens the index inside each sequence + offsets.
    offsets: int, or int tensor [B] ([N] with cu_seqlens): position of each sequence's first token.
    base: rope_theta; the frequencies are HF's float32 `1 / base ** (arange(0, R, 2) / R)`,
       bit for bit (rope_ext.inv_freq(R, base)); default 10000.0.
    inv_freq: fp32 [R/2] frequencies (scaled RoPE variants; see rope_ext.inv_freq).
    cos_sin_cache: [max_pos, R] table, cos in columns [0, R/2), sin in [R/2, R).
    rotary_dim: R, even, <= D (default D); features [R, D) pass through unchanged.
    interleaved: False = neox pairs (i, i + R/2); True = GPT-J pairs (2i, 2i+1).
    attention_factor: multiplies cos and sin (yarn's / longrope's attention scaling; default 1).
    cp_size, cp_rank (or cp_group, a torch.distributed group): context parallelism. x holds
       this rank's shard of each sequence: chunks cp_rank and 2*cp_size-1-cp_rank of its
       2*cp_size equal chunks (TransformerEngine's load-balanced layout), and every token is
       rotated by its global position, computed in the kernel. For thd, cu_seqlens are then
       the global (padded) cumulative lengths, as TransformerEngine takes them.
    sections: pairs per position axis (M-RoPE's mrope_section, axial splits); positions then
       have a leading axis dimension [axes, B, S] / [axes, S]. sections_interleaved: Qwen3-VL's
       interleaved layout (pair i takes axis i % 3 within 3 * sections[axis]). See apply_mrope
       and apply_rope_axial for the model-family forms.
    inplace: write into x and return x (no allocation).
    impl: "auto" or a name in rope_ext.IMPLS.
    Differentiable with respect to x (backward = the rotation by -theta).
"""


def apply_rope(x, positions=None, *, layout="bshd", offsets=None, base=DEFAULT_BASE, impl="auto",
               cu_seqlens=None, rotary_dim=None, interleaved=False, inv_freq=None, cos_sin_cache=None,
               inplace=False, attention_factor=1.0, cp_size=1, cp_rank=0, cp_group=None, sections=None,
               sections_interleaved=False):
    opts = _op_options(layout, positions, offsets, base, impl, cu_seqlens, rotary_dim, interleaved, inv_freq,
                       cos_sin_cache, attention_factor, cp_size, cp_rank, cp_group, sections, sections_interleaved)
    return _run((x,), layout, opts, inplace)[0]


apply_rope.__doc__ = "Rotary position embedding of x; returns a new tensor of x's shape and dtype.\n" + _COMMON_DOC


def apply_rope_qk(q, k, positions=None, *, layout="bshd", offsets=None, base=DEFAULT_BASE, impl="auto",
                  cu_seqlens=None, rotary_dim=None, interleaved=False, inv_freq=None, cos_sin_cache=None,
                  inplace=False, attention_factor=1.0, cp_size=1, cp_rank=0, cp_group=None, sections=None,
                  sections_interleaved=False):
    opts = _op_options(layout, positions, offsets, base, impl, cu_seqlens, rotary_dim, interleaved, inv_freq,
                       cos_sin_cache, attention_factor, cp_size, cp_rank, cp_group, sections, sections_interleaved)
    return _run((q, k), layout, opts, inplace)


apply_rope_qk.__doc__ = """apply_rope of q and k in ONE kernel launch (sin/cos shared); returns (q_out, k_out).

    q and k may have different head counts (GQA/MQA) and different strides; every other
    dimension, the dtype and the device must match. Same keywords as apply_rope:
""" + _COMMON_DOC


def rope(x, impl="auto", base=DEFAULT_BASE):
    """The single-call form: x [..., S, D] (e.g. [S, D], one head of one sequence),
    position = index along S, neox pairing. Returns a new tensor like x."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"rope_ext: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"rope_ext: rope() needs x of rank >= 2 [..., S, D], got shape {tuple(x.shape)}")
    S, D = x.shape[-2], x.shape[-1]
    x4 = x.unsqueeze(-2)  # [..., S, 1, D]
    x4 = x4.unsqueeze(0) if x.dim() == 2 else x4.reshape(-1, S, 1, D) if x.dim() > 3 else x4
    opts = _op_options("bshd", None, None, base, impl, None, None, False, None, None)
    return ops.rope(x4, *opts).reshape(x.shape)
