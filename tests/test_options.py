"""Each option of apply_rope / apply_rope_qk (positions, offsets, thd, partial rotary,
GPT-J pairs, frequency sources, q+k, in place) x every variant, fp32 and bf16,
forward and backward, against float64 and the references."""
import pytest
import torch

import rope_ext
from rope_ext import reference as ref
from conftest import IMPLS, assert_close_f64, assert_close_ref, randn, vector_ok, VECTOR_IMPLS

B, S, H, D = 3, 29, 4, 64
T, CU = 40, [0, 7, 7, 31, 40]  # thd: four sequences, one empty


def options(device):
    """name -> (x shape, kwargs). Tensors are made fresh on every call."""
    i32 = dict(dtype=torch.int32, device=device)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    return {
        "positions_bs": ((B, S, H, D), dict(positions=torch.randint(0, 8000, (B, S), device=device))),
        "positions_s_int32": ((B, S, H, D), dict(positions=torch.randint(0, 8000, (S,), **i32))),
        "offsets_int": ((B, S, H, D), dict(offsets=1000)),
        "offsets_tensor": ((B, S, H, D), dict(offsets=torch.tensor([0, 17, 4000], device=device))),
        "thd_cu_offsets": ((T, H, D), dict(layout="thd", cu_seqlens=torch.tensor(CU, **i32),
                                             offsets=torch.tensor([3, 0, 100, 9], **i32))),
        "thd_positions": ((T, H, D), dict(layout="thd", positions=torch.randint(0, 8000, (T,), device=device))),
        "rotary_half": ((B, S, H, D), dict(rotary_dim=32)),
        "rotary_24_sbhd": ((S, B, H, D), dict(layout="sbhd", rotary_dim=24)),
        "interleaved": ((B, S, H, D), dict(interleaved=True)),
        "interleaved_partial": ((B, S, H, D), dict(interleaved=True, rotary_dim=48)),
        "inv_freq_llama3": ((B, S, H, D), dict(inv_freq=rope_ext.inv_freq(D, 500000.0, llama3, device=device))),
        "cache_fp32": ((B, S, H, D), dict(cos_sin_cache=ref.cos_sin_table(D, 10000.0, 64, device),
                                          positions=torch.randint(0, 64, (B, S), device=device))),
        "cache_bf16_partial": ((B, S, H, D), dict(rotary_dim=32, offsets=3,
                                                  cos_sin_cache=ref.cos_sin_table(32, 500.0, 40, device).bfloat16())),
    }


