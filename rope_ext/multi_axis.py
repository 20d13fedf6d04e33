"""RoPE with several position axes, in the same kernels as apply_rope (one launch, q and k,
forward and backward): each rotation pair takes its position from one axis.

apply_mrope        Multimodal RoPE (Qwen2-VL, Qwen2.5-VL: contiguous mrope_section;
                   Qwen3-VL: interleaved). positions [3, B, S] (temporal, height, width);
                   one frequency set over the whole rotary dim.
apply_rope_axial   2-D (or N-D) axial RoPE for vision transformers and diffusion models:
                   positions [..., A] (row, column, ...), the rotary dims split between
                   the axes, each axis with its own frequencies over its own dims
                   (Qwen2-VL's vision tower, FLUX's EmbedND); any other assignment can
                   be given as inv_freq in pair order.
"""
import torch

from .api import DEFAULT_BASE, apply_rope, apply_rope_qk
from .frequencies import inv_freq as _inv_freq


def _check_sections(sections, name, R=None):
    if isinstance(sections, torch.Tensor):
        sections = sections.tolist()
    if not isinstance(sections, (list, tuple)) or not sections or \
            any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in sections):
        raise ValueError(f"rope_ext: {name} must be a non-empty list of ints >= 0, got {sections!r}")
    if R is not None and sum(sections) != R // 2:
        raise ValueError(f"rope_ext: {name} must sum to rotary_dim / 2 = {R // 2}, got {list(sections)} "
                         f"(sum {sum(sections)})")
    return list(sections)


def apply_mrope(q, k, positions, mrope_section, *, interleaved_sections=False, layout="bshd", base=DEFAULT_BASE,
                inv_freq=None, rotary_dim=None, interleaved=False, attention_factor=1.0, inplace=False, impl="auto"):
    """M-RoPE of q and k in one launch; returns (q_out, k_out).

    positions: int [3, B, S] or [3, S] ([3, T] for thd): temporal, height and width
      position of every token (text tokens have all three equal).
    mrope_section: pairs per axis, summing to rotary_dim / 2 (Qwen2-VL: [16, 24, 24]).
    interleaved_sections: Qwen3-VL's layout ("mrope_interleaved"): pair i takes height
      when i % 3 == 1 and i < 3 * section[1], width when i % 3 == 2 and i < 3 * section[2],
      else temporal. Otherwise each axis owns its consecutive pairs.
    Other keywords as apply_rope_qk; frequencies are the usual set over rotary_dim.
    """
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"rope_ext: positions must be a torch.Tensor [3, B, S] or [3, S], got {type(positions).__name__}")
    sections = _check_sections(mrope_section, "mrope_section")
    if positions.dim() not in (2, 3) or positions.shape[0] != len(sections):
        raise ValueError(f"rope_ext: M-RoPE positions must have shape [{len(sections)}, B, S] or [{len(sections)}, S] "
                         f"(one row per mrope_section entry), got {tuple(positions.shape)}")
    return apply_rope_qk(q, k, positions, layout=layout, base=base, inv_freq=inv_freq, rotary_dim=rotary_dim,
                         interleaved=interleaved, attention_factor=attention_factor, inplace=inplace, impl=impl,
                         sections=sections, sections_interleaved=interleaved_sections)


def axial_inv_freq(axes_dims, base=DEFAULT_BASE, device=None):
    """float32 [sum(axes_dims) / 2]: each axis's own frequencies over its own rotary dims
    (rope_ext.inv_freq(axes_dims[a], base)), concatenated in pair order."""
    dims = list(axes_dims)
    return torch.cat([_inv_freq(d, base) for d in dims]).to(device) if device is not None else \
        torch.cat([_inv_freq(d, base) for d in dims])


_AXIAL_FREQS = {}


def _cached_axial_inv_freq(axes_dims, base, device):
    """The default frequencies, built once per (axes, base, device): a host build and
    copy per call would cost a synchronous transfer and break CUDA-graph capture."""
    key = (axes_dims, base, str(device))
    f = _AXIAL_FREQS.get(key)
    if f is None:
        f = _AXIAL_FREQS[key] = axial_inv_freq(list(axes_dims), base, device)
    return f


def _axial(xs, positions, axes_dims, base, inv_freq, layout, interleaved, inplace, impl):
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"rope_ext: positions must be a torch.Tensor [..., axes], got {type(positions).__name__}")
    x = xs[0]
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"rope_ext: x must be a torch.Tensor, got {type(x).__name__}")
    D = x.shape[-1]
    A = positions.shape[-1] if positions.dim() >= 2 else 0
    if positions.dim() not in (2, 3) or A < 1:
        raise ValueError("rope_ext: axial positions must have shape [T, axes] / [S, axes] or [B, S, axes] "
                         f"(the last dimension indexes the axes), got {tuple(positions.shape)}")
    if axes_dims is None:
        if D % (2 * A):
            raise ValueError(f"rope_ext: head dim {D} does not split evenly into {A} axes of even size; give axes_dims")
        axes_dims = [D // A] * A
    axes_dims = list(axes_dims)
    if len(axes_dims) != A or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 or d % 2 for d in axes_dims):
        raise ValueError(f"rope_ext: axes_dims must list one positive even rotary dim per axis ({A} axes), got {axes_dims}")
    R = sum(axes_dims)
    if R > D:
        raise ValueError(f"rope_ext: axes_dims sum to {R}, more than the head dim {D}")
    if inv_freq is None:
        inv_freq = _cached_axial_inv_freq(tuple(axes_dims), float(base), x.device)
    elif base != DEFAULT_BASE:
        raise ValueError("rope_ext: give one frequency source: base or inv_freq")
    kw = dict(layout=layout, inv_freq=inv_freq, rotary_dim=R, interleaved=interleaved, inplace=inplace, impl=impl,
              sections=[d // 2 for d in axes_dims])
    pos = positions.movedim(-1, 0)  # [A, ...]: a strided view, no copy
    return apply_rope(xs[0], pos, **kw) if len(xs) == 1 else apply_rope_qk(xs[0], xs[1], pos, **kw)


def apply_rope_axial(x, positions, *, axes_dims=None, base=DEFAULT_BASE, inv_freq=None, layout="bshd",
                     interleaved=False, inplace=False, impl="auto"):
    """Axial RoPE of x: positions [B, S, A] or [S, A] ([T, A] for thd), e.g. A = 2
    (row, column). axes_dims: rotary dims per axis (even; default head_dim / A each);
    features past their sum pass through. Pair j of axis a rotates by
    positions[..., a] * inv_freq(axes_dims[a], base)[j]; inv_freq= overrides the
    frequencies ([sum(axes_dims) / 2], in pair order). interleaved: GPT-J pairs (FLUX).
    Other keywords as apply_rope; differentiable with respect to x."""
    return _axial((x,), positions, axes_dims, base, inv_freq, layout, interleaved, inplace, impl)


def apply_rope_axial_qk(q, k, positions, *, axes_dims=None, base=DEFAULT_BASE, inv_freq=None, layout="bshd",
                        interleaved=False, inplace=False, impl="auto"):
    """apply_rope_axial of q and k in one launch; returns (q_out, k_out)."""
    return _axial((q, k), positions, axes_dims, base, inv_freq, layout, interleaved, inplace, impl)
