"""Edge cases of every op (issue 17): empty inputs and 0-head tensors next to a non-empty
one, in place on separate non-dense buffers, module dtype casts, the reference table
handed to callers, decode queries outside the cache, and the errors a new user meets.
Values against the float64 truth (rope_ext.reference); outputs are NaN-poisoned
(conftest), in-place results are checked value by value."""
import pytest
import torch

import rope_ext
from rope_ext._args import op_options
from rope_ext import reference as ref
from conftest import assert_close_f64, randn

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}


# ---------------------------------------------------------------------------- empty / 0-head: rope
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("empty", ["q", "k"])
def test_rope_qk_one_tensor_with_zero_heads(device, empty, inplace):
    """q (or k) with 0 heads: the other one is still rotated (it was left uninitialised,
    or unrotated in place)."""
    B, S, D = 1, 4, 8
    q = randn((B, S, 0 if empty == "q" else 3, D), torch.float32, device)
    k = randn((B, S, 0 if empty == "k" else 2, D), torch.float32, device)
    pos = torch.tensor([3, 0, 7, 1000], device=device)
    wq, wk = ref.rope_float64(q, pos), ref.rope_float64(k, pos)
    qo, ko = rope_ext.apply_rope_qk(q, k, pos, inplace=inplace)
    assert qo.shape == q.shape and ko.shape == k.shape
    assert_close_f64(qo, wq, 2.0 * 8, "q")
    assert_close_f64(ko, wk, 2.0 * 8, "k")
    # The dispatcher path (autograd) and its backward.
    if not inplace:
        ql, kl = q.detach().requires_grad_(), k.detach().requires_grad_()
        a, b = rope_ext.apply_rope_qk(ql, kl, pos)
        gq, gk = randn(a.shape, a.dtype, device), randn(b.shape, b.dtype, device)
        (a * gq).sum().add((b * gk).sum()).backward()
        assert_close_f64(ql.grad, ref.rope_float64(gq, pos, inverse=True), 16.0, "dq")
        assert_close_f64(kl.grad, ref.rope_float64(gk, pos, inverse=True), 16.0, "dk")
        qo2, ko2 = torch.ops.rope_ext.rope_qk(q, k, *op_options(positions=pos))
        assert_close_f64(ko2, wk, 16.0, "k via the op")
        assert_close_f64(qo2, wq, 16.0, "q via the op")


@pytest.mark.parametrize("shape", [(0, 4, 2, 8), (2, 0, 2, 8), (2, 4, 0, 8)], ids=["B0", "S0", "H0"])
def test_rope_empty_input(device, shape):
    x = randn(shape, torch.float32, device)
    assert rope_ext.apply_rope(x).shape == shape
    assert rope_ext.apply_rope(x, inplace=True) is x
    q, k = rope_ext.apply_rope_qk(x, x.clone())
    assert q.shape == shape and k.shape == shape


# ---------------------------------------------------------------------------- empty / 0-head: norm + rope
@pytest.mark.parametrize("empty", ["q", "k"])
def test_norm_rope_qk_one_tensor_with_zero_heads(device, empty):
    """rms_norm_rope_qk with 0 heads in one tensor: the other's output, its dx and its
    weight grad are those of the float64 truth (k was uninitialised, dk unwritten, dw 0)."""
    B, S, D = 2, 5, 16
    q = randn((B, S, 0 if empty == "q" else 3, D), torch.float32, device).requires_grad_()
    k = randn((B, S, 0 if empty == "k" else 2, D), torch.float32, device).requires_grad_()
    wq, wk = (randn((D,), torch.float32, device).requires_grad_() for _ in range(2))
    pos = torch.randint(0, 500, (B, S), device=device)
    qo, ko = rope_ext.rms_norm_rope_qk(q, k, wq, wk, pos)
    gq, gk = randn(qo.shape, qo.dtype, device), randn(ko.shape, ko.dtype, device)
    ((qo * gq).sum() + (ko * gk).sum()).backward()
    q64, k64, wq64, wk64 = (t.detach().double().requires_grad_() for t in (q, k, wq, wk))
    rq = ref.rms_norm_rope_float64(q64, wq64, pos)
    rk = ref.rms_norm_rope_float64(k64, wk64, pos)
    ((rq * gq.double()).sum() + (rk * gk.double()).sum()).backward()
    assert_close_f64(qo, rq.detach(), 8.0, "q out")
    assert_close_f64(ko, rk.detach(), 8.0, "k out")
    assert_close_f64(q.grad, q64.grad, 64.0, "dq")
    assert_close_f64(k.grad, k64.grad, 64.0, "dk")
    assert_close_f64(wq.grad, wq64.grad, 64.0 * B * S, "dq_weight")
    assert_close_f64(wk.grad, wk64.grad, 64.0 * B * S, "dk_weight")


