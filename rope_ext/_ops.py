"""torch.compile and autograd support for the C++ ops (torch.ops.rope_ext.*).

The ops are defined in C++ (schemas: csrc/registration.cpp, TORCH_LIBRARY; kernels
registered next to their op code, e.g. csrc/rope_ops.cpp) so that an eager call
costs one dispatcher hop; here they get their fake (meta) implementations and their
backward: the rotation by -theta, i.e. the same op with `inverse` flipped. The backward
needs only grad_out, never the saved input.
"""
import operator

import torch

from . import _C  # noqa: F401  (loads the library: registers torch.ops.rope_ext)

ops = torch.ops.rope_ext

# The rope options (after the tensors an op rotates), in the registered schema's order,
# read by name: csrc/rope_options.h is their one list, and a reorder there needs no change
# here (tests/test_option_order.py builds one and runs the op and gradient tests on it).
_OPT_ARGS = ops.rope.default._schema.arguments[1:]
OPT_NAMES = tuple(a.name for a in _OPT_ARGS)
_N_OPTS = len(OPT_NAMES)
_INVERSE = OPT_NAMES.index("inverse")
_IMPL = OPT_NAMES.index("impl")
_TENSOR_OPTS = tuple(i for i, a in enumerate(_OPT_ARGS) if str(a.type) == "Optional[Tensor]")
#: The index and frequency tensors of an option list (a tuple, schema order). An
#: itemgetter: it runs on every eager call; the paths torch.compile traces never call it.
tensor_opts = operator.itemgetter(*_TENSOR_OPTS)


@torch.library.register_fake("rope_ext::rope")
def _rope_fake(x, *opts):
    return torch.empty_like(x)


@torch.library.register_fake("rope_ext::rope_")
def _rope_inplace_fake(x, *opts):
    return None


@torch.library.register_fake("rope_ext::rope_qk")
def _rope_qk_fake(q, k, *opts):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.register_fake("rope_ext::rope_qk_")
def _rope_qk_inplace_fake(q, k, *opts):
    return None


def _save(ctx, opts, *tensors):
    """Saves an op's `tensors`, then its option tensors (None where absent) and the other options."""
    ctx.save_for_backward(*tensors, *tensor_opts(opts))
    ctx.n_saved = len(tensors)
    ctx.opts = [None if i in _TENSOR_OPTS else v for i, v in enumerate(opts)]


def _saved(ctx):
    """What _save saved: (the op's tensors, the forward's options)."""
    saved = ctx.saved_tensors
    opts = list(ctx.opts)
    for i, t in zip(_TENSOR_OPTS, saved[ctx.n_saved:]):
        opts[i] = t
    return saved[:ctx.n_saved], opts


def _grad_input(g, impl):
    # An explicit variant runs on the gradient too; the vector variants need dense, 16-byte
    # aligned rows, and an autograd grad can be an expanded view (e.g. from .sum()) or a
    # contiguous slice at any element offset (e.g. from cat's backward).
    if impl == "auto":
        return g
    g = g.contiguous()
    return g if g.storage_offset() * g.element_size() % 16 == 0 else g.clone()


def op_rotate(gs, opts):
    """The rope ops on 4-D [B, S, H, D] tensors (one or q and k): a tuple of outputs."""
    return (ops.rope(gs[0], *opts),) if len(gs) == 1 else tuple(ops.rope_qk(*gs, *opts))


def rope_grads(grads, opts, rotate=op_rotate, like=None):
    """THE backward of the rope ops, whichever road the forward took (the registered
    autograd below, api._DirectRope, api._InplaceRope): the rotation by -theta of the
    output grads, i.e. the forward's options with `inverse` flipped; nothing saved but
    the options. rotate(gs, opts) runs it (the ops, or the direct entry point); like:
    (shape, dtype, device) per grad, for grads autograd left as None."""
    opts = list(opts)
    opts[_INVERSE] = not opts[_INVERSE]
    gs = [torch.zeros(like[i][0], dtype=like[i][1], device=like[i][2]) if g is None else _grad_input(g, opts[_IMPL])
          for i, g in enumerate(grads)]
    return rotate(gs, opts)


