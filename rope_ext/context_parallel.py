"""Context parallelism: which tokens of a sequence a rank holds, and their global positions.

For causal attention, training frameworks (TransformerEngine, Megatron-Core) cut each
sequence into 2 * cp_size equal chunks and give rank r chunks r and 2 * cp_size - 1 - r,
which balances the causal work. RoPE must rotate every local token by its *global*
position. `apply_rope(..., cp_size=, cp_rank=)` computes that position in the kernel from
the local index (no position tensor); the helpers here return the same positions, and
shard / unshard tensors, for users who need them (and for the tests).

thd (packed sequences): cu_seqlens are the *global* (padded) cumulative lengths, each a
multiple of 2 * cp_size, as TransformerEngine takes them; the local tensor holds
cu_seqlens[-1] / cp_size tokens, sequence n's local part starting at cu_seqlens[n] / cp_size.
"""
import torch


def _check_cp(cp_size, cp_rank):
    for name, v in (("cp_size", cp_size), ("cp_rank", cp_rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"rope_ext: {name} must be an int, got {type(v).__name__}")
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"rope_ext: need cp_size >= 1 and 0 <= cp_rank < cp_size, got {cp_size}, {cp_rank}")


def _lengths(cp_size, seq_len, cu_seqlens):
    if (seq_len is None) == (cu_seqlens is None):
        raise ValueError("rope_ext: give seq_len (bshd/sbhd) or cu_seqlens (thd), exactly one")
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise ValueError("rope_ext: cu_seqlens must be a 1-D int tensor [N + 1]")
        cu = cu_seqlens.detach().to("cpu", torch.int64)
        starts, lens = cu[:-1].tolist(), (cu[1:] - cu[:-1]).tolist()
    else:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
            raise ValueError(f"rope_ext: seq_len must be an int >= 0, got {seq_len!r}")
        starts, lens = [0], [seq_len]
    for n, L in enumerate(lens):
        if L < 0 or L % (2 * cp_size):
            raise ValueError(f"rope_ext: with cp_size = {cp_size} every (global) sequence length must be a "
                             f"multiple of 2 * cp_size = {2 * cp_size}; sequence {n} has {L}")
    return starts, lens


def _local_global(cp_size, cp_rank, L):
    """Global indices (within a sequence of global length L) of this rank's local tokens."""
    c = L // (2 * cp_size)
    first = torch.arange(cp_rank * c, (cp_rank + 1) * c, dtype=torch.int64)
    second = torch.arange((2 * cp_size - 1 - cp_rank) * c, (2 * cp_size - cp_rank) * c, dtype=torch.int64)
    return torch.cat([first, second])


def context_parallel_positions(cp_size, cp_rank, *, seq_len=None, cu_seqlens=None, device=None):
    """int64 global positions of this rank's local tokens.

    seq_len: the global length of each sequence (bshd/sbhd): returns [seq_len / cp_size].
    cu_seqlens: the global (padded) cumulative lengths (thd): returns [T_local], the
      position inside its own sequence of every local packed token.
    """
    _check_cp(cp_size, cp_rank)
    _, lens = _lengths(cp_size, seq_len, cu_seqlens)
    out = torch.cat([_local_global(cp_size, cp_rank, L) for L in lens]) if lens else torch.zeros(0, dtype=torch.int64)
    return out.to(device) if device is not None else out


def context_parallel_index(cp_size, cp_rank, *, seq_len=None, cu_seqlens=None, device=None):
    """int64 indices, into the unsharded sequence dimension (bshd: [seq_len]; thd: the
    packed [cu_seqlens[-1]] tokens), of this rank's local tokens, in local order."""
    _check_cp(cp_size, cp_rank)
    starts, lens = _lengths(cp_size, seq_len, cu_seqlens)
    parts = [s + _local_global(cp_size, cp_rank, L) for s, L in zip(starts, lens)]
    out = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
    return out.to(device) if device is not None else out


def context_parallel_shard(x, cp_size, cp_rank, *, seq_dim=1, cu_seqlens=None):
    """This rank's part of x along seq_dim (bshd: 1, sbhd: 0, thd: 0 with the global cu_seqlens)."""
    L = x.shape[seq_dim]
    idx = context_parallel_index(cp_size, cp_rank, seq_len=None if cu_seqlens is not None else L,
                                 cu_seqlens=cu_seqlens, device=x.device)
    return x.index_select(seq_dim, idx)


def context_parallel_unshard(parts, *, seq_dim=1, cu_seqlens=None):
    """Inverse of context_parallel_shard: parts[r] is rank r's local tensor; returns the
    whole sequence dimension (e.g. after an all_gather of the local outputs)."""
    cp_size = len(parts)
    local = parts[0].shape[seq_dim]
    shape = list(parts[0].shape)
    shape[seq_dim] = local * cp_size
    out = parts[0].new_empty(shape)
    for r, part in enumerate(parts):
        idx = context_parallel_index(cp_size, r, seq_len=None if cu_seqlens is not None else local * cp_size,
                                     cu_seqlens=cu_seqlens, device=part.device)
        out.index_copy_(seq_dim, idx, part)
    return out
