"""Fused per-head RMSNorm + RoPE (rope_ext.rms_norm_rope / rms_norm_rope_qk): forward,
dx and the weight gradient against float64 autograd through
rope_ext.reference.rms_norm_rope_float64, every variant, fresh random inputs.
Tolerances: conftest's table for the outputs (fp32 2e-6 of max|ref|, bf16/fp16 one
rounding); the weight gradient (a sum over all rows, fp32 accumulation) 1e-5 of its
max in fp32, one rounding plus that in a 16-bit weight dtype."""
import zlib

import pytest
import torch

import rope_ext
from rope_ext.reference import rms_norm_rope_float64

from conftest import DEVICES, DTYPES, assert_close_f64, randn, ulp

NORM_IMPLS = rope_ext.NORM_ROPE_IMPLS + ("auto",)

# (name, q shape in `layout`, Hk, layout, rope keywords): the model shapes and the options.
CASES = [
    ("qwen3 bshd", (2, 9, 4, 128), 2, "bshd", {}),
    ("gemma3 partial interleaved", (1, 7, 3, 64), 1, "bshd", dict(rotary_dim=32, interleaved=True)),
    ("sbhd positions", (5, 2, 2, 128), 2, "sbhd", dict(positions="rand")),
    ("thd varlen", (13, 4, 128), 2, "thd", dict(cu_seqlens=[0, 5, 13])),
    ("mrope interleaved sections", (1, 6, 2, 128), 1, "bshd", dict(positions="axes3", sections=[24, 20, 20],
                                                                     sections_interleaved=True)),
    ("d256 scalar tail", (1, 3, 2, 256), 1, "bshd", dict(rotary_dim=64)),
]


def _kw(kw, shape, layout, device):
    kw = dict(kw)
    if layout == "thd":
        kw["cu_seqlens"] = torch.tensor(kw["cu_seqlens"], dtype=torch.int32, device=device)
        return kw
    B, S = (shape[0], shape[1]) if layout == "bshd" else (shape[1], shape[0])
    if kw.get("positions") == "rand":
        kw["positions"] = torch.randint(0, 1 << 20, (B, S), device=device)
    elif kw.get("positions") == "axes3":
        kw["positions"] = torch.randint(0, 4096, (3, B, S), device=device)
    return kw


def _k_shape(shape, Hk, layout):
    s = list(shape)
    s[-2] = Hk
    return tuple(s)


def _weights(D, device, wdtype=torch.float32):
    return [(1 + 0.5 * torch.randn(D, device=device)).to(wdtype) for _ in range(2)]


def _check_vs_float64(device, dtype, case, impl):
    """One call of rms_norm_rope_qk and its backward against float64 autograd; returns
    (dq, dk, dq_weight, dk_weight), or None where impl refuses the rows (said so)."""
    name, shape, Hk, layout, kw = case
    # Seeded per call (crc32: stable across processes), so that two calls of one case
    # see the same inputs (test_tile_sizes_cuda compares their dx bit for bit).
    torch.manual_seed(zlib.crc32(f"{name} {dtype} {impl}".encode()))
    kw = _kw(kw, shape, layout, device)
    D = shape[-1]
    offset = 1.0 if "gemma" in name else 0.0
    q = randn(shape, dtype, device).requires_grad_()
    k = randn(_k_shape(shape, Hk, layout), dtype, device).requires_grad_()
    qw, kw_ = [w.requires_grad_() for w in _weights(D, device)]
    try:
        qo, ko = rope_ext.rms_norm_rope_qk(q, k, qw, kw_, eps=1e-6, weight_offset=offset, layout=layout,
                                           impl=impl, **kw)
    except ValueError as e:  # 'tile' on rows it cannot vector-load: said so, nothing else
        assert impl == "tile" and "16-byte" in str(e), e
        return None
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    qw64, kw64 = qw.detach().double().requires_grad_(), kw_.detach().double().requires_grad_()
    rq = rms_norm_rope_float64(q64, qw64, eps=1e-6, weight_offset=offset, layout=layout, **kw)
    rk = rms_norm_rope_float64(k64, kw64, eps=1e-6, weight_offset=offset, layout=layout, **kw)
    what = f"{name} {dtype} {impl}"
    assert_close_f64(qo, rq, rq.abs().max().item(), what + " q")
    assert_close_f64(ko, rk, rk.abs().max().item(), what + " k")

    gq, gk = randn(qo.shape, dtype, device), randn(ko.shape, dtype, device)
    dq, dk, dqw, dkw = torch.autograd.grad((qo, ko), (q, k, qw, kw_), (gq, gk))
    rdq, rdk, rdqw, rdkw = torch.autograd.grad((rq, rk), (q64, k64, qw64, kw64), (gq.double(), gk.double()))
    assert_close_f64(dq, rdq, rdq.abs().max().item(), what + " dq")
    assert_close_f64(dk, rdk, rdk.abs().max().item(), what + " dk")
    for got, want, nm in ((dqw, rdqw, "dq_weight"), (dkw, rdkw, "dk_weight")):
        assert torch.isfinite(got).all(), f"{what} {nm}: non-finite"
        err = (got.double().cpu() - want.cpu()).abs().max().item()
        assert err <= 1e-5 * want.abs().max().item(), f"{what} {nm}: max err {err:.3e}"
    return dq, dk, dqw, dkw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_backward_vs_float64(device, dtype, case):
    for impl in NORM_IMPLS:
        _check_vs_float64(device, dtype, case, impl)


