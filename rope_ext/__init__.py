"""rope_ext: Rotary Position Embedding kernels for PyTorch (CUDA and CPU).

    import rope_ext
    q = rope_ext.apply_rope(q, layout="bshd")          # [B, S, H, D], positions 0..S-1
    q, k = rope_ext.apply_rope_qk(q, k, positions)     # q and k in one launch

See README.md for every option, the conventions of other libraries and the numbers.
"""
from . import _ops  # noqa: F401  (registers fake/autograd for torch.ops.rope_ext)
from . import _C
from . import reference
from .api import IMPLS, LAYOUTS, apply_rope, apply_rope_qk, rope
from .attention import append_kv, append_mla, attention_decode, rope_attention
from .context_parallel import (context_parallel_index, context_parallel_positions, context_parallel_shard,
                               context_parallel_unshard)
from .frequencies import inv_freq
from .module import RotaryEmbedding
from .multi_axis import apply_mrope, apply_rope_axial, apply_rope_axial_qk, axial_inv_freq
from .norm_rope import NORM_ROPE_IMPLS, rms_norm_rope, rms_norm_rope_qk

WITH_CUDA = bool(_C.with_cuda)


def set_value_checks(enabled: bool) -> None:
    """Also check index *values* of CUDA tensors (positions >= 0 and < cos_sin_cache rows,
    offsets >= 0, cu_seqlens monotone from 0 to T), as is always done for CPU tensors.
    Off by default: it copies the indices to the host, a synchronization that costs
    time and is not allowed inside CUDA-graph capture. Without it, the kernels still
    never read out of bounds (a cache position out of range gives NaN rows)."""
    _C.set_value_checks(bool(enabled))

__all__ = ["IMPLS", "LAYOUTS", "WITH_CUDA", "RotaryEmbedding", "apply_rope", "apply_rope_qk", "rope", "inv_freq",
           "reference", "set_value_checks", "apply_mrope", "apply_rope_axial", "apply_rope_axial_qk", "axial_inv_freq",
           "context_parallel_positions", "context_parallel_index", "context_parallel_shard",
           "context_parallel_unshard", "rms_norm_rope", "rms_norm_rope_qk", "NORM_ROPE_IMPLS", "append_kv", "append_mla",
           "attention_decode", "rope_attention"]
