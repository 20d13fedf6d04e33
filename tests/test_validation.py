"""Bad input: a clear exception naming the argument, raised before any kernel runs,
inputs unmodified (and, on CUDA, the context still healthy afterwards)."""
import pytest
import torch

import rope_ext
from rope_ext import reference as ref
from conftest import randn

B, S, H, D = 2, 16, 2, 32


def cases(dev):
    x = randn((B, S, H, D), torch.float32, dev)
    t = randn((S * B, H, D), torch.float32, dev)
    i64 = dict(dtype=torch.int64, device=dev)
    cache = ref.cos_sin_table(D, 10000.0, 64, dev)
    return [
        # (what, callable, exception, message pattern)
        ("odd head dim", lambda: rope_ext.apply_rope(randn((B, S, H, 33), torch.float32, dev)), ValueError, "head dim.*even"),
        ("rotary_dim odd", lambda: rope_ext.apply_rope(x, rotary_dim=7), ValueError, "rotary_dim"),
        ("rotary_dim zero", lambda: rope_ext.apply_rope(x, rotary_dim=0), ValueError, "rotary_dim"),
        ("rotary_dim > D", lambda: rope_ext.apply_rope(x, rotary_dim=2 * D), ValueError, "rotary_dim"),
        ("rotary_dim float", lambda: rope_ext.apply_rope(x, rotary_dim=16.0), TypeError, "rotary_dim"),
        ("int x", lambda: rope_ext.apply_rope(torch.ones((B, S, H, D), dtype=torch.int32, device=dev)), TypeError, "x must be float"),
        ("not a tensor", lambda: rope_ext.apply_rope([1.0, 2.0]), TypeError, "x must be a torch.Tensor"),
        ("rank 3 for bshd", lambda: rope_ext.apply_rope(t), ValueError, "rank 4"),
        ("rank 4 for thd", lambda: rope_ext.apply_rope(x, layout="thd", positions=torch.arange(S, device=dev)), ValueError, "rank 3"),
        ("unknown layout", lambda: rope_ext.apply_rope(x, layout="bsdh"), ValueError, "layout must be one of"),
        ("unknown impl", lambda: rope_ext.apply_rope(x, impl="fast"), ValueError, "impl must be"),
        ("float positions", lambda: rope_ext.apply_rope(x, torch.zeros(S, device=dev)), TypeError, "positions must be an int32 or int64"),
        ("positions shape", lambda: rope_ext.apply_rope(x, torch.zeros(S + 1, **i64)), ValueError, "positions must have shape"),
        ("positions [B, S] wrong B", lambda: rope_ext.apply_rope(x, torch.zeros(B + 1, S, **i64)), ValueError, "positions must have shape"),
        ("positions and cu_seqlens", lambda: rope_ext.apply_rope(t, torch.zeros(S * B, **i64), layout="thd",
                                                                 cu_seqlens=torch.tensor([0, S * B], dtype=torch.int32, device=dev)), ValueError, "not both"),
        ("thd without positions", lambda: rope_ext.apply_rope(t, layout="thd"), ValueError, "cu_seqlens"),
        ("cu_seqlens float", lambda: rope_ext.apply_rope(t, layout="thd", cu_seqlens=torch.tensor([0.0, 32.0], device=dev)), TypeError, "cu_seqlens must be an int32 or int64"),
        ("cu_seqlens 2-D", lambda: rope_ext.apply_rope(t, layout="thd", cu_seqlens=torch.tensor([[0, 32]], device=dev)), ValueError, "cu_seqlens must be 1-D"),
        ("cu_seqlens with bshd", lambda: rope_ext.apply_rope(x, cu_seqlens=torch.tensor([0, 32], device=dev)), ValueError, "cu_seqlens needs layout='thd'"),
        ("offsets wrong length", lambda: rope_ext.apply_rope(x, offsets=torch.zeros(B + 1, **i64)), ValueError, "offsets must have shape"),
        ("offsets float", lambda: rope_ext.apply_rope(x, offsets=1.5), TypeError, "offsets must be an int"),
        # An int offset next to positions was silently ignored before one validation served every family.
        ("positions and int offsets", lambda: rope_ext.apply_rope(x, torch.zeros(S, **i64), offsets=5), ValueError,
         "positions or offsets, not both"),
        ("positions and tensor offsets", lambda: rope_ext.apply_rope(x, torch.zeros(S, **i64),
                                                                     offsets=torch.zeros(B, **i64)), ValueError,
         "positions or offsets, not both"),
        ("offsets float tensor", lambda: rope_ext.apply_rope(x, offsets=torch.zeros(B, device=dev)), TypeError, "offsets must be an int32 or int64"),
        ("two freq sources", lambda: rope_ext.apply_rope(x, inv_freq=rope_ext.inv_freq(D, device=dev), cos_sin_cache=cache), ValueError, "one frequency source"),
        ("base with inv_freq", lambda: rope_ext.apply_rope(x, base=500.0, inv_freq=rope_ext.inv_freq(D, device=dev)), ValueError, "one frequency source"),
        ("inv_freq length", lambda: rope_ext.apply_rope(x, inv_freq=rope_ext.inv_freq(D + 2, device=dev)), ValueError, "inv_freq must have shape"),
        ("inv_freq dtype", lambda: rope_ext.apply_rope(x, inv_freq=rope_ext.inv_freq(D, device=dev).double()), TypeError, "inv_freq must be float32"),
        ("cache width", lambda: rope_ext.apply_rope(x, cos_sin_cache=ref.cos_sin_table(D + 2, 10000.0, 64, dev)), ValueError, "cos_sin_cache must have shape"),
        ("cache int", lambda: rope_ext.apply_rope(x, cos_sin_cache=torch.zeros(64, D, dtype=torch.int32, device=dev)), TypeError, "cos_sin_cache must be float"),
        ("cache empty", lambda: rope_ext.apply_rope(x, cos_sin_cache=torch.zeros(0, D, device=dev)), ValueError, "cos_sin_cache has no rows"),
        ("base negative", lambda: rope_ext.apply_rope(x, base=-1.0), ValueError, "base must be"),
        ("q/k dtype", lambda: rope_ext.apply_rope_qk(x, x.half()), TypeError, "same dtype"),
        ("q/k shape", lambda: rope_ext.apply_rope_qk(x, randn((B, S + 1, H, D), torch.float32, dev)), ValueError, "agree in every dimension"),
        ("fp32x4 transposed", lambda: rope_ext.apply_rope(x.transpose(-1, -2).contiguous().transpose(-1, -2), impl="fp32x4"), ValueError, "fp32x4"),
    ]


