"""Inverse frequencies for RoPE, with the HF transformers `rope_scaling` variants.

rope_ext defines the default frequencies as inv_freq[i] = fp32(base^(-2i/R)), evaluated
in float64 and rounded once: the CUDA and CPU kernels compute exactly these values
on the device (csrc/rope_math.h, base_inv_freq), so an angle pos * inv_freq[i] is the
same number everywhere. Scaled variants follow HF's definitions (computed in float64,
returned as float32) and are passed to the kernels as `inv_freq=`.
"""
import math

import torch


def _default(R, base):
    return base ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)


def _yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def inv_freq(rotary_dim, base=10000.0, scaling=None, *, seq_len=None, max_position_embeddings=None,
             return_attention_factor=False, device=None):
    """float32 [rotary_dim // 2] inverse frequencies.

    scaling: None, or an HF-style `rope_scaling` dict whose "rope_type" (or "type") is
      "default", "linear" (factor), "dynamic" (factor; max_position_embeddings; seq_len),
      "yarn" (factor, original_max_position_embeddings, beta_fast=32, beta_slow=1,
      mscale, mscale_all_dim, attention_factor, truncate=True), "llama3" (factor,
      low_freq_factor, high_freq_factor, original_max_position_embeddings) or
      "longrope" (long_factor, short_factor, original_max_position_embeddings, factor,
      attention_factor; seq_len picks long_factor past the original length).
    return_attention_factor: also return the factor the variant applies to cos/sin
      (yarn's mscale, longrope's; 1.0 otherwise) as (inv_freq, attention_factor).
    """
    R = rotary_dim
    if isinstance(R, bool) or not isinstance(R, int) or R <= 0 or R % 2:
        raise ValueError(f"rope_ext: rotary_dim must be a positive even int, got {rotary_dim!r}")
    if not (isinstance(base, (int, float)) and base > 0 and math.isfinite(base)):
        raise ValueError(f"rope_ext: base must be a positive finite number, got {base!r}")
    sc = dict(scaling or {})
    kind = sc.get("rope_type", sc.get("type", "default"))
    max_pos = max_position_embeddings or sc.get("max_position_embeddings")
    attention = 1.0

    def need(key):
        if key not in sc or sc[key] is None:
            raise ValueError(f"rope_ext: rope_scaling of type {kind!r} needs {key!r}")
        return sc[key]

    if kind == "default":
        f = _default(R, base)
    elif kind == "linear":
        f = _default(R, base) / need("factor")
    elif kind == "dynamic":
        factor = need("factor")
        if max_pos is None:
            raise ValueError("rope_ext: rope_scaling 'dynamic' needs max_position_embeddings")
        L = max(seq_len or max_pos, max_pos)
        b = base * ((factor * L / max_pos) - (factor - 1)) ** (R / (R - 2))
        f = _default(R, b)
    elif kind == "yarn":
        factor = need("factor")
        orig = sc.get("original_max_position_embeddings") or max_pos
        if orig is None:
            raise ValueError("rope_ext: rope_scaling 'yarn' needs original_max_position_embeddings")
        attention = sc.get("attention_factor")
        if attention is None:
            m, m_all = sc.get("mscale"), sc.get("mscale_all_dim")
            attention = (_yarn_mscale(factor, m) / _yarn_mscale(factor, m_all)) if (m and m_all) else _yarn_mscale(factor)
        beta_fast, beta_slow = sc.get("beta_fast") or 32, sc.get("beta_slow") or 1

        def corr_dim(rot):
            return (R * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if sc.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, R - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(R // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extrap = 1 - ramp  # 1: keep the original frequency; 0: interpolate (divide by factor)
        pos_freqs = base ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
        f = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
    elif kind == "llama3":
        factor, lo_f, hi_f = need("factor"), need("low_freq_factor"), need("high_freq_factor")
        old = need("original_max_position_embeddings")
        f0 = _default(R, base)
        wavelen = 2 * math.pi / f0
        lo_wl, hi_wl = old / lo_f, old / hi_f
        scaled = torch.where(wavelen > lo_wl, f0 / factor, f0)
        smooth = (old / wavelen - lo_f) / (hi_f - lo_f)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= hi_wl) & (wavelen <= lo_wl)
        f = torch.where(medium, smoothed, scaled)
    elif kind == "longrope":
        long_f, short_f = need("long_factor"), need("short_factor")
        orig = sc.get("original_max_position_embeddings")
        if orig is None:
            raise ValueError("rope_ext: rope_scaling 'longrope' needs original_max_position_embeddings")
        factor = sc.get("factor")
        if factor is None:
            factor = (max_pos / orig) if max_pos else 1.0
        attention = sc.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = long_f if (seq_len is not None and seq_len > orig) else short_f
        if len(ext) != R // 2:
            raise ValueError(f"rope_ext: longrope factors must have rotary_dim/2 = {R // 2} entries, got {len(ext)}")
        f = 1.0 / (torch.tensor(ext, dtype=torch.float64) * base ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    else:
        raise ValueError(
            f"rope_ext: unknown rope_scaling type {kind!r}; expected default, linear, dynamic, yarn, llama3 or longrope"
        )
    out = f.to(torch.float32)
    if device is not None:
        out = out.to(device)
    return (out, float(attention)) if return_attention_factor else out
