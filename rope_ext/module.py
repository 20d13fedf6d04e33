"""rope_ext.RotaryEmbedding: an nn.Module over apply_rope_qk."""
import torch

from .api import apply_rope_qk
from .frequencies import inv_freq as _inv_freq


class RotaryEmbedding(torch.nn.Module):
    """Rotates q and k in one launch.

    head_dim: D. rotary_dim: R (default D). base, scaling: the frequencies (scaling is an
    HF-style rope_scaling dict, see rope_ext.inv_freq). interleaved: GPT-J pairs.
    max_position: if given, a [max_position, R] fp32 cos/sin cache is built once (from
    exact float64 angles, with the variant's attention factor folded in) and read by
    the kernel; otherwise sin/cos are computed in the kernel, times the variant's
    attention factor (yarn, longrope).
    Buffers are non-persistent: nothing enters the state_dict.
    """

    def __init__(self, head_dim, rotary_dim=None, base=10000.0, scaling=None, interleaved=False, max_position=None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim or head_dim
        self.base = float(base)
        self.interleaved = interleaved
        self.scaling = dict(scaling) if scaling else None
        f, att = _inv_freq(self.rotary_dim, base, scaling, return_attention_factor=True)
        self.attention_factor = att
        self.register_buffer("inv_freq", f, persistent=False)
        if max_position is not None:
            ang = torch.arange(max_position, dtype=torch.float64)[:, None] * f.double()
            cache = torch.cat([ang.cos(), ang.sin()], dim=-1) * att
            self.register_buffer("cos_sin_cache", cache.float(), persistent=False)
        else:
            self.cos_sin_cache = None
        # The default frequencies are computed in the kernel from `base`; scaled ones are read.
        self._default_freqs = not scaling or scaling.get("rope_type", scaling.get("type", "default")) == "default"

    def forward(self, q, k, positions=None, layout="bshd", cu_seqlens=None, offsets=None,
                cp_size=1, cp_rank=0, cp_group=None):
        """Rotates (q, k) -> (q_out, k_out). cp_size/cp_rank (or cp_group): q and k are this
        rank's context-parallel shard and tokens rotate by their global positions (see
        rope_ext.apply_rope)."""
        kw = dict(layout=layout, cu_seqlens=cu_seqlens, offsets=offsets, rotary_dim=self.rotary_dim,
                  interleaved=self.interleaved, cp_size=cp_size, cp_rank=cp_rank, cp_group=cp_group)
        if self.cos_sin_cache is not None:
            kw["cos_sin_cache"] = self.cos_sin_cache
        else:
            kw["attention_factor"] = self.attention_factor
            if self._default_freqs:
                kw["base"] = self.base  # the same float32 table as self.inv_freq, held by the kernel's params
            else:
                kw["inv_freq"] = self.inv_freq
        return apply_rope_qk(q, k, positions, **kw)

    def extra_repr(self):
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"interleaved={self.interleaved}, scaling={self.scaling}, "
                f"cache={None if self.cos_sin_cache is None else tuple(self.cos_sin_cache.shape)}")
