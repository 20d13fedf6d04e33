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
from .frequencies import inv_freq

WITH_CUDA = bool(_C.with_cuda)

__all__ = ["IMPLS", "LAYOUTS", "WITH_CUDA", "apply_rope", "apply_rope_qk", "rope", "inv_freq", "reference"]
