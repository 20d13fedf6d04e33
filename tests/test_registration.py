"""The torch op layer: opcheck on every op, autograd gradcheck (float64, CPU),
torch.compile(fullgraph=True) with no graph break, matching eager."""
import pytest
import torch

import rope_ext
from rope_ext import reference as ref
from conftest import assert_close_f64, randn
from rope_ext._args import op_options

OPS = torch.ops.rope_ext


def opts(cache=None, **values):
    """The rope ops' options by name, in the compiled schema's order (rope_ext._args.op_options)."""
    return op_options(cos_sin_cache=cache, **values)


def samples(device):
    x = randn((2, 8, 3, 32), torch.float32, device)
    k = randn((2, 8, 1, 32), torch.float32, device)
    pos = torch.randint(0, 1000, (2, 8), device=device)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)
    return [
        ("rope", (x, *opts())),
        ("rope", (x, *opts(positions=pos, rotary_dim=16, interleaved=True))),
        ("rope", (x[:1].transpose(0, 1).contiguous().transpose(0, 1), *opts(cu_seqlens=cu, offsets=torch.tensor([2, 5], device=device)))),
        ("rope", (x, *opts(inv_freq=rope_ext.inv_freq(32, 500.0, device=device), inverse=True))),
        ("rope", (x, *opts(cache=ref.cos_sin_table(32, 10000.0, 1000, device), positions=pos))),
        ("rope_", (x.clone(), *opts(positions=pos))),
        ("rope_qk", (x, k, *opts(positions=pos))),
        ("rope_qk_", (x.clone(), k.clone(), *opts(offset=7))),
        ("rope_qk", (x, k, *opts(cp_size=2, cp_rank=1, scale=1.25))),
        ("rope_qk", (x, k, *opts(positions=torch.randint(0, 99, (3, 2, 8), device=device), sections=(4, 6, 6),
                                 sections_interleaved=True))),
    ]


@pytest.mark.parametrize("i", range(10))
def test_opcheck(device, i):
    name, args = samples(device)[i]
    if name in ("rope", "rope_qk"):
        args = (args[0].detach().requires_grad_(),) + args[1:] if name == "rope" else \
            (args[0].detach().requires_grad_(), args[1].detach().requires_grad_()) + args[2:]
    torch.library.opcheck(getattr(OPS, name).default, args)


def test_gradcheck_float64_cpu():
    x = torch.randn(2, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.randint(0, 50, (2, 5))
    for kw in [{}, dict(positions=pos, rotary_dim=4), dict(interleaved=True, offsets=3), dict(layout="sbhd")]:
        assert torch.autograd.gradcheck(lambda t: rope_ext.apply_rope(t, **kw), (x,))
    k = torch.randn(2, 5, 1, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: rope_ext.apply_rope_qk(a, b, pos), (x, k))


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
def test_double_backward_float64_cpu(layout):
    """Eager calls that need grad run through rope_ext._C.rope_direct (api._DirectRope);
    with create_graph its backward must be recorded too (a gradient penalty through
    grad_out), as the op path's is, not silently constant."""
    shape = {"bshd": (2, 5, 2, 8), "bhsd": (2, 2, 5, 8), "thd": (5, 2, 8)}[layout]
    kw = dict(layout=layout, cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32)) if layout == "thd" else \
        dict(layout=layout)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    k = torch.randn(shape[:-2] + (1, 8) if layout != "bhsd" else (2, 1, 5, 8), dtype=torch.float64,
                    requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda t: rope_ext.apply_rope(t, **kw), (x,))
    assert torch.autograd.gradgradcheck(lambda a, b: rope_ext.apply_rope_qk(a, b, **kw), (x, k))