def _rope_setup(ctx, inputs, output):
    _save(ctx, inputs[1:])


def _rope_backward(ctx, grad):
    return rope_grads([grad], _saved(ctx)[1]) + (None,) * _N_OPTS


def _rope_qk_setup(ctx, inputs, output):
    _save(ctx, inputs[2:])


def _rope_qk_backward(ctx, gq, gk):
    return rope_grads([gq, gk], _saved(ctx)[1]) + (None,) * _N_OPTS


torch.library.register_autograd("rope_ext::rope", _rope_backward, setup_context=_rope_setup)
torch.library.register_autograd("rope_ext::rope_qk", _rope_qk_backward, setup_context=_rope_qk_setup)


# Fused RMSNorm + RoPE (csrc/norm_rope_ops.cpp): xs = [x] or [q, k], weights one per tensor.
@torch.library.register_fake("rope_ext::norm_rope")
def _norm_rope_fake(xs, weights, eps, weight_offset, *opts):
    return [torch.empty_like(x) for x in xs]


@torch.library.register_fake("rope_ext::norm_rope_backward")
def _norm_rope_backward_fake(grads, xs, weights, eps, weight_offset, *opts):
    return [torch.empty_like(x) for x in xs] + [torch.empty_like(w) for w in weights]


def _norm_rope_setup(ctx, inputs, output):
    xs, weights, eps, weight_offset = inputs[:4]
    opts = inputs[4:]
    _save(ctx, opts, *xs, *weights)
    ctx.n = len(xs)
    ctx.eps, ctx.weight_offset = eps, weight_offset
    # The returned grads must mirror the inputs' pytree as torch.library sees it: an
    # empty int[] option is an empty list node, a non-empty one a leaf.
    ctx.opt_grads = tuple([] if isinstance(v, (list, tuple)) and not v else None for v in opts)


def norm_rope_grads(grads, xs, weights, eps, weight_offset, opts, direct=False):
    """THE backward of norm_rope, whichever road the forward took (the registered autograd
    below, norm_rope._NormRopeFn): the input grads, then the weight grads, from one
    kernel (missing output grads as zeros). direct: through the entry point without the
    dispatcher (eager, no double backward)."""
    grads = [torch.zeros_like(x) if g is None else _grad_input(g, opts[_IMPL]) for g, x in zip(grads, xs)]
    run = _C.norm_rope_backward_direct if direct else ops.norm_rope_backward
    return run(grads, xs, weights, eps, weight_offset, *opts)


def _norm_rope_backward(ctx, grads):
    n = ctx.n
    tensors, opts = _saved(ctx)
    xs, weights = list(tensors[:n]), list(tensors[n:])
    out = norm_rope_grads(grads, xs, weights, ctx.eps, ctx.weight_offset, opts)
    return (list(out[:n]), list(out[n:]), None, None) + ctx.opt_grads


torch.library.register_autograd("rope_ext::norm_rope", _norm_rope_backward, setup_context=_norm_rope_setup)


# The attention family (csrc/attention_ops.cpp). append_kv mutates its caches (and q):
# no outputs; attention_decode_append (the decode step) mutates its caches too. None
# has a backward (rope_attention's separate path is differentiable).
@torch.library.register_fake("rope_ext::append_kv")
def _append_kv_fake(k, v, k_cache, v_cache, *args):
    return None


@torch.library.register_fake("rope_ext::attention_decode")
def _attention_decode_fake(q, *args):
    B, q_len, Hq, D = q.shape
    return (torch.empty((B, q_len, Hq, D), dtype=q.dtype, device=q.device),
            torch.empty((B, q_len, Hq), dtype=torch.float32, device=q.device))


@torch.library.register_fake("rope_ext::attention_decode_append")
def _attention_decode_append_fake(q, k, v, k_cache, v_cache, *args):
    return _attention_decode_fake(q)
