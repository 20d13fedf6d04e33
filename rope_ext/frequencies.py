"""Inverse frequencies for RoPE, bit-identical to the ones checkpoints were trained with.

HF transformers, vLLM and TransformerEngine all compute the default frequencies in
float32 as `1.0 / (base ** (torch.arange(0, R, 2).float() / R))`. That differs from the
correctly rounded base^(-2i/R) by 1-2 ulp in about a third of the entries, and a
frequency one ulp off gives an angle error that grows with the position; so the float32
formula, evaluated by torch on the CPU exactly as HF writes it, is the truth rope_ext
uses everywhere: `rope_ext.inv_freq`, the kernels' `base` path (csrc/rope_ops.cpp builds
the same table with the same ATen ops on the host) and the float64 references.

The scaled variants transcribe transformers' `modeling_rope_utils` rope init functions
line by line (same operations, same order, same dtypes), so `torch.equal` holds against
them; tests/test_frequencies.py checks both a second transcription and, where
transformers is installed, its real functions.
"""
import math

import torch


def _arange_f32(R):
    # HF: torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    return torch.arange(0, R, 2, dtype=torch.int64).to(dtype=torch.float) / R


def default_inv_freq(R, base):
    """HF's default frequencies, float32 [R/2], on the CPU."""
    return 1.0 / (base ** _arange_f32(R))


def _correctly_rounded(R, base):
    return (base ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)).to(torch.float32)


def _yarn_get_mscale(scale, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def inv_freq(rotary_dim, base=10000.0, scaling=None, *, seq_len=None, max_position_embeddings=None,
             return_attention_factor=False, device=None, correctly_rounded=False):
    """float32 [rotary_dim // 2] inverse frequencies, bit-identical to transformers'.

    rotary_dim: R = int(head_dim * partial_rotary_factor), even.
    base: rope_theta.
    scaling: None, or an HF-style `rope_scaling` / `rope_parameters` dict whose "rope_type"
      (or "type") is "default", "linear" (factor), "dynamic" (factor; needs
      max_position_embeddings; seq_len), "yarn" (factor, original_max_position_embeddings,
      beta_fast=32, beta_slow=1, mscale, mscale_all_dim, attention_factor, truncate=True),
      "llama3" (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
      or "longrope" (long_factor, short_factor, original_max_position_embeddings, factor,
      attention_factor; seq_len > original picks long_factor).
    return_attention_factor: also return the factor the variant multiplies cos/sin by
      (yarn's mscale, longrope's; 1.0 otherwise), as (inv_freq, attention_factor).
    correctly_rounded: default frequencies as fp32(base^(-2i/R)) evaluated in float64
      instead of HF's float32 formula (opt-in: no checkpoint was trained with them).
    Computed on the CPU (as HF does at init), then moved to `device`.
    """
    R = rotary_dim
    if isinstance(R, bool) or not isinstance(R, int) or R <= 0 or R % 2:
        raise ValueError(f"rope_ext: rotary_dim must be a positive even int, got {rotary_dim!r}")
    if isinstance(base, bool) or not (isinstance(base, (int, float)) and base > 0 and math.isfinite(base)):
        raise ValueError(f"rope_ext: base must be a positive finite number, got {base!r}")
    sc = dict(scaling or {})
    kind = sc.get("rope_type", sc.get("type", "default"))
    max_pos = max_position_embeddings or sc.get("max_position_embeddings")
    attention_factor = 1.0

    def need(key):
        if key not in sc or sc[key] is None:
            raise ValueError(f"rope_ext: rope_scaling of type {kind!r} needs {key!r}")
        return sc[key]

    if correctly_rounded and kind != "default":
        raise ValueError("rope_ext: correctly_rounded=True applies to the default frequencies only")
    if kind == "default":
        f = _correctly_rounded(R, base) if correctly_rounded else default_inv_freq(R, base)
    elif kind == "linear":
        factor = need("factor")
        f = default_inv_freq(R, base)
        f /= factor
    elif kind == "dynamic":
        factor = need("factor")
        if max_pos is None:
            raise ValueError("rope_ext: rope_scaling 'dynamic' needs max_position_embeddings")
        L = max_pos if seq_len is None else max(seq_len, max_pos)
        b = base * ((factor * L / max_pos) - (factor - 1)) ** (R / (R - 2))
        f = 1.0 / (b ** _arange_f32(R))
    elif kind == "yarn":
        f, attention_factor = _yarn(R, base, sc, max_pos)
    elif kind == "llama3":
        factor, low_freq_factor = need("factor"), need("low_freq_factor")
        high_freq_factor, old_context_len = need("high_freq_factor"), need("original_max_position_embeddings")
        inv = default_inv_freq(R, base)
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv
        inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth_factor) * inv_llama / factor + smooth_factor * inv_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        f = torch.where(is_medium, smoothed, inv_llama)
    elif kind == "longrope":
        long_factor, short_factor = need("long_factor"), need("short_factor")
        orig = need("original_max_position_embeddings")
        factor = sc.get("factor")
        if factor is None:
            if max_pos is None:
                raise ValueError("rope_ext: rope_scaling 'longrope' without 'factor' needs max_position_embeddings")
            factor = max_pos / orig
        attention_factor = sc.get("attention_factor")
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        chosen = long_factor if (seq_len and seq_len > orig) else short_factor
        if len(chosen) != R // 2:
            raise ValueError(f"rope_ext: longrope factors must have rotary_dim/2 = {R // 2} entries, got {len(chosen)}")
        ext_factors = torch.tensor(chosen, dtype=torch.float32)
        shape = torch.arange(0, R, 2, dtype=torch.int64).float() / R
        f = 1.0 / (ext_factors * base**shape)
    else:
        raise ValueError(
            f"rope_ext: unknown rope_scaling type {kind!r}; expected default, linear, dynamic, yarn, llama3 or longrope"
        )
    if device is not None:
        f = f.to(device)
    return (f, float(attention_factor)) if return_attention_factor else f


def _yarn(R, base, sc, max_pos):
    """HF's _compute_yarn_parameters, same operations in the same order."""
    factor = sc.get("factor")
    orig = sc.get("original_max_position_embeddings")
    if orig is None:
        raise ValueError("rope_ext: rope_scaling 'yarn' needs 'original_max_position_embeddings'")
    if factor is None:
        if max_pos is None:
            raise ValueError("rope_ext: rope_scaling 'yarn' needs 'factor' (or max_position_embeddings)")
        factor = max_pos / orig
    attention_factor = sc.get("attention_factor")
    mscale, mscale_all_dim = sc.get("mscale"), sc.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(_yarn_get_mscale(factor, mscale) / _yarn_get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _yarn_get_mscale(factor)
    beta_fast = sc.get("beta_fast") or 32
    beta_slow = sc.get("beta_slow") or 1

    def correction_dim(num_rotations):
        return (R * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, R - 1)
    if low == high:
        high += 0.001  # HF: prevent a singularity
    ramp = torch.clamp((torch.arange(R // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, R, 2).to(dtype=torch.float) / R)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp.to(dtype=torch.float)
    f = inv_freq_interpolation * (1 - extrapolation_factor) + inv_freq_extrapolation * extrapolation_factor
    return f, attention_factor
