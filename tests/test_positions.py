"""Positions computed in the kernel: context parallelism (global positions of a
load-balanced shard), multi-axis positions (M-RoPE contiguous and interleaved, axial
2-D), and the attention factor. CPU always, CUDA where there is a GPU, every variant,
forward and backward against float64 truths written independently of the kernels."""
import pytest
import torch

import rope_ext
from rope_ext import reference as ref
from conftest import IMPLS, assert_close_f64, randn

D = 64


def _rotate64(x, ang, R, factor=1.0):
    """float64 neox rotation of x [..., D] by angles [..., R/2] (broadcast over heads)."""
    x = x.double()
    c, s = ang.cos() * factor, ang.sin() * factor
    x0, x1 = x[..., : R // 2], x[..., R // 2:R]
    return torch.cat([x0 * c - x1 * s, x1 * c + x0 * s, x[..., R:]], -1)


# ---------------------------------------------------------------------------- context parallel
CP_CU = {2: [0, 8, 8, 32, 44], 3: [0, 12, 12, 36, 42]}  # global lengths: multiples of 2 * cp_size


def _cp_case(layout, cp, rank, device, dtype):
    """(full x, local x, kwargs for the local call, shard function) for one rank."""
    if layout == "thd":
        cu = torch.tensor(CP_CU[cp], dtype=torch.int32, device=device)
        full = randn((CP_CU[cp][-1], 3, D), dtype, device)
        kw = dict(layout="thd", cu_seqlens=cu)
        shard = lambda t: rope_ext.context_parallel_shard(t, cp, rank, seq_dim=0, cu_seqlens=cu)  # noqa: E731
    else:
        S = 12 * cp
        shape = (2, S, 3, D) if layout == "bshd" else (S, 2, 3, D)
        full = randn(shape, dtype, device)
        kw = dict(layout=layout)
        seq_dim = 1 if layout == "bshd" else 0
        shard = lambda t: rope_ext.context_parallel_shard(t, cp, rank, seq_dim=seq_dim)  # noqa: E731
    return full, shard(full), kw, shard


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "thd"])
@pytest.mark.parametrize("cp", [2, 3])
def test_context_parallel_matches_unsharded(device, impl, layout, cp):
    """Each rank's output is its shard of the unsharded output (forward and backward),
    and equals float64 at the global positions of context_parallel_positions."""
    for rank in range(cp):
        full, local, kw, shard = _cp_case(layout, cp, rank, device, torch.float32)
        want_full = ref.rope_float64(full, **kw)
        out = rope_ext.apply_rope(local, impl=impl, cp_size=cp, cp_rank=rank, **kw)
        assert_close_f64(out, shard(want_full), full.abs().max().item(), f"rank {rank} forward")
        # Explicit global positions give the same bits.
        if layout == "thd":
            pos = rope_ext.context_parallel_positions(cp, rank, cu_seqlens=kw["cu_seqlens"], device=device)
            kw_pos = dict(layout="thd")
        else:
            pos = rope_ext.context_parallel_positions(cp, rank, seq_len=local.shape[1 if layout == "bshd" else 0] * cp,
                                                      device=device)
            kw_pos = dict(layout=layout)
        assert torch.equal(out, rope_ext.apply_rope(local, pos, impl=impl, **kw_pos)), f"rank {rank} vs positions"
        xl = local.detach().requires_grad_()
        g = randn(local.shape, local.dtype, device)
        rope_ext.apply_rope(xl, impl=impl, cp_size=cp, cp_rank=rank, **kw).backward(g)
        assert_close_f64(xl.grad, ref.rope_float64(g, pos, inverse=True, **kw_pos), g.abs().max().item(), "backward")