def test_norm_rope_empty_input(device):
    x = randn((2, 0, 3, 16), torch.float32, device).requires_grad_()
    w = randn((16,), torch.float32, device).requires_grad_()
    y = rope_ext.rms_norm_rope(x, w)
    assert y.shape == x.shape
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w)) and x.grad.shape == x.shape


# ---------------------------------------------------------------------------- empty / 0-head: attention
def test_append_kv_zero_kv_heads_still_rotates_q(device):
    """Hk = 0 with q given: q is rotated in place at the new tokens' cache indices (append_kv
    returned before rotating it)."""
    B, T, Hq, D = 2, 3, 4, 64
    q = randn((B, T, Hq, D), torch.float32, device)
    q0 = q.clone()
    k = randn((B, T, 0, D), torch.float32, device)
    kc = torch.zeros((B, 16, 0, D), device=device)
    sl = torch.tensor([2, 9], dtype=torch.int32, device=device)
    rope_ext.append_kv(k, k.clone(), kc, kc.clone(), sl, q=q)
    pos = sl[:, None].long() + torch.arange(T, device=device)
    assert_close_f64(q, ref.rope_float64(q0, pos), 8.0, "q in place")


def test_append_kv_no_tokens_writes_nothing(device):
    kc = torch.full((2, 8, 2, 64), float("nan"), device=device)
    vc = kc.clone()
    q = randn((2, 0, 4, 64), torch.float32, device)
    k = randn((2, 0, 2, 64), torch.float32, device)
    rope_ext.append_kv(k, k.clone(), kc, vc, torch.tensor([1, 3], dtype=torch.int32, device=device), q=q)
    assert torch.isnan(kc).all() and torch.isnan(vc).all()


@pytest.mark.parametrize("shape", [(0, 1, 4, 64), (2, 0, 4, 64), (2, 1, 0, 64)], ids=["B0", "q_len0", "Hq0"])
def test_attention_decode_empty(device, shape):
    B = shape[0]
    kc = randn((B, 8, 2, 64), torch.float16, device)
    q = randn(shape, torch.float16, device)
    sl = torch.full((B,), 4, dtype=torch.int32, device=device)
    o, lse = rope_ext.attention_decode(q, kc, kc.clone(), sl, return_lse=True)
    assert o.shape == shape and lse.shape == shape[:3]


def test_attention_decode_zero_kv_heads_is_refused(device):
    kc = torch.zeros((2, 8, 0, 64), dtype=torch.float16, device=device)
    q = randn((2, 1, 4, 64), torch.float16, device)
    with pytest.raises(ValueError, match="kv heads Hk = 0"):
        rope_ext.attention_decode(q, kc, kc.clone(), torch.tensor([1, 2], dtype=torch.int32, device=device))


# ---------------------------------------------------------------------------- in place on separate buffers
@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_inplace_separate_non_dense_buffers(device, layout):
    """q and k are head slices of two DIFFERENT buffers (neither view dense): they cannot
    share memory, so in place is accepted; the heads outside the slices stay bit-identical."""
    lead = (2, 5) if layout == "bshd" else (7,)
    A, Bf = randn((*lead, 8, 32), torch.bfloat16, device), randn((*lead, 4, 32), torch.bfloat16, device)
    A0, B0 = A.clone(), Bf.clone()
    q, k = A[..., :4, :], Bf[..., :2, :]
    assert not q.is_contiguous() and not k.is_contiguous()
    pos = torch.randint(0, 1000, lead, device=device) if layout == "bshd" else torch.randint(0, 1000, lead, device=device)
    kw = dict(layout=layout)
    rope_ext.apply_rope_qk(q, k, pos, inplace=True, **kw)
    assert_close_f64(A[..., :4, :], ref.rope_float64(A0[..., :4, :], pos, **kw), 8.0, "q in place")
    assert_close_f64(Bf[..., :2, :], ref.rope_float64(B0[..., :2, :], pos, **kw), 8.0, "k in place")
    assert torch.equal(A[..., 4:, :], A0[..., 4:, :]) and torch.equal(Bf[..., 2:, :], B0[..., 2:, :])


