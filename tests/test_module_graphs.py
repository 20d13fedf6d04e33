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