def test_context_parallel_qk_offsets_bf16(device):
    """q+k in one launch with per-sequence offsets on top of the global positions."""
    cp, rank = 2, 1
    cu = torch.tensor(CP_CU[cp], dtype=torch.int32, device=device)
    q, k = randn((22, 4, D), torch.bfloat16, device), randn((22, 2, D), torch.bfloat16, device)
    off = torch.tensor([5, 0, 100, 7], device=device)
    qo, ko = rope_ext.apply_rope_qk(q, k, layout="thd", cu_seqlens=cu, offsets=off, cp_size=cp, cp_rank=rank)
    pos = rope_ext.context_parallel_positions(cp, rank, cu_seqlens=cu, device=device)
    seq = torch.searchsorted(cu[1:].long() // cp, torch.arange(22, device=device), right=True)
    pos = pos + off[seq]
    assert_close_f64(qo, ref.rope_float64(q, pos, layout="thd"), 8.0, "q")
    assert_close_f64(ko, ref.rope_float64(k, pos, layout="thd"), 8.0, "k")


def test_context_parallel_helpers_round_trip():
    x = torch.randn(2, 24, 3, 8)
    parts = [rope_ext.context_parallel_shard(x, 3, r) for r in range(3)]
    assert torch.equal(torch.cat([rope_ext.context_parallel_index(3, r, seq_len=24) for r in range(3)]).sort()[0],
                       torch.arange(24))
    assert torch.equal(rope_ext.context_parallel_unshard(parts), x)
    # Rank r holds chunks r and 2*cp-1-r.
    assert rope_ext.context_parallel_positions(3, 1, seq_len=24).tolist() == [4, 5, 6, 7, 16, 17, 18, 19]
    cu = torch.tensor([0, 8, 20])
    t = torch.randn(20, 2)
    parts = [rope_ext.context_parallel_shard(t, 2, r, seq_dim=0, cu_seqlens=cu) for r in range(2)]
    assert torch.equal(rope_ext.context_parallel_unshard(parts, seq_dim=0, cu_seqlens=cu), t)
    with pytest.raises(ValueError, match="multiple of 2 \\* cp_size"):
        rope_ext.context_parallel_positions(2, 0, seq_len=10)


def test_context_parallel_errors(device):
    x = randn((2, 12, 3, D), torch.float32, device)
    before = x.clone()
    for kw, exc, pat in [
        (dict(cp_size=2, cp_rank=2), ValueError, "cp_rank"),
        (dict(cp_size=0), ValueError, "cp_size"),
        (dict(cp_size=2.0), TypeError, "cp_size"),
        (dict(cp_size=2, positions=torch.arange(12, device=device)), ValueError, "positions or cp_size"),
    ]:
        with pytest.raises(exc, match=pat):
            rope_ext.apply_rope(x, **kw)
    with pytest.raises(ValueError, match="must be even"):
        rope_ext.apply_rope(x[:, :11], cp_size=2, cp_rank=0)
    if device == "cpu":  # value checks of cu_seqlens (CUDA: with set_value_checks)
        t = randn((11, 3, D), torch.float32, device)
        with pytest.raises(ValueError, match="T \\* cp_size"):
            rope_ext.apply_rope(t, layout="thd", cu_seqlens=torch.tensor([0, 24], dtype=torch.int32), cp_size=2, cp_rank=0)
        with pytest.raises(ValueError, match="multiple of 2 \\* cp_size"):
            rope_ext.apply_rope(t, layout="thd", cu_seqlens=torch.tensor([0, 6, 22], dtype=torch.int32), cp_size=2,
                                cp_rank=0)
    assert torch.equal(x, before)


# ---------------------------------------------------------------------------- M-RoPE, axial
def hf_mrope_angles(pos3, inv_freq, section, interleaved):
    """HF's recomposition (Qwen2-VL contiguous split / Qwen3-VL interleave) in float64:
    pos3 [3, B, S] -> angles [B, S, R/2]."""
    freqs = pos3.double()[..., None] * inv_freq.double()  # [3, B, S, R/2]
    if interleaved:
        out = freqs[0].clone()
        for dim, offset in ((1, 1), (2, 2)):
            idx = slice(offset, section[dim] * 3, 3)
            out[..., idx] = freqs[dim, ..., idx]
        return out
    return torch.cat([m[i % 3] for i, m in enumerate(freqs.split(section, dim=-1))], dim=-1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("interleaved_sections, section", [(False, [4, 14, 14]), (True, [12, 10, 10]),
                                                           (False, [0, 16, 16])])
def test_mrope(device, impl, interleaved_sections, section):
    B, S, R = 2, 11, 64
    q, k = randn((B, S, 4, R), torch.bfloat16, device), randn((B, S, 2, R), torch.bfloat16, device)
    pos = torch.randint(0, 40000, (3, B, S), device=device)
    pos[:, 0, :3] = pos[0, 0, :3]  # text tokens: three equal positions
    qo, ko = rope_ext.apply_mrope(q, k, pos, section, interleaved_sections=interleaved_sections, impl=impl)
    ang = hf_mrope_angles(pos.cpu(), rope_ext.inv_freq(R), section, interleaved_sections)[:, :, None, :]
    assert_close_f64(qo, _rotate64(q.cpu(), ang, R), 8.0, "q")
    assert_close_f64(ko, _rotate64(k.cpu(), ang, R), 8.0, "k")
    # backward through both
    ql, kl = q.float().requires_grad_(), k.float().requires_grad_()
    a, b = rope_ext.apply_mrope(ql, kl, pos, section, interleaved_sections=interleaved_sections, impl=impl)
    gq, gk = randn(a.shape, a.dtype, device), randn(b.shape, b.dtype, device)
    torch.autograd.backward([a, b], [gq, gk])
    assert_close_f64(ql.grad, _rotate64(gq.cpu(), -ang, R), 8.0, "dq")
    assert_close_f64(kl.grad, _rotate64(gk.cpu(), -ang, R), 8.0, "dk")


def test_mrope_thd_shared_positions_partial(device):
    """[3, T] positions with thd, partial rotary, and the interleaved layout."""
    T, R = 17, 48
    q, k = randn((T, 4, D), torch.float32, device), randn((T, 1, D), torch.float32, device)
    pos = torch.randint(0, 1 << 20, (3, T), device=device)
    sec = [8, 8, 8]
    qo, ko = rope_ext.apply_mrope(q, k, pos, sec, interleaved_sections=True, layout="thd", rotary_dim=R)
    ang = hf_mrope_angles(pos.cpu()[:, None], rope_ext.inv_freq(R), sec, True)[0][:, None, :]
    assert_close_f64(qo, _rotate64(q.cpu(), ang, R), q.abs().max().item(), "q thd")
    assert_close_f64(ko, _rotate64(k.cpu(), ang, R), k.abs().max().item(), "k thd")


@pytest.mark.parametrize("impl", IMPLS)
def test_axial_2d(device, impl):
    """Qwen2-VL vision / FLUX convention: each axis its own frequencies over its dims."""
    Hh, Ww, H = 5, 7, 3
    rows, cols = torch.meshgrid(torch.arange(Hh), torch.arange(Ww), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], -1).to(device)  # [T, 2]
    T = Hh * Ww
    x = randn((T, H, D), torch.float32, device)
    out = rope_ext.apply_rope_axial(x, pos, layout="thd", base=100.0, impl=impl)
    f = rope_ext.inv_freq(D // 2, 100.0).double()
    ang = torch.cat([pos.cpu()[:, :1].double() * f, pos.cpu()[:, 1:].double() * f], -1)[:, None, :]
    assert_close_f64(out, _rotate64(x.cpu(), ang, D), x.abs().max().item(), "axial")
    # unequal split, q+k, bshd positions [B, S, 2], backward
    q, k = randn((2, T, H, D), torch.bfloat16, device), randn((2, T, 1, D), torch.bfloat16, device)
    pos_b = pos[None].expand(2, T, 2)
    qo, ko = rope_ext.apply_rope_axial_qk(q, k, pos_b, axes_dims=[16, 32], impl=impl)
    ang = torch.cat([pos.cpu()[:, :1].double() * rope_ext.inv_freq(16).double(),
                     pos.cpu()[:, 1:].double() * rope_ext.inv_freq(32).double()], -1)[None, :, None, :]
    assert_close_f64(qo, _rotate64(q.cpu(), ang, 48), 8.0, "axial q")
    assert_close_f64(ko, _rotate64(k.cpu(), ang, 48), 8.0, "axial k")
    xl = x.detach().requires_grad_()
    g = randn(x.shape, x.dtype, device)
    rope_ext.apply_rope_axial(xl, pos, layout="thd", base=100.0, impl=impl).backward(g)
    ang = torch.cat([pos.cpu()[:, :1].double() * f, pos.cpu()[:, 1:].double() * f], -1)[:, None, :]
    assert_close_f64(xl.grad, _rotate64(g.cpu(), -ang, D), g.abs().max().item(), "axial backward")


def test_multi_axis_errors(device):
    q, k = randn((2, 5, 2, D), torch.float32, device), randn((2, 5, 1, D), torch.float32, device)
    pos = torch.zeros(3, 2, 5, dtype=torch.long, device=device)
    before = q.clone()
    for args, kw, exc, pat in [
        ((pos, [4, 14, 15]), {}, ValueError, "sum to rotary_dim / 2"),
        ((pos[:2], [16, 16]), dict(interleaved_sections=True), ValueError, "3 axes"),
        ((pos[:, :, :4], [4, 14, 14]), {}, ValueError, "positions must have shape \\[axes, B, S\\]"),
        ((pos[:2], [4, 14, 14]), {}, ValueError, "M-RoPE positions must have shape"),
        ((pos.float(), [4, 14, 14]), {}, TypeError, "positions must be an int32 or int64"),
        ((pos, [4, -1, 29]), {}, ValueError, "mrope_section"),
    ]:
        with pytest.raises(exc, match=pat):
            rope_ext.apply_mrope(q, k, *args, **kw)
    with pytest.raises(ValueError, match="sections .* need positions"):
        rope_ext.apply_rope(q, sections=[16, 16])
    with pytest.raises(ValueError, match="axes_dims"):
        rope_ext.apply_rope_axial(q, torch.zeros(2, 5, 2, dtype=torch.long, device=device), axes_dims=[30, 3])
    with pytest.raises(ValueError, match="more than the head dim"):
        rope_ext.apply_rope_axial(q, torch.zeros(2, 5, 2, dtype=torch.long, device=device), axes_dims=[64, 64])
    assert torch.equal(q, before)


# ---------------------------------------------------------------------------- attention factor
@pytest.mark.parametrize("impl", IMPLS)
def test_attention_factor(device, impl):
    x = randn((2, 9, 3, D), torch.bfloat16, device)
    pos = torch.randint(0, 50000, (2, 9), device=device)
    out = rope_ext.apply_rope(x, pos, attention_factor=1.2079, impl=impl)
    assert_close_f64(out, ref.rope_float64(x, pos, attention_factor=1.2079), 8.0, "attention factor")
    xl = x.float().requires_grad_()
    g = randn(x.shape, torch.float32, device)
    rope_ext.apply_rope(xl, pos, attention_factor=0.75, impl=impl).backward(g)
    assert_close_f64(xl.grad, ref.rope_float64(g, pos, attention_factor=0.75, inverse=True), g.abs().max().item(),
                     "attention factor backward")
