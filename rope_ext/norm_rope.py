"""Per-head RMSNorm fused with RoPE (the q/k norms of Qwen3 and Gemma 3).

    y = rope(x / sqrt(mean(x^2 over the head dim) + eps) * (weight + weight_offset))

Qwen3: weight_offset = 0; Gemma 3 (whose RMSNorm scales by 1 + weight): weight_offset = 1.
fp32 arithmetic, one rounding at the end. Differentiable with respect to x and weight.

(Interim implementation: the normalisation in PyTorch followed by the rope kernel; the
fused kernel replaces it behind the same API.)
"""
import torch

from .api import DEFAULT_BASE, apply_rope, apply_rope_qk


def _norm(x, weight, eps, weight_offset, name):
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"rope_ext: {name} must be a torch.Tensor [head_dim], got {type(weight).__name__}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"rope_ext: {name} must have shape [head_dim] = [{x.shape[-1]}], got {tuple(weight.shape)}")
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y * (weight.float() + weight_offset)


def rms_norm_rope(x, weight, positions=None, *, eps=1e-6, weight_offset=0.0, layout="bshd", base=DEFAULT_BASE,
                  **rope_kwargs):
    """RMSNorm over the head dim of x (weight [D]) then RoPE; returns a tensor like x.
    Same layouts and RoPE keywords as rope_ext.apply_rope (not inplace)."""
    y = _norm(x, weight, eps, weight_offset, "weight")
    return apply_rope(y, positions, layout=layout, base=base, **rope_kwargs).to(x.dtype)


def rms_norm_rope_qk(q, k, q_weight, k_weight, positions=None, *, eps=1e-6, weight_offset=0.0, layout="bshd",
                     base=DEFAULT_BASE, **rope_kwargs):
    """rms_norm_rope of q (q_weight) and k (k_weight), one launch; returns (q_out, k_out)."""
    qn = _norm(q, q_weight, eps, weight_offset, "q_weight")
    kn = _norm(k, k_weight, eps, weight_offset, "k_weight")
    qo, ko = apply_rope_qk(qn, kn, positions, layout=layout, base=base, **rope_kwargs)
    return qo.to(q.dtype), ko.to(k.dtype)