def test_inplace_same_buffer_overlap_still_refused(device):
    A = randn((2, 5, 8, 32), torch.float32, device)
    before = A.clone()
    with pytest.raises(ValueError, match="must not share memory"):
        rope_ext.apply_rope_qk(A[:, :, :4], A[:, :, 2:6], inplace=True)
    assert torch.equal(A, before)


# ---------------------------------------------------------------------------- module dtype casts
@pytest.mark.parametrize("cast", ["half", "bf16", "double"])
@pytest.mark.parametrize("max_position", [None, 4096])
@pytest.mark.parametrize("scaling", [None, YARN], ids=["default", "yarn"])
def test_rotary_embedding_dtype_cast_keeps_float32_frequencies(device, cast, max_position, scaling):
    """module.half() / .to(bf16) / .double() keep inv_freq and the cos/sin cache float32:
    the next call works (it raised for scaled frequencies) and is as accurate as before
    (an fp16 cache gave 2e-3 errors)."""
    m = rope_ext.RotaryEmbedding(64, scaling=scaling, max_position=max_position).to(device)
    f0 = m.inv_freq.clone()
    c0 = None if m.cos_sin_cache is None else m.cos_sin_cache.clone()
    dt = {"half": torch.float16, "bf16": torch.bfloat16, "double": torch.float64}[cast]
    m = m.half() if cast == "half" else m.to(dt) if cast == "bf16" else m.double()
    assert m.inv_freq.dtype == torch.float32 and torch.equal(m.inv_freq, f0)
    if c0 is not None:
        assert m.cos_sin_cache.dtype == torch.float32 and torch.equal(m.cos_sin_cache, c0)
    q, k = randn((2, 16, 4, 64), dt, device), randn((2, 16, 2, 64), dt, device)
    pos = torch.randint(0, 4096, (2, 16), device=device)
    qo, ko = m(q, k, pos)
    assert qo.dtype == dt and ko.dtype == dt
    kw = dict(inv_freq=m.inv_freq, attention_factor=m.attention_factor)
    assert_close_f64(qo, ref.rope_float64(q, pos, **kw), 8.0, "q")
    assert_close_f64(ko, ref.rope_float64(k, pos, **kw), 8.0, "k")


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_rotary_embedding_refuses_length_dependent_scaling(kind):
    sc = {"rope_type": kind, "factor": 2.0, "max_position_embeddings": 256, "original_max_position_embeddings": 128,
          "long_factor": [1.0] * 32, "short_factor": [1.0] * 32}
    with pytest.raises(ValueError, match=f"'{kind}'.*sequence length"):
        rope_ext.RotaryEmbedding(64, scaling=sc)


# ---------------------------------------------------------------------------- reference table
def test_cos_sin_table_is_private_and_sized(device):
    """cos_sin_table returns exactly max_position rows, and a caller's in-place edit
    never reaches another caller (it handed out its shared cache)."""
    a = ref.cos_sin_table(32, 1234.5, 100, device)
    big = ref.cos_sin_table(32, 1234.5, 300, device)
    small = ref.cos_sin_table(32, 1234.5, 10, device)
    assert a.shape == (100, 32) and big.shape == (300, 32) and small.shape == (10, 32)
    want = ref.cos_sin_table(32, 1234.5, 100, device).clone()
    a.zero_()
    small.fill_(7.0)
    again = ref.cos_sin_table(32, 1234.5, 100, device)
    assert torch.equal(again, want) and torch.equal(big[:100], want)
    f = rope_ext.inv_freq(32, 1234.5).double()
    ang = torch.arange(100, dtype=torch.float64)[:, None] * f
    assert (again.double().cpu() - torch.cat([ang.cos(), ang.sin()], -1)).abs().max() < 1e-4


