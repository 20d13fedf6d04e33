"""The argument checks and conversions shared by the Python API modules (api.py,
norm_rope.py, attention.py): layouts, positions/offsets, frequency source, context
parallelism, sections, the option list of the rope ops. Private: rope_ext's public
names are re-exported from api.py and the package."""
import torch

from . import _C
from ._ops import OPT_NAMES

#: Kernel variant names (csrc/cuda/rope_variants.cuh); "auto" (the default) picks among them.
IMPLS = tuple(_C.impl_names())
# The layouts, from the one list in csrc/rope_ops.h (kLayouts): name, dims, the permutation
# to the kernels' [B, S, H, D] view (None: bshd, and thd, which takes a leading 1), head dim.
_LAYOUT_TABLE = tuple(_C.layouts())
#: bshd [B, S, H, D]; sbhd [S, B, H, D]; bhsd [B, H, S, D]; thd [T, H, D] (packed sequences).
LAYOUTS = tuple(name for name, *_ in _LAYOUT_TABLE)
_PERM = {name: (tuple(perm) if perm else None) for name, _, perm, _ in _LAYOUT_TABLE}  # each its own inverse
_DIMS = {name: dims for name, dims, _, _ in _LAYOUT_TABLE}
_HEADS = {name: h for name, _, _, h in _LAYOUT_TABLE}  # the head dimension of each layout
_LAYOUT_CODE = {name: i for i, name in enumerate(LAYOUTS)}  # rope_direct's layout argument


DEFAULT_BASE = 10000.0


def _check_layout_rank(x, layout, name):
    """x is a tensor of `layout`'s rank (the checks of _to_bshd, without its view)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"rope_ext: {name} must be a torch.Tensor, got {type(x).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"rope_ext: layout must be one of {LAYOUTS}, got {layout!r}")
    want = 3 if layout == "thd" else 4
    if x.dim() != want:
        raise ValueError(
            f"rope_ext: layout={layout!r} needs {name} of rank {want} {_DIMS[layout]}, got shape {tuple(x.shape)}"
        )


def _to_bshd(x, layout, name):
    _check_layout_rank(x, layout, name)
    return _bshd_view(x, layout)


def _bshd_view(x, layout):
    """x's [B, S, H, D] view (x checked by _check_layout_rank)."""
    if layout == "thd":
        return x.unsqueeze(0)
    perm = _PERM[layout]
    return x if perm is None else x.permute(perm)




def _check_qk_shapes(q, k, layout):
    """q and k agree in every dimension but heads, reported in the caller's layout (the
    C++ op sees the [B, S, H, D] views). rope_direct checks the same in C++."""
    h = _HEADS.get(layout)
    if h is None or not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.dim() != k.dim():
        return
    qs, ks = tuple(q.shape), tuple(k.shape)
    if qs[:h] != ks[:h] or qs[h + 1:] != ks[h + 1:]:
        raise ValueError(f"rope_ext: q and k must agree in every dimension but heads (layout {layout!r} "
                         f"{_DIMS[layout]}), got q {list(qs)} and k {list(ks)}")


def _from_bshd(y, layout):
    if layout == "thd":
        return y.squeeze(0)
    perm = _PERM[layout]
    return y if perm is None else y.permute(perm)


def _int_arg(v, name, lo):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"rope_ext: {name} must be an int, got {type(v).__name__}")
    if v < lo:
        raise ValueError(f"rope_ext: {name} must be >= {lo}, got {v}")
    return v


def _cp_args(cp_size, cp_rank, cp_group):
    """(cp_size, cp_rank) from the ints or a torch.distributed process group."""
    if cp_group is not None:
        import torch.distributed as dist
        if cp_size != 1 or cp_rank != 0:
            raise ValueError("rope_ext: give cp_group or cp_size/cp_rank, not both")
        return dist.get_world_size(cp_group), dist.get_rank(cp_group)
    cp_size, cp_rank = _int_arg(cp_size, "cp_size", 1), _int_arg(cp_rank, "cp_rank", 0)
    if cp_rank >= cp_size:
        raise ValueError(f"rope_ext: cp_rank must be in [0, cp_size = {cp_size}), got {cp_rank}")
    return cp_size, cp_rank


