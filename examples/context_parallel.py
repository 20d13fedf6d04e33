"""Context parallelism: a causal self-attention layer whose sequence is split over ranks,
with rope_ext rotating each rank's shard by GLOBAL positions.

    torchrun --nproc_per_node=2 examples/context_parallel.py   # gloo on CPU; NCCL, one GPU per rank, if there are GPUs
    python3 examples/context_parallel.py                        # a single process: cp_size = 1

Each rank holds TransformerEngine's load-balanced shard of every sequence: of 2*cp_size
equal chunks, chunks cp_rank and 2*cp_size-1-cp_rank. apply_rope_qk(..., cp_group=)
computes every local token's global position in the kernel (no position tensor). The
attention here is the simple correct one: all-gather K and V, mask by global positions.
Production CP uses ring attention (K/V blocks passed around the ranks, never the whole
sequence on one rank); the point here is RoPE with global positions. The sharded output
is all-gathered and compared with the unsharded layer, computed on every rank.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import rope_ext

B, CHUNK, DIM, HEADS, KV_HEADS, HEAD_DIM = 2, 16, 128, 4, 2, 32  # global length S = 2 * cp_size * CHUNK
TOL = 1e-5  # max |error| / max |output|; the masked and the is_causal attention differ in rounding only


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads, head_dim, base=10000.0):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.base = heads, kv_heads, head_dim, base
        self.q_proj = torch.nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = torch.nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = torch.nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x, cp_group=None):
        """x [B, S_local, dim]: this rank's shard of each sequence (with cp_group), else the
        whole sequence."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim)
        # q and k in one launch, each token rotated by its global position. (Once
        # RotaryEmbedding.forward takes cp_group: rope_ext.RotaryEmbedding(head_dim)(q, k, cp_group=cp_group).)
        q, k = rope_ext.apply_rope_qk(q, k, layout="bshd", base=self.base, cp_group=cp_group)
        if cp_group is None:  # the unsharded reference: PyTorch's own causal mask
            out = _sdpa(q, k, v, is_causal=True)
        else:
            cp_size, cp_rank = dist.get_world_size(cp_group), dist.get_rank(cp_group)
            k, v = _gather_sequence(k, cp_group), _gather_sequence(v, cp_group)  # [B, S_global, Hk, D]
            # Causal by GLOBAL position: local query at position p sees the keys at positions <= p.
            q_pos = rope_ext.context_parallel_positions(cp_size, cp_rank, seq_len=k.shape[1], device=x.device)
            k_pos = torch.arange(k.shape[1], device=x.device)
            out = _sdpa(q, k, v, attn_mask=k_pos[None, :] <= q_pos[:, None])
        return self.o_proj(out.reshape(b, s, -1))


def _sdpa(q, k, v, **kw):
    """[B, S, H, D] in and out; kv heads repeated for GQA."""
    rep = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)))
    return F.scaled_dot_product_attention(q, k, v, **kw).transpose(1, 2)


def _gather_sequence(t, group):
    """All ranks' shards of t [B, S_local, ...] -> the whole sequences, in unsharded order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return rope_ext.context_parallel_unshard(parts, seq_dim=1)


def main():
    launched = "RANK" in os.environ  # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = rope_ext.WITH_CUDA and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if launched:
        dist.init_process_group(backend)
    else:  # one process: a group of one, so the sharded code path runs as well (cp_size = 1)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    cp_size, cp_rank = dist.get_world_size(group), dist.get_rank(group)
    S = 2 * cp_size * CHUNK  # CP needs each sequence length a multiple of 2 * cp_size

    # The same weights and inputs on every rank (seeded on the CPU, then moved).
    torch.manual_seed(0)
    layer = CausalSelfAttention(DIM, HEADS, KV_HEADS, HEAD_DIM).to(device)
    x = torch.randn(B, S, DIM).to(device)

    with torch.no_grad():  # (all_gather has no autograd; training would use ring attention)
        x_local = rope_ext.context_parallel_shard(x, cp_size, cp_rank, seq_dim=1)  # [B, S / cp_size, DIM]
        y_local = layer(x_local, cp_group=group)
        y = _gather_sequence(y_local, group)  # [B, S, DIM], unsharded order
        ref = layer(x)  # the unsharded layer, on this rank alone
    err = ((y - ref).abs().max() / ref.abs().max()).reshape(1)
    dist.all_reduce(err, op=dist.ReduceOp.MAX, group=group)  # every rank agrees on the verdict
    ok = err.item() <= TOL
    if cp_rank == 0:
        print(f"cp_size={cp_size} backend={backend} device={device.type}: local x {tuple(x_local.shape)} "
              f"of {tuple(x.shape)}")
        for r in range(cp_size):
            pos = rope_ext.context_parallel_positions(cp_size, r, seq_len=S).tolist()
            h = len(pos) // 2
            print(f"  rank {r} holds global positions {pos[0]}..{pos[h - 1]} and {pos[h]}..{pos[-1]}")
        print(f"max |sharded - unsharded| / max |unsharded| = {err.item():.3e} (tolerance {TOL:g})")
        print("OK" if ok else "MISMATCH")
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
