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
    Buffers are non-persistent: nothing enters the state_dict. The frequency buffers
    (inv_freq, cos_sin_cache) stay float32 whatever the module's dtype: .half(),
    .to(torch.bfloat16) or .double() move them with the module but keep their dtype and
    values (as transformers keeps its inv_freq), so the angles never lose precision.
    Length-dependent scaling ("dynamic", "longrope") is refused: the module's call has no
    sequence length to choose the frequencies by; use rope_ext.inv_freq(..., seq_len=...)
    and apply_rope_qk(inv_freq=..., attention_factor=...) for them.
    """

    _FREQ_BUFFERS = ("inv_freq", "cos_sin_cache")

    def __init__(self, head_dim, rotary_dim=None, base=10000.0, scaling=None, interleaved=False, max_position=None):
        super().__init__()
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ValueError(f"rope_ext: RotaryEmbedding: head_dim must be a positive even int, got {head_dim!r}")
        if rotary_dim is not None and (isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int)
                                       or not (0 < rotary_dim <= head_dim) or rotary_dim % 2):
            raise ValueError(f"rope_ext: RotaryEmbedding: rotary_dim must be even and in (0, head_dim = {head_dim}], "
                             f"got {rotary_dim!r}")
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind in ("dynamic", "longrope"):
            raise ValueError(
                f"rope_ext: RotaryEmbedding does not support rope_scaling type '{kind}': its frequencies depend on the "
                "sequence length of each call, which the module does not see. Build them per call with "
                "rope_ext.inv_freq(rotary_dim, base, scaling, seq_len=..., return_attention_factor=True) and pass "
                "inv_freq= and attention_factor= to rope_ext.apply_rope_qk")
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

    def _apply(self, fn, recurse=True):
        # Module.half()/.to(dtype)/.double() cast every floating buffer; the frequency
        # buffers keep float32 (and their exact values): only their device follows.
        kept = {n: self._buffers[n] for n in self._FREQ_BUFFERS if self._buffers.get(n) is not None}
        super()._apply(fn, recurse)
        for n, old in kept.items():
            new = self._buffers[n]
            if new is not None and new.dtype != torch.float32:
                self._buffers[n] = old.to(device=new.device)
        return self

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