# Shapes whose tiles hold many rows: with the tile size forced (rows per team of a
# block's tile, past the SM rule; -1: one resident wave of blocks) a team takes several
# rows, its next row's loads in flight, and a tile spans many token groups and both
# tensors.
TILE_CASES = [
    ("qwen3 bshd", (2, 67, 6, 128), 2, "bshd", {}),
    ("gemma3 partial interleaved", (1, 45, 5, 64), 3, "bshd", dict(rotary_dim=32, interleaved=True)),
    ("thd varlen", (93, 4, 128), 1, "thd", dict(cu_seqlens=[0, 17, 93])),
    # Teams of one and two lanes at 16-byte access (D 16 / 32 in 16-bit, 8 / 16 in fp32):
    # a warp batch of one or two iterations, the dw shuffles over 32 or 16 teams.
    ("d16 tiny heads", (2, 29, 3, 16), 2, "bshd", {}),
    ("d32", (1, 35, 5, 32), 3, "bshd", {}),
]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("rows_per_team", [1, 3, 16, -1])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_CASES, ids=[c[0] for c in TILE_CASES])
def test_tile_sizes_cuda(case, dtype, rows_per_team):
    """Every tile size gives the float64 truth, and dx bit for bit the rule's (the same
    arithmetic per row; dw is summed in another order)."""
    for impl in NORM_IMPLS:
        want = _check_vs_float64("cuda", dtype, case, impl)
        rope_ext._C.set_norm_rope_rows_per_team(rows_per_team)
        try:
            got = _check_vs_float64("cuda", dtype, case, impl)
        finally:
            rope_ext._C.set_norm_rope_rows_per_team(0)
        if want is not None:
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), \
                f"{case[0]} {dtype} {impl}: dx differs between tile sizes"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("rows_per_team", [3, 16])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_CASES, ids=[c[0] for c in TILE_CASES])
def test_ring_depths_cuda(case, dtype, stages, rows_per_team):
    """The tile variant's rows in flight per team (1: no ring; 2-4: the cp.async ring of
    that depth; 3 rows per team leave ring slots past the tile's end, 16 wrap the ring
    several times): the float64 truth, the depth asked for ran in both directions, and
    dx bit for bit the rule's (the same arithmetic per row)."""
    want = _check_vs_float64("cuda", dtype, case, "tile")
    assert want is not None, f"{case[0]} {dtype}: every TILE_CASES shape takes the tile variant"
    rope_ext._C.set_norm_rope_rows_per_team(rows_per_team)
    rope_ext._C.set_norm_rope_stages(stages)
    try:
        got = _check_vs_float64("cuda", dtype, case, "tile")
        ran = rope_ext._C.last_norm_rope_stages(False), rope_ext._C.last_norm_rope_stages(True)
    finally:
        rope_ext._C.set_norm_rope_stages(0)
        rope_ext._C.set_norm_rope_rows_per_team(0)
    # (The H100 fits every depth of these shapes in one block; a smaller GPU may lower it.)
    assert ran == (stages, stages), f"{case[0]} {dtype}: asked for {stages} rows in flight, ran (fwd, bwd) {ran}"
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), \
        f"{case[0]} {dtype} stages {stages}: dx differs from the rule's"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_ring_rule_lowers_depth_cuda():
    """The rule's depth where its ring does not fit beside a large table: D = 256 bf16,
    3 rows per token (2 q heads, 1 k head), 16 rows per team: tiles of 256 rows halved by
    the table's 32 KB cap to 64 (4 rows per team: not the small-call depth), which touch
    22 token groups (22 KB of sin/cos). With the rule's forward ring 3 deep (33 KB) and the
    weights that is 57 KB, past the 56 KB a block may take at 4 blocks per SM on an H100
    (a quarter of 228 KB less the 1 KB reserved per block) or any GPU with less, so the
    forward's plan takes a shallower ring (or none): still the float64 truth.
    set_norm_rope_stages refuses depths it has no wait for."""
    case = ("d256 big table", (1, 300, 2, 256), 1, "bshd", {})
    rope_ext._C.set_norm_rope_rows_per_team(16)  # tiles of 256 rows, halved by the table's cap to 64
    try:
        _check_vs_float64("cuda", torch.bfloat16, case, "tile")
        fwd, bwd = rope_ext._C.last_norm_rope_stages(False), rope_ext._C.last_norm_rope_stages(True)
    finally:
        rope_ext._C.set_norm_rope_rows_per_team(0)
    assert 1 <= fwd < 3, f"forward ran {fwd} rows in flight: depth 3 cannot fit beside this table at 4 blocks per SM"
    assert 1 <= bwd <= 2, f"backward ran {bwd}: the rule's backward depth is 2 at most"
    for bad in (-1, 5):
        with pytest.raises(ValueError, match="set_norm_rope_stages"):
            rope_ext._C.set_norm_rope_stages(bad)


