"""RotaryEmbedding, CUDA-graph capture, streams, and tensors past 2^31 elements."""
import pytest
import torch

import rope_ext
from rope_ext import reference as ref
from conftest import assert_close_f64, randn

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("cfg", [
    dict(),
    dict(rotary_dim=32, interleaved=True),
    dict(base=500000.0, scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
    dict(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}, max_position=4096),
    dict(scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}),  # factor in kernel
    dict(max_position=4096),
])
def test_rotary_embedding(device, cfg):
    m = rope_ext.RotaryEmbedding(64, **cfg).to(device)
    assert m.state_dict() == {}, "buffers must be non-persistent"
    q, k = randn((2, 16, 4, 64), torch.float32, device), randn((2, 16, 2, 64), torch.float32, device)
    pos = torch.randint(0, 4096, (2, 16), device=device)
    qo, ko = m(q, k, pos)
    f = m.inv_freq
    kw = dict(rotary_dim=m.rotary_dim, interleaved=m.interleaved, inv_freq=f)
    att = m.attention_factor
    assert_close_f64(qo, att * ref.rope_float64(q, pos, **kw), 8.0, "q")
    assert_close_f64(ko, att * ref.rope_float64(k, pos, **kw), 8.0, "k")


@cuda
def test_cuda_graph_capture():
    """No host synchronization inside: the op captures into a CUDA graph and replays
    with new inputs written into the captured buffers."""
    q, k = randn((4, 8, 32, 128), torch.bfloat16, "cuda"), randn((4, 8, 8, 128), torch.bfloat16, "cuda")
    pos = torch.randint(0, 100000, (4, 8), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            rope_ext.apply_rope_qk(q, k, pos)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        qo, ko = rope_ext.apply_rope_qk(q, k, pos)
        rope_ext.apply_rope(q, pos, inplace=True, impl="fp32")
    for _ in range(2):
        q.copy_(randn(q.shape, q.dtype, "cuda"))
        k.copy_(randn(k.shape, k.dtype, "cuda"))
        pos.copy_(torch.randint(0, 100000, pos.shape, device="cuda"))
        q0 = q.clone()
        g.replay()
        torch.cuda.synchronize()
        assert_close_f64(qo, ref.rope_float64(q0, pos), 8.0, "graph q")
        assert_close_f64(ko, ref.rope_float64(k, pos), 8.0, "graph k")
        assert_close_f64(q, ref.rope_float64(q0, pos), 8.0, "graph in-place q")


@cuda
@pytest.mark.parametrize("base", [12345.0, 23456.0])
def test_cuda_graph_capture_cold_frequency_table(base):
    """A base never used before, first called inside a capture: the kernels read the
    frequencies from a cached device tensor, which cannot be created while capturing;
    the op must then take the params' table (same values) instead of failing, and a
    later eager call (which creates the tensor) must give the bit-identical result."""
    x = randn((2, 8, 4, 64), torch.float32, "cuda")
    pos = torch.randint(0, 100000, (2, 8), device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = rope_ext.apply_rope(x, pos, base=base)
    x0 = randn(x.shape, x.dtype, "cuda")
    x.copy_(x0)
    g.replay()
    torch.cuda.synchronize()
    assert_close_f64(out, ref.rope_float64(x0, pos, base=base), 8.0, "graph, cold table")
    assert torch.equal(out, rope_ext.apply_rope(x0, pos, base=base)), "params table vs device tensor"


@cuda
def test_runs_on_current_stream():
    """x is produced on a side stream after a long GPU sleep; the op must queue behind it
    on that stream (a launch on another stream would read x too early)."""
    s = torch.cuda.Stream()
    x = torch.empty(2, 64, 8, 128, device="cuda")
    src = randn(x.shape, torch.float32, "cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # ~30 ms
        x.copy_(src)
        out = rope_ext.apply_rope(x)
    s.synchronize()
    assert_close_f64(out, ref.rope_float64(src), src.abs().max().item(), "side stream")


@cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu():
    x = randn((2, 16, 4, 64), torch.float32, "cuda:1")
    out = rope_ext.apply_rope(x)
    assert out.device == x.device
    assert_close_f64(out, ref.rope_float64(x), x.abs().max().item(), "cuda:1")
    with pytest.raises(ValueError, match="positions must be on cuda:1"):
        rope_ext.apply_rope(x, torch.arange(16, device="cuda:0"))


def _every_op_cases():
    """(name, build): build(dev, gen) makes the inputs on `dev` from the CPU generator `gen`
    and returns a call that runs one op and returns what it wrote (outputs, and the
    tensors it updates in place: q, caches). One case per kernel family and merge road."""
    fp8 = torch.float8_e4m3fn

    def r(gen, shape, dev, dtype=torch.bfloat16):
        return (torch.randn(shape, generator=gen) * 2).to(dtype).to(dev)

    def pos(gen, hi, shape, dev):
        return torch.randint(0, hi, shape, generator=gen).to(dev)

    def rope(dev, gen):
        x, p = r(gen, (2, 33, 8, 128), dev), pos(gen, 1 << 20, (2, 33), dev)
        return lambda: [rope_ext.apply_rope(x, p)]

    def rope_thd_inplace(dev, gen):
        x, cu = r(gen, (40, 4, 64), dev, torch.float32), torch.tensor([0, 7, 40], dtype=torch.int32).to(dev)
        return lambda: [rope_ext.apply_rope(x, layout="thd", cu_seqlens=cu, inplace=True), x]

    def rope_qk_inplace(dev, gen):
        q, k, p = r(gen, (3, 17, 8, 64), dev), r(gen, (3, 17, 2, 64), dev), pos(gen, 5000, (3, 17), dev)
        return lambda: [*rope_ext.apply_rope_qk(q, k, p, inplace=True), q, k]

    def norm_rope(dev, gen):
        x, w = r(gen, (2, 9, 4, 128), dev), r(gen, (128,), dev)
        return lambda: [rope_ext.rms_norm_rope(x, w)]

    def mrope(dev, gen):
        q, k, p = r(gen, (2, 11, 4, 64), dev), r(gen, (2, 11, 2, 64), dev), pos(gen, 40000, (3, 2, 11), dev)
        return lambda: list(rope_ext.apply_mrope(q, k, p, [4, 14, 14]))

    def axial(dev, gen):
        x, p = r(gen, (35, 3, 64), dev, torch.float32), pos(gen, 9, (35, 2), dev)
        return lambda: [rope_ext.apply_rope_axial(x, p, layout="thd", base=100.0)]

    def append(dev, gen, paged=False, fp8_cache=False):
        T, Hq, Hk, D, cap = 6, 8, 2, 128, 32
        k, v, q = r(gen, (T, Hk, D), dev), r(gen, (T, Hk, D), dev), r(gen, (T, Hq, D), dev)
        cu = torch.tensor([0, 2, 6], dtype=torch.int32).to(dev)
        sl = torch.tensor([3, 17], dtype=torch.int32).to(dev)
        kw = {}
        if paged:
            bt = torch.randperm(2 * cap // 16, generator=gen).view(2, cap // 16).to(torch.int32).to(dev)
            shape, kw["block_table"] = (2 * cap // 16, 16, Hk, D), bt
        else:
            shape = (2, cap, Hk, D)
        cdt = fp8 if fp8_cache else torch.bfloat16
        kc, vc = torch.zeros(shape, device=dev).to(cdt), torch.zeros(shape, device=dev).to(cdt)
        if fp8_cache:
            kw.update(k_scale=torch.tensor([0.05, 0.04]).to(dev), v_scale=torch.tensor([0.03]).to(dev))
        return lambda: [kc, vc, q] if rope_ext.append_kv(k, v, kc, vc, sl, q=q, cu_seqlens=cu, **kw) is None else []

    def decode(dev, gen, B=1, ctx=2048, paged=False, fp8_cache=False, step=False, cluster=None, **kw):
        Hq, Hk, D = 32, 8, 128
        q = r(gen, (B, 1, Hq, D), dev)
        kc, vc = r(gen, (B, ctx, Hk, D), dev), r(gen, (B, ctx, Hk, D), dev)
        sl = torch.randint(ctx // 2, ctx - 1, (B,), generator=gen).to(torch.int32).to(dev)
        if paged:
            kc, vc = kc.view(B * ctx // 16, 16, Hk, D), vc.view(B * ctx // 16, 16, Hk, D)
            kw["block_table"] = torch.randperm(B * ctx // 16, generator=gen).view(B, ctx // 16).to(torch.int32).to(dev)
        if fp8_cache:
            kc, vc = (kc * 10).to(fp8), (vc * 10).to(fp8)
            kw.update(k_scale=torch.tensor([0.1]).to(dev), v_scale=torch.tensor([0.1]).to(dev))
        if step:
            kw.update(k=r(gen, (B, 1, Hk, D), dev), v=r(gen, (B, 1, Hk, D), dev))
        def call():
            o = rope_ext.attention_decode(q, kc, vc, sl, return_lse=True, max_seqlen=ctx, **kw)
            if cluster is not None:  # the merge road this case is for
                assert rope_ext._C.last_decode_plan()[1] == cluster, rope_ext._C.last_decode_plan()
            return [*o, kc, vc]
        return call

    def prefill(dev, gen):
        q, k, v = r(gen, (2, 40, 8, 64), dev), r(gen, (2, 40, 2, 64), dev), r(gen, (2, 40, 2, 64), dev)
        return lambda: [rope_ext.rope_attention(q, k, v, impl=i) for i in ("fused", "separate")]

    def mla(dev, gen):
        kv_c, k_pe, q = r(gen, (5, 128), dev), r(gen, (5, 64), dev), r(gen, (5, 4, 96), dev)
        cache = torch.zeros(4, 4, 192, device=dev).to(fp8)
        bt = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32).to(dev)
        sl, cu = torch.tensor([1, 6], dtype=torch.int32).to(dev), torch.tensor([0, 3, 5], dtype=torch.int32).to(dev)
        scale = torch.tensor([0.02]).to(dev)
        return lambda: [cache, q] if rope_ext.append_mla(kv_c, k_pe, cache, sl, block_table=bt, q_pe=q[..., 32:],
                                                         cu_seqlens=cu, scale=scale) is None else []

    return [("apply_rope", rope), ("apply_rope thd in place", rope_thd_inplace),
            ("apply_rope_qk in place", rope_qk_inplace), ("rms_norm_rope", norm_rope), ("apply_mrope", mrope),
            ("apply_rope_axial", axial), ("append_kv", append),
            ("append_kv paged fp8", lambda d, g: append(d, g, paged=True, fp8_cache=True)),
            ("decode B=1 (cluster merge)", lambda d, g: decode(d, g, cluster=True)),
            ("decode 32 splits (combine)", lambda d, g: decode(d, g, num_splits=32, cluster=False)),
            ("decode B=4 paged", lambda d, g: decode(d, g, B=4, ctx=512, paged=True)),
            ("decode fp8", lambda d, g: decode(d, g, fp8_cache=True)),
            ("decode one-call step", lambda d, g: decode(d, g, ctx=512, step=True)),
            ("decode hybrid_simt", lambda d, g: decode(d, g, ctx=512, impl="hybrid_simt")),
            ("rope_attention", prefill), ("append_mla fp8", mla)]


def _bits(t):
    """A tensor's bytes on the CPU (NaN == NaN, -0 != +0: bit equality)."""
    t = t.detach().contiguous().cpu()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


_EVERY_OP = _every_op_cases()


@cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("name, build", _EVERY_OP, ids=[c[0] for c in _EVERY_OP])
def test_second_gpu_every_op(name, build):
    """Every kernel family on a tensor of one GPU while the other is current: the launches
    must go to the tensors' device and stream (device guard), and give what the same call
    gives on the current device, bit for bit; the current device stays as it was. New
    outputs are poisoned (NaN until written: conftest's autouse fixture); the caches start
    at zero and must change."""
    if torch.cuda.get_device_name(0) != torch.cuda.get_device_name(1):
        pytest.skip("two different GPUs: the split plans (and so the bits) may differ")
    got, out = {}, []
    for dev, current in (("cuda:1", 0), ("cuda:0", 1)):
        with torch.cuda.device(current):
            call = build(dev, torch.Generator().manual_seed(7))
            out = call()
            assert out, f"{name}: nothing to compare (an op returned a value where None was expected)"
            assert torch.cuda.current_device() == current, f"{name}: the current device changed"
            torch.cuda.synchronize(dev)
            assert all(t.device == torch.device(dev) for t in out), f"{name}: an output is not on {dev}"
            got[dev] = [_bits(t) for t in out]
    assert len(got["cuda:1"]) == len(got["cuda:0"]), name
    for i, (a, b) in enumerate(zip(got["cuda:1"], got["cuda:0"])):
        assert torch.equal(a, b), f"{name}: tensor {i} differs between cuda:1 and cuda:0"
    for i, t in enumerate(out):  # NaN never passes (the inputs are finite, new outputs poisoned)
        assert torch.isfinite(t.float()).all(), f"{name}: tensor {i} holds a non-finite value"
        assert (t.float() != 0).any(), f"{name}: tensor {i} is all zeros (nothing written?)"


@cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_properties(0).total_memory < 24 * 2**30,
                    reason="needs ~10 GB of GPU memory")
@pytest.mark.parametrize("impl", rope_ext.IMPLS)
def test_more_than_2_31_elements(impl):
    """bf16 x of 2.2e9 elements (> 2^31): 64-bit indexing in every variant. Checks the
    first and the last tokens (beyond element 2^31) against float64."""
    H, D = 16, 128
    S = -(-2_200_000_000 // (H * D))  # 1,074,219 tokens, positions up to ~1.07e6
    x = torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16)
    assert x.numel() > 2**31
    out = rope_ext.apply_rope(x, impl=impl)
    for sl in (slice(0, 4), slice(S - 4, S)):
        pos = torch.arange(S, device="cuda")[sl]
        want = ref.rope_float64(x[:, sl], pos)
        assert_close_f64(out[:, sl], want, x[:, sl].abs().max().item(), f"tokens {sl}")
    del out
    # In place, same size: the first and last tokens (beyond element 2^31) against float64.
    ends = [(sl, x[:, sl].clone()) for sl in (slice(0, 4), slice(S - 4, S))]
    rope_ext.apply_rope(x, impl=impl if impl != "naive" else "auto", inplace=True)
    for sl, x0 in ends:
        want = ref.rope_float64(x0, torch.arange(S, device="cuda")[sl])
        assert_close_f64(x[:, sl], want, x0.abs().max().item(), f"in place, tokens {sl}")