# ---------------------------------------------------------------------------- decode queries outside the cache
def _decode_case(device, causal):
    B, Hk, G, D, q_len = 2, 2, 2, 64, 4
    kc = randn((B, 16, Hk, D), torch.float16, device)
    vc = randn((B, 16, Hk, D), torch.float16, device)
    q = randn((B, q_len, Hk * G, D), torch.float16, device)
    sl = torch.tensor([2, 9], dtype=torch.int32, device=device)  # sequence 0 holds 2 < q_len tokens
    cache = ref.cos_sin_table(D, 10000.0, 64, device)
    return (q, kc, vc, sl), dict(causal=causal, cos_sin_cache=cache, return_lse=True)


def test_decode_non_causal_query_outside_cache_is_refused_on_cpu():
    """Non-causal decode with 0 < cache_seqlens < q_len: the first query tokens would sit at
    negative cache indices (negative positions: NaN from a cos_sin_cache on the GPU, 0 on
    the CPU). The CPU always checks values: a ValueError naming cache_seqlens."""
    args, kw = _decode_case("cpu", causal=False)
    with pytest.raises(ValueError, match=r"cache_seqlens.*q_len"):
        rope_ext.attention_decode(*args, **kw)
    # Causal: such rows see no key (documented): zeros and lse = -inf, the rest is attention.
    o, lse = rope_ext.attention_decode(*args, **dict(kw, causal=True))
    assert (o[0, :2] == 0).all() and (lse[0, :2] == float("-inf")).all() and torch.isfinite(o).all()


@cuda
def test_decode_non_causal_query_outside_cache_cuda():
    """CUDA without value checks (no host sync): such a query attends to nothing (zeros,
    lse = -inf), never NaN; with set_value_checks(True) the CPU's ValueError."""
    args, kw = _decode_case("cuda", causal=False)
    o, lse = rope_ext.attention_decode(*args, **kw)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all()
    assert (o[0, :2] == 0).all() and (lse[0, :2] == float("-inf")).all()
    assert torch.isfinite(lse[0, 2:]).all() and torch.isfinite(lse[1]).all()
    rope_ext.set_value_checks(True)
    try:
        with pytest.raises(ValueError, match=r"cache_seqlens.*q_len"):
            rope_ext.attention_decode(*args, **kw)
    finally:
        rope_ext.set_value_checks(False)


# ---------------------------------------------------------------------------- messages a new user meets
def test_messages_name_what_the_user_passed(device):
    with pytest.raises(ValueError, match="head_dim must be a positive even int, got 63"):
        rope_ext.RotaryEmbedding(63)
    with pytest.raises(ValueError, match=r"rotary_dim must be even and in \(0, head_dim = 64\], got 66"):
        rope_ext.RotaryEmbedding(64, rotary_dim=66)
    with pytest.raises(ValueError, match="head dim D must be even and > 0, got D = 0"):
        rope_ext.apply_rope(torch.zeros(1, 2, 3, 0, device=device))
    q, k = randn((7, 4, 32), torch.float32, device), randn((6, 2, 32), torch.float32, device)
    want = r"agree in every dimension but heads \(layout 'thd' \[T, H, D\]\), got q \[7, 4, 32\] and k \[6, 2, 32\]"
    with pytest.raises(ValueError, match=want):  # the eager path (C++ rope_direct)
        rope_ext.apply_rope_qk(q, k, torch.arange(7, device=device), layout="thd")
    with pytest.raises(ValueError, match=want):  # eager with autograd
        rope_ext.apply_rope_qk(q.detach().requires_grad_(), k, torch.arange(7, device=device), layout="thd")

    class Passthrough(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough(), pytest.raises(ValueError, match=want):  # the op path (a mode is active)
        rope_ext.apply_rope_qk(q, k, torch.arange(7, device=device), layout="thd")
    with pytest.raises(ValueError, match=want):
        rope_ext.rms_norm_rope_qk(q, k, torch.ones(32, device=device), torch.ones(32, device=device),
                                  torch.arange(7, device=device), layout="thd")
    leaf = randn((1, 4, 2, 32), torch.float32, device).requires_grad_()
    with pytest.raises(ValueError, match="leaf"):
        rope_ext.apply_rope(leaf, inplace=True)