def _sections_arg(sections):
    if sections is None:
        return []
    if isinstance(sections, torch.Tensor):
        sections = sections.tolist()
    try:
        out = [int(v) for v in sections]
    except (TypeError, ValueError):
        raise TypeError(f"rope_ext: sections must be a list of ints, got {sections!r}") from None
    if any(isinstance(v, bool) or int(v) != v for v in sections):
        raise TypeError(f"rope_ext: sections must be a list of ints, got {sections!r}")
    return out


def _offsets_arg(offsets):
    """offsets= as (int offset, tensor offsets or None): an int, or an int tensor [B]."""
    if isinstance(offsets, torch.Tensor):
        return 0, offsets
    if offsets is None:
        return 0, None
    if isinstance(offsets, bool) or not isinstance(offsets, int):
        raise TypeError(f"rope_ext: offsets must be an int or an int tensor [B], got {type(offsets).__name__}")
    return offsets, None


def _factor_arg(attention_factor):
    """attention_factor (multiplies cos and sin) as a float, after the type check."""
    if isinstance(attention_factor, bool) or not isinstance(attention_factor, (int, float)):
        raise TypeError(f"rope_ext: attention_factor must be a number, got {type(attention_factor).__name__}")
    return float(attention_factor)


def _freq_args(base, inv_freq, cos_sin_cache, rotary_dim):
    """(float base, rotary_dim or -1) after the checks shared by every op family."""
    if (inv_freq is not None or cos_sin_cache is not None) and base != DEFAULT_BASE:
        raise ValueError("rope_ext: give one frequency source: base, inv_freq or cos_sin_cache")
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise TypeError(f"rope_ext: base must be a number, got {type(base).__name__}")
    if rotary_dim is None:
        return float(base), -1
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rope_ext: rotary_dim must be an int or None, got {type(rotary_dim).__name__}")
    if rotary_dim <= 0:
        raise ValueError(f"rope_ext: rotary_dim must be even and in (0, head_dim], got {rotary_dim}")
    return float(base), rotary_dim


# The order in which _op_options computes the options; mapped onto the schema's order by
# name (an identity unless csrc/rope_options.h was reordered).
_COMPUTED = ("positions", "offsets", "cu_seqlens", "inv_freq", "cos_sin_cache", "offset", "base", "rotary_dim",
             "interleaved", "inverse", "impl", "scale", "cp_size", "cp_rank", "sections", "sections_interleaved")
if sorted(_COMPUTED) != sorted(OPT_NAMES):
    raise ImportError(f"rope_ext: the compiled rope options {OPT_NAMES} are not the ones rope_ext/_args.py computes "
                      f"{_COMPUTED}: the extension and the Python package are out of step (rebuild)")
# (A plain index tuple, not operator.itemgetter: torch.compile traces _op_options, and
# dynamo with fullgraph=True does not trace through itemgetter objects.)
_TO_SCHEMA = None if _COMPUTED == OPT_NAMES else tuple(_COMPUTED.index(n) for n in OPT_NAMES)


def _to_schema(opts):
    return opts if _TO_SCHEMA is None else [opts[i] for i in _TO_SCHEMA]
_DEFAULTS = dict(positions=None, offsets=None, cu_seqlens=None, inv_freq=None, cos_sin_cache=None, offset=0,
                 base=DEFAULT_BASE, rotary_dim=-1, interleaved=False, inverse=False, impl="auto", scale=1.0, cp_size=1,
                 cp_rank=0, sections=[], sections_interleaved=False)


def op_options(**values):
    """An option list for the rope ops (schema order) from values by name, the rest at
    their defaults: positions 0..S-1, base 10000, the full rotary dim, neox, forward,
    auto. For tests and the bench; no checks."""
    unknown = set(values) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"rope_ext: unknown rope options {sorted(unknown)}; known: {_COMPUTED}")
    opts = [values.get(n, _DEFAULTS[n]) for n in _COMPUTED]
    opts[_COMPUTED.index("sections")] = list(opts[_COMPUTED.index("sections")])
    return _to_schema(opts)