@pytest.mark.parametrize("device", DEVICES)
def test_every_tensor_empty(device):
    """q and k with 0 heads: empty outputs, forward and backward, and zero weight grads
    (nothing to plan: the CUDA plan's table math divides by the rows per token, 0 here)."""
    q = randn((2, 5, 0, 64), torch.bfloat16, device).requires_grad_()
    k = randn((2, 5, 0, 64), torch.bfloat16, device).requires_grad_()
    qw, kw = [w.requires_grad_() for w in _weights(64, device)]
    qo, ko = rope_ext.rms_norm_rope_qk(q, k, qw, kw)
    assert qo.shape == q.shape and ko.shape == k.shape
    dq, dk, dqw, dkw = torch.autograd.grad((qo, ko), (q, k, qw, kw), (torch.ones_like(qo), torch.ones_like(ko)))
    assert dq.shape == q.shape and dk.shape == k.shape
    assert torch.equal(dqw, torch.zeros_like(dqw)) and torch.equal(dkw, torch.zeros_like(dkw))


@pytest.mark.parametrize("device", DEVICES)
def test_single_tensor_strided_and_16bit_weight(device):
    """x a slice of a fused projection that starts 3 elements in (rows strided, not
    16-byte aligned): auto falls back to the scalar variant, an explicit 'tile'
    refuses; a bf16 weight, whose gradient comes back in its dtype."""
    T, H, D = 11, 3, 128
    buf = randn((T, 3 * H * D + 3), torch.bfloat16, device)
    x = buf[:, 3: 3 + H * D].view(T, H, D)
    w = (1 + 0.5 * torch.randn(D, device=device)).to(torch.bfloat16).requires_grad_()
    pos = torch.randint(0, 70000, (T,), device=device)
    xr = x.detach().clone().requires_grad_()
    y = rope_ext.rms_norm_rope(xr, w, pos, layout="thd")
    w64 = w.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    r = rms_norm_rope_float64(x64, w64, pos, layout="thd")
    assert_close_f64(y, r, r.abs().max().item(), "strided x")
    g = randn(y.shape, torch.bfloat16, device)
    dx, dw = torch.autograd.grad(y, (xr, w), g)
    rdx, rdw = torch.autograd.grad(r, (x64, w64), g.double())
    assert_close_f64(dx, rdx, rdx.abs().max().item(), "strided dx")
    assert dw.dtype == torch.bfloat16
    err = (dw.double().cpu() - rdw.cpu()).abs()
    assert (err <= ulp(rdw.cpu(), torch.bfloat16) / 2 + 1e-5 * rdw.abs().max().item()).all(), err.max()
    if device == "cuda":
        with pytest.raises(ValueError, match="16-byte"):
            rope_ext.rms_norm_rope(x, w.detach(), pos, layout="thd", impl="tile")


@pytest.mark.parametrize("device", DEVICES)
def test_tile_backward_of_expanded_grad(device):
    """impl='tile' runs the backward too, whose grad from .sum() is an expanded view."""
    x = randn((2, 5, 3, 64), torch.float32, device).requires_grad_()
    w = (1 + 0.5 * torch.randn(64, device=device)).requires_grad_()
    rope_ext.rms_norm_rope(x, w, impl="tile").sum().backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    rms_norm_rope_float64(x64, w64).sum().backward()
    assert_close_f64(x.grad, x64.grad, x64.grad.abs().max().item(), "tile dx of .sum()")