OPTION_NAMES = list(options("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", OPTION_NAMES)
@pytest.mark.parametrize("impl", IMPLS)
def test_option(device, impl, name, dtype):
    shape, kw = options(device)[name]
    x = randn(shape, dtype, device)
    scale = x.abs().max().item()
    x_before = x.clone()
    if impl in VECTOR_IMPLS and not vector_ok(x, kw.get("rotary_dim"), kw.get("interleaved", False)):
        with pytest.raises(ValueError, match=f"impl=.{impl}. needs 16-byte"):
            rope_ext.apply_rope(x, impl=impl, **kw)
        return
    out = rope_ext.apply_rope(x, impl=impl, **kw)
    assert torch.equal(x, x_before)
    assert_close_f64(out, ref.rope_float64(x, **kw), scale, name)
    assert_close_ref(out, ref.rope_naive(x, **kw), scale, name + " vs naive")
    assert_close_ref(out, ref.rope_cached(x, **kw), scale, name + " vs cached")
    xl = x.detach().requires_grad_()
    g = randn(shape, dtype, device)
    rope_ext.apply_rope(xl, impl=impl, **kw).backward(g)
    assert_close_f64(xl.grad, ref.rope_float64(g, inverse=True, **kw), g.abs().max().item(), name + " backward")


@pytest.mark.parametrize("name", OPTION_NAMES)
@pytest.mark.parametrize("impl", [i for i in IMPLS if i != "naive"])
def test_inplace(device, impl, name):
    shape, kw = options(device)[name]
    x = randn(shape, torch.bfloat16, device)
    expect = ref.rope_float64(x, **kw)
    R = kw.get("rotary_dim") or D
    tail = x[..., R:].clone()
    if impl in VECTOR_IMPLS and not vector_ok(x, kw.get("rotary_dim"), kw.get("interleaved", False), inplace=True):
        pytest.skip("layout not vectorizable; covered by the error test")
    v0 = x._version
    out = rope_ext.apply_rope(x, impl=impl, inplace=True, **kw)
    assert out is x and x._version > v0, "in place must return x and bump its version counter"
    assert torch.equal(x[..., R:], tail), "pass-through features must stay untouched"
    assert_close_f64(x, expect, expect.abs().max().item(), name + " in place")


def test_naive_inplace_is_refused(device):
    x = randn((B, S, H, D), torch.float32, device)
    with pytest.raises(ValueError, match="naive.*in place"):
        rope_ext.apply_rope(x, impl="naive", inplace=True)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_qk_gqa_one_call(device, impl, inplace):
    """q and k with different head counts and strides (a fused qkv buffer)."""
    if inplace and impl == "naive":
        pytest.skip("naive cannot run in place (tested above)")
    Hq, Hk = 8, 2
    qkv = randn((B, S, Hq + 2 * Hk, D), torch.bfloat16, device)
    qkv0 = qkv.clone()
    q, k = qkv[:, :, :Hq], qkv[:, :, Hq:Hq + Hk]
    pos = torch.randint(0, 5000, (B, S), device=device)
    eq, ek = ref.rope_float64(q, pos), ref.rope_float64(k, pos)
    qo, ko = rope_ext.apply_rope_qk(q, k, pos, impl=impl, inplace=inplace)
    assert (qo is q and ko is k) == inplace
    assert_close_f64(qo, eq, 8.0, "q")
    assert_close_f64(ko, ek, 8.0, "k")
    # v (the heads after q and k) is never touched; out of place, neither is q or k.
    assert torch.equal(qkv[:, :, Hq + Hk:], qkv0[:, :, Hq + Hk:]), "v heads must stay bit-identical"
    if inplace:
        return
    assert torch.equal(qkv, qkv0), "out of place must not write its inputs"
    # Backward through both outputs.
    ql, kl = q.detach().requires_grad_(), k.detach().requires_grad_()
    gq, gk = randn(q.shape, q.dtype, device), randn(k.shape, k.dtype, device)
    a, b = rope_ext.apply_rope_qk(ql, kl, pos, impl=impl)
    (a.float() * gq.float()).sum().add_((b.float() * gk.float()).sum()).backward()
    assert_close_f64(ql.grad, ref.rope_float64(gq, pos, inverse=True), 8.0, "dq")
    assert_close_f64(kl.grad, ref.rope_float64(gk, pos, inverse=True), 8.0, "dk")


def test_inplace_autograd_nonleaf(device):
    """In place on a non-leaf that requires grad: the gradient flows (rotation by -theta)."""
    w = randn((B, S, H, D), torch.float32, device).requires_grad_()
    y = w * 1.0
    out = rope_ext.apply_rope(y, inplace=True)
    assert out is y
    g = randn(out.shape, out.dtype, device)
    out.backward(g)
    assert_close_f64(w.grad, ref.rope_float64(g, inverse=True), g.abs().max().item(), "in-place grad")


@pytest.mark.parametrize("form", ["projection_views", "fused_qkv_slices", "sbhd", "bhsd", "thd"])
def test_inplace_qk_autograd_views(device, form):
    """apply_rope_qk(inplace=True) under autograd where q and k are views (a projection's
    .view(), head slices of one fused qkv output) or take a layout's permuted view
    (sbhd / bhsd / thd): autograd refuses one Function that dirties two views, and did so
    after the kernel had written them; now it runs, q and k rotated in place, and the
    gradient is the rotation by -theta."""
    Hq, Hk = 4, 2
    layout = form if form in ("sbhd", "bhsd", "thd") else "bshd"
    shape = {"bshd": (B, S), "sbhd": (S, B), "bhsd": None, "thd": (T,)}[layout]
    if form == "projection_views":
        wq = randn((B, S, Hq * D), torch.float32, device).requires_grad_()
        wk = randn((B, S, Hk * D), torch.float32, device).requires_grad_()
        q, k = (wq * 1.0).view(B, S, Hq, D), (wk * 1.0).view(B, S, Hk, D)
        leaves = [(wq, (B, S, Hq, D)), (wk, (B, S, Hk, D))]
    elif form == "fused_qkv_slices":
        w = randn((B, S, Hq + 2 * Hk, D), torch.float32, device).requires_grad_()
        qkv = w * 1.0
        q, k = qkv[:, :, :Hq], qkv[:, :, Hq:Hq + Hk]
        leaves = None
    else:
        sq = (B, Hq, S, D) if layout == "bhsd" else shape + (Hq, D)
        sk = (B, Hk, S, D) if layout == "bhsd" else shape + (Hk, D)
        wq = randn(sq, torch.float32, device).requires_grad_()
        wk = randn(sk, torch.float32, device).requires_grad_()
        q, k = wq * 1.0, wk * 1.0
        leaves = [(wq, sq), (wk, sk)]
    kw = dict(layout=layout)
    if layout == "thd":
        kw["cu_seqlens"] = torch.tensor(CU, dtype=torch.int32, device=device)
    q0, k0 = q.detach().clone(), k.detach().clone()
    qo, ko = rope_ext.apply_rope_qk(q, k, inplace=True, **kw)
    assert qo is q and ko is k
    assert_close_f64(q, ref.rope_float64(q0, **kw), 8.0, "q in place")
    assert_close_f64(k, ref.rope_float64(k0, **kw), 8.0, "k in place")
    gq, gk = randn(q.shape, q.dtype, device), randn(k.shape, k.dtype, device)
    (q * gq).sum().add((k * gk).sum()).backward()
    want_q, want_k = ref.rope_float64(gq, inverse=True, **kw), ref.rope_float64(gk, inverse=True, **kw)
    if leaves is None:  # the fused buffer: q's and k's heads get the rotated grads, v's none
        assert_close_f64(w.grad[:, :, :Hq], want_q, 8.0, "dq")
        assert_close_f64(w.grad[:, :, Hq:Hq + Hk], want_k, 8.0, "dk")
        assert (w.grad[:, :, Hq + Hk:] == 0).all()
    else:
        for (leaf, sh), want, what in zip(leaves, (want_q, want_k), ("dq", "dk")):
            assert_close_f64(leaf.grad.view(sh), want, 8.0, what)


def test_inplace_refuses_view_of_grad_leaf(device):
    """In place on a view of a leaf that requires grad (param[:, :2]): a ValueError naming
    the argument, raised before anything is written (autograd would refuse it only after
    the kernel ran); apply_rope_qk's message names q."""
    w = randn((B, S, H, D), torch.float32, device).requires_grad_()
    before = w.detach().clone()
    with pytest.raises(ValueError, match="inplace=True on x, a view of a leaf"):
        rope_ext.apply_rope(w[:, :, :2], inplace=True)
    k = randn((B, S, 2, D), torch.float32, device) * 1.0
    with pytest.raises(ValueError, match="inplace=True on q, a view of a leaf"):
        rope_ext.apply_rope_qk(w[:, :, :2], k, inplace=True)
    with pytest.raises(ValueError, match="inplace=True on k, a view of a leaf"):
        rope_ext.apply_rope_qk(k, w[:, :, 2:], inplace=True)
    with pytest.raises(ValueError, match="inplace=True on q, a leaf"):
        rope_ext.apply_rope_qk(w, k, inplace=True)
    assert torch.equal(w.detach(), before)


def test_offset_overflow_refused(device):
    """An offset whose positions overflow int64 is refused (it wrapped negative and
    passed the range checks: NaN rows from a cos_sin_cache, a wrong angle otherwise)."""
    x = randn((1, 4, 1, 8), torch.float32, device)
    cache = randn((16, 8), torch.float32, device)
    rope_ext.set_value_checks(True)  # on CUDA value checks are opt-in (they synchronize)
    try:
        for kw in (dict(cos_sin_cache=cache), dict()):
            with pytest.raises(ValueError, match="overflows int64"):
                rope_ext.apply_rope(x, offsets=2**63 - 2, **kw)
    finally:
        rope_ext.set_value_checks(False)


def test_inplace_refuses_leaf_and_overlap(device):
    x = randn((B, S, H, D), torch.float32, device).requires_grad_()
    with pytest.raises(ValueError, match="leaf"):
        rope_ext.apply_rope(x, inplace=True)
    e = randn((1, S, H, D), torch.float32, device).expand(B, S, H, D)
    before = e.clone()
    with pytest.raises(ValueError, match="overlapping|non-overlapping"):
        rope_ext.apply_rope(e, inplace=True)
    assert torch.equal(e, before)