CASE_NAMES = [c[0] for c in cases("cpu")]


@pytest.mark.parametrize("what", CASE_NAMES)
def test_bad_input_raises_clearly(device, what):
    case = {c[0]: c for c in cases(device)}[what]
    _, fn, exc, pattern = case
    with pytest.raises(exc, match=pattern):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()  # the context is still healthy
        assert torch.ones(1, device="cuda").add(1).item() == 2


def test_value_checks_cpu():
    """Checks of index values run on the host for CPU tensors (free there)."""
    x = randn((B, S, H, D), torch.float32, "cpu")
    t = randn((S, H, D), torch.float32, "cpu")
    cache = ref.cos_sin_table(D, 10000.0, 64, "cpu")  # exactly 64 rows
    before = x.clone()
    with pytest.raises(ValueError, match="positions must be >= 0"):
        rope_ext.apply_rope(x, torch.full((S,), -1))
    with pytest.raises(ValueError, match="offsets must be >= 0"):
        rope_ext.apply_rope(x, offsets=-3)
    with pytest.raises(ValueError, match=r"positions must be < 64 \(the rows of cos_sin_cache\)"):
        rope_ext.apply_rope(x, torch.full((S,), 64), cos_sin_cache=cache)
    with pytest.raises(ValueError, match=r"positions must be < 64"):
        rope_ext.apply_rope(x, offsets=50, cos_sin_cache=cache)  # 50 + S - 1 > 63
    rope_ext.apply_rope(x, offsets=48, cos_sin_cache=cache)      # 48 + 15 = 63: fine
    for cu, pat in [([1, 16], "start at 0"), ([0, 15], "end at T"), ([0, 10, 8, 16], "non-decreasing")]:
        with pytest.raises(ValueError, match=pat):
            rope_ext.apply_rope(t, layout="thd", cu_seqlens=torch.tensor(cu, dtype=torch.int32))
    assert torch.equal(x, before)


@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a GPU")
def test_cuda_inputs_on_other_device():
    x = randn((B, S, H, D), torch.float32, "cuda")
    with pytest.raises(ValueError, match="positions must be on cuda"):
        rope_ext.apply_rope(x, torch.arange(S))
    with pytest.raises(ValueError, match="q and k must be on the same device"):
        rope_ext.apply_rope_qk(x, x.cpu())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_cache_position_out_of_range_is_nan_not_oob():
    """On CUDA the range check needs the values on the host (a sync), so it is not run;
    the kernel still never reads past the cache: such rows come out NaN."""
    x = randn((1, 4, 2, D), torch.float32, "cuda")
    cache = ref.cos_sin_table(D, 10000.0, 8, "cuda")
    pos = torch.tensor([0, 7, 8, 1 << 40], device="cuda")
    for impl in rope_ext.IMPLS:
        out = rope_ext.apply_rope(x, pos, impl=impl, cos_sin_cache=cache)
        torch.cuda.synchronize()
        assert torch.isfinite(out[0, :2]).all() and torch.isnan(out[0, 2:]).all(), impl


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_value_checks_opt_in():
    x = randn((B, S, H, D), torch.float32, "cuda")
    cache = ref.cos_sin_table(D, 10000.0, 64, "cuda")
    rope_ext.set_value_checks(True)
    try:
        with pytest.raises(ValueError, match="positions must be >= 0"):
            rope_ext.apply_rope(x, torch.full((S,), -1, device="cuda"))
        with pytest.raises(ValueError, match="positions must be < 64"):
            rope_ext.apply_rope(x, torch.full((S,), 64, device="cuda"), cos_sin_cache=cache)
        with pytest.raises(ValueError, match="non-decreasing"):
            rope_ext.apply_rope(randn((S, H, D), torch.float32, "cuda"), layout="thd",
                                cu_seqlens=torch.tensor([0, 10, 8, S], dtype=torch.int32, device="cuda"))
    finally:
        rope_ext.set_value_checks(False)
    torch.cuda.synchronize()