def test_gradcheck_float64():
    q = torch.randn(1, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 1, 8, dtype=torch.float64, requires_grad=True)
    qw = (1 + 0.3 * torch.randn(8, dtype=torch.float64)).requires_grad_()
    kw = (1 + 0.3 * torch.randn(8, dtype=torch.float64)).requires_grad_()
    f = lambda q, k, qw, kw: rope_ext.rms_norm_rope_qk(q, k, qw, kw, rotary_dim=4, weight_offset=0.5)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, qw, kw))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_and_compile(device):
    q = randn((2, 4, 4, 64), torch.float32, device)
    k = randn((2, 4, 2, 64), torch.float32, device)
    qw, kw = _weights(64, device)
    opts = rope_ext.api._op_options("bshd", None, None, 10000.0, "auto", None, None, False, None, None)
    torch.library.opcheck(torch.ops.rope_ext.norm_rope, ([q, k], [qw, kw], 1e-6, 0.0, *opts))
    g = [randn(q.shape, torch.float32, device), randn(k.shape, torch.float32, device)]
    torch.library.opcheck(torch.ops.rope_ext.norm_rope_backward, (g, [q, k], [qw, kw], 1e-6, 0.0, *opts),
                          test_utils=("test_schema", "test_faketensor"))
    pos = torch.randint(0, 5000, (2, 4), device=device)
    f = torch.compile(lambda q, k: rope_ext.rms_norm_rope_qk(q, k, qw, kw, pos), fullgraph=True)
    got = f(q, k)
    want = rope_ext.rms_norm_rope_qk(q, k, qw, kw, pos)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_clear_errors(device):
    x = randn((1, 4, 2, 64), torch.float32, device)
    w = torch.ones(64, device=device)
    before = x.clone()
    with pytest.raises(ValueError, match=r"weight must have shape \[head_dim\] = \[64\]"):
        rope_ext.rms_norm_rope(x, torch.ones(32, device=device))
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        rope_ext.rms_norm_rope(x, [1.0] * 64)
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        rope_ext.rms_norm_rope(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="'auto', 'warp' or 'tile'"):
        rope_ext.rms_norm_rope(x, w, impl="fp32x4")
    with pytest.raises(ValueError, match="sections must sum to rotary_dim / 2"):
        rope_ext.rms_norm_rope(x, w, torch.zeros(3, 1, 4, dtype=torch.long, device=device), sections=[8, 8, 8])
    with pytest.raises(ValueError, match="up to 512"):
        rope_ext.rms_norm_rope(randn((1, 1, 1, 1024), torch.float32, device), torch.ones(1024, device=device))
    with pytest.raises(ValueError, match="q_weight must have shape"):
        rope_ext.rms_norm_rope_qk(x, x, torch.ones(63, device=device), w)
    if device == "cuda":
        with pytest.raises(TypeError, match="float64 on the CPU only"):
            rope_ext.rms_norm_rope(x.double(), w.double())
        with pytest.raises(ValueError, match="weight must be on"):
            rope_ext.rms_norm_rope(x, w.cpu())
    assert torch.equal(x, before)


@pytest.mark.parametrize("path", ["eager", "op"])
def test_double_backward_raises(path):
    """The fused backward has no derivative: differentiating it (through x, w or grad_out)
    is an error on both paths, never a second derivative computed as if it were constant."""
    x = torch.randn(1, 3, 2, 16, dtype=torch.float64, requires_grad=True)
    w = (1 + 0.3 * torch.randn(16, dtype=torch.float64)).requires_grad_()
    opts = rope_ext.api._op_options("bshd", None, None, 10000.0, "auto", None, None, False, None, None)
    f = (lambda a, b: rope_ext.rms_norm_rope(a, b)) if path == "eager" else \
        (lambda a, b: torch.ops.rope_ext.norm_rope([a], [b], 1e-6, 0.0, *opts)[0])
    gx, gw = torch.autograd.grad(f(x, w).sum(), (x, w), create_graph=True)
    assert torch.equal(gx, torch.autograd.grad(f(x, w).sum(), x)[0])  # the first derivative itself is fine
    with pytest.raises(RuntimeError, match="norm_rope_backward is not implemented"):
        (gx ** 2).sum().backward()