def _op_options(layout, positions, offsets, base, impl, cu_seqlens, rotary_dim, interleaved, inv_freq,
                cos_sin_cache, attention_factor=1.0, cp_size=1, cp_rank=0, cp_group=None, sections=None,
                sections_interleaved=False):
    """The op's trailing arguments (schema order), after the Python-level checks.
    (Eager decode calls pay these checks every step: the common cases take one test
    each; bench/overhead.py has the per-call costs.)"""
    T = torch.Tensor
    if not ((positions is None or isinstance(positions, T)) and (cu_seqlens is None or isinstance(cu_seqlens, T))
            and (inv_freq is None or isinstance(inv_freq, T))
            and (cos_sin_cache is None or isinstance(cos_sin_cache, T))):
        for name, t in (("positions", positions), ("cu_seqlens", cu_seqlens), ("inv_freq", inv_freq),
                        ("cos_sin_cache", cos_sin_cache)):
            if t is not None and not isinstance(t, T):
                raise TypeError(f"rope_ext: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if layout == "thd":
        if positions is None and cu_seqlens is None:
            raise ValueError("rope_ext: layout='thd' needs cu_seqlens (int32 [N+1]) or positions ([T])")
    elif cu_seqlens is not None:
        raise ValueError(f"rope_ext: cu_seqlens needs layout='thd', got layout={layout!r}")
    offset, offsets_t = _offsets_arg(offsets)
    # A base other than the default next to inv_freq / cos_sin_cache is a conflict. (A
    # plain float default keeps this traceable by torch.compile; an explicit
    # base=10000.0 beside another source cannot be told apart and is simply unused.)
    base, rotary_dim = _freq_args(base, inv_freq, cos_sin_cache, rotary_dim)
    if not isinstance(impl, str):
        raise TypeError(f"rope_ext: impl must be a str (one of 'auto', {', '.join(map(repr, IMPLS))}), got {type(impl).__name__}")
    attention_factor = _factor_arg(attention_factor)
    if not (cp_group is None and type(cp_size) is int and type(cp_rank) is int and cp_size == 1 and cp_rank == 0):
        cp_size, cp_rank = _cp_args(cp_size, cp_rank, cp_group)
    opts = [positions, offsets_t, cu_seqlens, inv_freq, cos_sin_cache, offset, float(base), rotary_dim,
            bool(interleaved), False, impl, attention_factor, cp_size, cp_rank,
            [] if sections is None else _sections_arg(sections), bool(sections_interleaved)]
    return _to_schema(opts)


def _check_inplace(t, name):
    """In place on a leaf that requires grad, or on a view of one (param[:, :2]), would
    overwrite a value autograd needs (and autograd says so only after the kernel wrote)."""
    # (torch.compile cannot trace _is_view; there functionalization refuses such a write
    # while it traces, before anything runs.)
    base = t._base if not _is_compiling() and t._is_view() else None
    of_leaf = base is not None and base.is_leaf and base.requires_grad
    if (t.is_leaf and t.requires_grad) or of_leaf:
        what = "a view of a leaf tensor that requires grad" if of_leaf else "a leaf tensor that requires grad"
        raise ValueError(
            f"rope_ext: inplace=True on {name}, {what}, would overwrite a value "
            "autograd needs; use inplace=False or rotate a non-leaf (e.g. the output of a projection)"
        )


_function_mode_on = torch._C._is_torch_function_mode_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_is_compiling = torch.compiler.is_compiling
_functorch_on = torch._C._are_functorch_transforms_active  # vmap/grad wrap tensors that rope_direct cannot read
_is_tracing = torch._C._is_tracing  # torch.jit.trace records only what goes through the dispatcher


def _ops_intercepted():
    """Whether something must see the ops (torch.compile, a TorchFunction / TorchDispatch
    mode, a functorch transform, torch.jit.trace): then the eager entries without the
    dispatcher (rope_ext._C.*_direct) are not taken."""
    return _is_compiling() or _function_mode_on() or _dispatch_modes() or _functorch_on() or _is_tracing()


def _raw(t):
    """t's memory is what it holds: a plain tensor without the negative bit (a lazily
    negated view, e.g. z.conj().imag). The eager entries read raw memory; such views take
    the ops, whose fallback resolves the bit. (Quantized tensors reach the entries and get
    their dtype's TypeError there.)"""
    return type(t) is torch.Tensor and not t.is_neg()