def _check_compiled(fn, *args, backend="aot_eager"):
    torch._dynamo.reset()
    eager = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    compiled = torch.compile(fn, fullgraph=True, backend=backend)(
        *[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    eager = eager if isinstance(eager, tuple) else (eager,)
    compiled = compiled if isinstance(compiled, tuple) else (compiled,)
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)


def test_compile_fullgraph(device):
    x = randn((2, 16, 4, 64), torch.bfloat16, device)
    k = randn((2, 16, 2, 64), torch.bfloat16, device)
    pos = torch.randint(0, 4096, (2, 16), device=device)
    t = randn((32, 4, 64), torch.bfloat16, device)
    cu = torch.tensor([0, 10, 32], dtype=torch.int32, device=device)
    _check_compiled(lambda a, p: rope_ext.apply_rope(a, p) * 2, x, pos, backend="inductor")
    _check_compiled(lambda a, b, p: rope_ext.apply_rope_qk(a, b, p, interleaved=True), x, k, pos)
    _check_compiled(lambda a, c: rope_ext.apply_rope(a, layout="thd", cu_seqlens=c, rotary_dim=32), t, cu)

    def inplace(a, b, p):
        a = a + 0  # a non-leaf of the graph, rotated in place
        rope_ext.apply_rope_qk(a, b, p, inplace=True)
        return a, b
    _check_compiled(inplace, x, k, pos)


def test_compile_backward(device):
    """The compiled forward's backward (AOT autograd) is the rotation by -theta."""
    x = randn((2, 16, 4, 64), torch.float32, device)
    pos = torch.randint(0, 4096, (2, 16), device=device)
    g = randn(x.shape, x.dtype, device)
    torch._dynamo.reset()
    f = torch.compile(lambda a, p: rope_ext.apply_rope(a, p), fullgraph=True, backend="aot_eager")
    xl = x.clone().requires_grad_()
    f(xl, pos).backward(g)
    assert_close_f64(xl.grad, ref.rope_float64(g, pos, inverse=True), g.abs().max().item(), "compiled backward")


def _spy(monkeypatch, *names):
    """Counts the calls of rope_ext._C's eager entries `names` (which path a call took)."""
    calls = []
    for name in names:
        fn = getattr(rope_ext._C, name)
        monkeypatch.setattr(rope_ext._C, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    return calls


class _PassThroughMode(torch.overrides.TorchFunctionMode):
    """Any active mode sends rope_ext calls through the dispatcher (the op path)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd", "thd"])
def test_eager_fast_path_matches_op_path(device, layout, dense, monkeypatch):
    """Eager calls without autograd skip the dispatcher (rope_ext._C.rope_direct); they
    must give the op path's bits, layouts (strides too: rope_direct builds its [B, S, H, D]
    forms and its outputs' caller-layout forms without view ops) and version bumps, and
    fall back to it whenever a mode or a gradient needs the op. dense=False: q and k are
    slices of wider tensors (the outputs then take a fresh [B, S, H, D] layout)."""
    shape = {"bshd": (2, 8, 3, 64), "sbhd": (8, 2, 3, 64), "bhsd": (2, 3, 8, 64), "thd": (16, 3, 64)}[layout]
    hd = {"bhsd": 1, "thd": 1}.get(layout, 2)  # the heads' dimension
    wide = list(shape)
    wide[-1] = 64 if dense else 80
    cut = slice(0, 64) if dense else slice(8, 72)  # (sliced: a storage offset too)
    q = randn(tuple(wide), torch.bfloat16, device)[..., cut]
    wide[hd] = 1
    k = randn(tuple(wide), torch.bfloat16, device)[..., cut]
    pos = torch.randint(0, 1 << 20, shape[:1] if layout == "thd" else (8,), device=device)
    kw = dict(layout=layout, interleaved=True)
    calls = _spy(monkeypatch, "rope_direct")
    direct = rope_ext.apply_rope_qk(q, k, pos, **kw)
    assert calls == ["rope_direct"], calls
    with _PassThroughMode():
        via_op = rope_ext.apply_rope_qk(q, k, pos, **kw)
    assert calls == ["rope_direct"], calls
    for a, b, x in zip(direct, via_op, (q, k)):
        assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
        # A fresh tensor of its own, not a view of x or of anything autograd tracks.
        assert not a._is_view() and a._base is None and a.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes()
    with torch.inference_mode():
        inf = rope_ext.apply_rope_qk(q, k, pos, **kw)
    assert inf[0].is_inference() and inf[1].is_inference() and not direct[0].is_inference()
    assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(inf, direct))
    truth = ref.rope_float64(q, pos, layout=layout, interleaved=True)
    assert_close_f64(direct[0], truth, q.abs().max().item(), "fast path vs float64")

    a, b = q.clone(), k.clone()
    v = a._version
    rope_ext.apply_rope_qk(a, b, pos, inplace=True, **kw)
    assert a._version > v and torch.equal(a, direct[0]) and torch.equal(b, direct[1])
    with torch.inference_mode():
        c = q.clone()
        rope_ext.apply_rope(c, pos, inplace=True, **kw)
    assert torch.equal(c, direct[0])
    # A gradient to record: the autograd Function over the same entry (api._DirectRope).
    qg = q.float().requires_grad_()
    out = rope_ext.apply_rope(qg, pos, **kw)
    assert out.grad_fn is not None
    assert_close_f64(out, ref.rope_float64(qg.detach(), pos, layout=layout, interleaved=True), q.abs().max().item(),
                     "op path with autograd")
    k_before = k.clone()
    direct[1].add_(1.0)  # the outputs own their memory: k stays as it was
    assert torch.equal(k, k_before)


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd", "thd"])
def test_norm_rope_eager_matches_op_path(device, layout, dense, monkeypatch):
    """rms_norm_rope_qk's eager call without autograd (rope_ext._C.norm_rope_direct, which
    makes its [B, S, H, D] forms without view ops) gives the op path's bits and strides,
    fresh outputs, and inference tensors under inference mode; with a gradient to record
    it takes the autograd Function and still agrees."""
    shape = {"bshd": (2, 8, 3, 64), "sbhd": (8, 2, 3, 64), "bhsd": (2, 3, 8, 64), "thd": (16, 3, 64)}[layout]
    hd = {"bhsd": 1, "thd": 1}.get(layout, 2)
    wide = list(shape)
    wide[-1] = 64 if dense else 80
    cut = slice(0, 64) if dense else slice(8, 72)
    q = randn(tuple(wide), torch.float32, device)[..., cut]
    wide[hd] = 1
    k = randn(tuple(wide), torch.float32, device)[..., cut]
    wq, wk = randn((64,), torch.float32, device), randn((64,), torch.float32, device)
    pos = torch.randint(0, 1 << 20, shape[:1] if layout == "thd" else (8,), device=device)
    calls = _spy(monkeypatch, "norm_rope_direct")
    direct = rope_ext.rms_norm_rope_qk(q, k, wq, wk, pos, layout=layout)
    assert calls == ["norm_rope_direct"], calls
    with _PassThroughMode():
        via_op = rope_ext.rms_norm_rope_qk(q, k, wq, wk, pos, layout=layout)
    assert calls == ["norm_rope_direct"], calls
    for a, b, x in zip(direct, via_op, (q, k)):
        assert a.shape == x.shape and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
        assert not a._is_view() and a.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    with torch.inference_mode():
        inf = rope_ext.rms_norm_rope_qk(q, k, wq, wk, pos, layout=layout)
    assert all(a.is_inference() and torch.equal(a, b) for a, b in zip(inf, direct))
    qg = q.clone().requires_grad_()
    out = rope_ext.rms_norm_rope_qk(qg, k, wq, wk, pos, layout=layout)
    assert out[0].grad_fn is not None and torch.equal(out[0], direct[0]) and torch.equal(out[1], direct[1])
    # the float64 truth of q's output: RMSNorm over the head dim, then the rotation
    q64 = q.double()
    normed = q64 / torch.sqrt(q64.pow(2).mean(-1, keepdim=True) + 1e-6) * wq.double()
    assert_close_f64(direct[0], ref.rope_float64(normed, pos, layout=layout), normed.abs().max().item(), "norm + rope")


@pytest.mark.parametrize("paged", [False, True])
def test_attention_eager_matches_op_path(device, paged, monkeypatch):
    """append_kv, attention_decode and the decode step take rope_ext._C.<op>_direct for a
    plain eager call (no dispatcher; arguments in the schemas' order): the same caches,
    q, outputs and version bumps as the op path (any mode sends the call there)."""
    calls = _spy(monkeypatch, "append_kv_direct", "attention_decode_direct", "attention_decode_append_direct")
    B, T, Hq, Hk, D, cap = 2, 3, 4, 2, 64, 48
    dt = torch.bfloat16
    k, v = randn((B, T, Hk, D), dt, device), randn((B, T, Hk, D), dt, device)
    q = randn((B, T, Hq, D), dt, device)
    lens = torch.tensor([5, 17], dtype=torch.int32, device=device)
    if paged:  # blocks of 16 slots, shuffled
        bs, nb = 16, B * cap // 16
        kc, vc = randn((nb, bs, Hk, D), dt, device), randn((nb, bs, Hk, D), dt, device)
        table = torch.randperm(nb, device=device).to(torch.int32).view(B, cap // bs)
    else:
        kc, vc, table = randn((B, cap, Hk, D), dt, device), randn((B, cap, Hk, D), dt, device), None
    results = []
    for mode in (None, _PassThroughMode()):
        kc2, vc2, q2 = kc.clone(), vc.clone(), q.clone()
        versions = (kc2._version, vc2._version, q2._version)
        # options off their defaults, so that two swapped arguments of one type would show
        rot = dict(offsets=torch.tensor([3, 100], device=device), rotary_dim=32, interleaved=True,
                   attention_factor=1.5, block_table=table)
        with mode if mode is not None else torch.no_grad():
            rope_ext.append_kv(k, v, kc2, vc2, lens, q=q2, **rot)
            bumped = (kc2._version > versions[0], vc2._version > versions[1], q2._version > versions[2])
            o, lse = rope_ext.attention_decode(q2[:, -1:], kc2, vc2, lens + T, return_lse=True, softmax_scale=0.3,
                                               causal=False, max_seqlen=40, **rot)
            v0 = kc2._version
            step = rope_ext.attention_decode(q2[:, :1], kc2, vc2, lens + T, k=k[:, :1], v=v[:, :1], softmax_scale=0.2,
                                             **rot)
            bumped += (kc2._version > v0,)
        results.append((kc2, vc2, q2, o, lse, step, bumped))
        assert calls == ([] if mode else ["append_kv_direct", "attention_decode_direct",
                                          "attention_decode_append_direct"]), calls
        calls.clear()
    direct, via_op = results
    for a, b in zip(direct[:6], via_op[:6]):
        assert a.shape == b.shape and torch.equal(a, b)
    assert direct[6] == via_op[6] == (True, True, True, True)
    assert not torch.equal(direct[2], q) and torch.isfinite(direct[3].float()).all()


def test_eager_entries_refuse_what_raw_memory_misreads(device, monkeypatch):
    """The eager entries read raw memory: a negated view (the negative bit, e.g.
    z.conj().imag) takes the ops, which resolve it, and gives the right answer; a quantized
    tensor gets a TypeError (no crash); torch.jit.trace sees the op; an inference tensor
    written in place outside inference mode is refused before any kernel, unmodified."""
    x = randn((2, 8, 3, 64), torch.float32, device)
    neg = torch.complex(torch.zeros_like(x), x).conj().imag  # -x, lazily
    assert neg.is_neg()
    calls = _spy(monkeypatch, "rope_direct", "norm_rope_direct", "append_kv_direct", "attention_decode_direct")
    pos = torch.arange(8, device=device)
    for layout in ("sbhd", "bshd"):
        assert torch.equal(rope_ext.apply_rope(neg, layout=layout), rope_ext.apply_rope(-x, layout=layout))
    w = randn((64,), torch.float32, device)
    assert torch.equal(rope_ext.rms_norm_rope(neg, w, layout="sbhd"), rope_ext.rms_norm_rope(-x, w, layout="sbhd"))
    kc, vc = randn((2, 16, 3, 64), torch.float32, device), randn((2, 16, 3, 64), torch.float32, device)
    lens = torch.tensor([1, 4], dtype=torch.int32, device=device)
    kc2 = kc.clone()
    rope_ext.append_kv(neg[:, :1], x[:, :1], kc2, vc.clone(), lens)
    kc3 = kc.clone()
    rope_ext.append_kv(-x[:, :1], x[:, :1], kc3, vc.clone(), lens)
    assert torch.equal(kc2, kc3)
    assert calls.count("rope_direct") == 2 and "norm_rope_direct" in calls and calls.count("append_kv_direct") == 1, calls
    if device == "cpu":  # (quantized tensors are CPU tensors)
        qx = torch.quantize_per_tensor(torch.randn(2, 8, 3, 64), 0.1, 0, torch.quint8)
        for layout, t, p in (("sbhd", qx, None), ("thd", qx[0], pos), ("bshd", qx, None)):
            with pytest.raises(TypeError, match="float"):
                rope_ext.apply_rope(t, p, layout=layout)
    for code in (-1, len(rope_ext.LAYOUTS)):  # the entries' layout code, checked once (layout_info)
        with pytest.raises(ValueError, match="layout code"):
            rope_ext._C.rope_direct([x], code, False, *op_options())
        with pytest.raises(ValueError, match="layout code"):
            rope_ext._C.norm_rope_direct([x], [w], 1e-6, 0.0, code, *op_options())
    traced = torch.jit.trace(lambda a, p: rope_ext.apply_rope(a, p, layout="thd"), (x[0], pos))
    assert "rope_ext::" in str(traced.graph)
    y = randn((8, 3, 64), torch.float32, device)
    assert torch.equal(traced(y, pos), rope_ext.apply_rope(y, pos, layout="thd"))
    with torch.inference_mode():
        inf = x.clone()
    before = inf.clone()
    with pytest.raises((ValueError, RuntimeError), match="inference"):
        rope_ext.apply_rope(inf, pos, inplace=True)
    assert torch.equal(inf, before)


def test_vmap_takes_the_op_path(device):
    """Under torch.vmap the tensors are functorch wrappers that rope_ext._C.rope_direct
    cannot read: the call takes the op (PyTorch's batching fallback), equal to a loop."""
    x = randn((3, 2, 8, 2, 32), torch.float32, device)
    pos = torch.randint(0, 1000, (2, 8), device=device)
    got = torch.vmap(lambda t: rope_ext.apply_rope(t, pos))(x)
    assert torch.equal(got, torch.stack([rope_ext.apply_rope(t, pos) for t in x]))
