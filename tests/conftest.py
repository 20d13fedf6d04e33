"""Shared test setup: devices, input builders, and THE tolerance table.

Tolerances (stated once, used by every test):
  against the float64 ground truth (rope_ext.reference.rope_float64):
    float32  |out - ref| <= 2e-6 * max|x|          (in-kernel sin/cos, any position < 2^24)
    float64  |out - ref| <= 1e-6 * max|x|          (float64 x, fp32-accurate sin/cos)
    fp16/bf16 one rounding: |out - ref| <= ulp(ref)/2 + 2e-6 * max|x|
  against the fp32-angle references (rope_naive, rope_cached), positions < 2^13:
    |out - ref| <= REF_TOL[dtype] * max|x|  (the references' own fp32-angle error, ~2^13 * 2^-24,
    plus one rounding of each side in fp16/bf16)
NaN never passes: every comparison requires finite outputs where the reference is finite.
"""
import pytest
import torch

import rope_ext

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
IMPLS = rope_ext.IMPLS + ("auto",)
VECTOR_IMPLS = ("fp32x4", "fp32x4_tile", "flat")  # need 16-byte vector access (vector_ok)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ALL_DTYPES = DTYPES + [torch.float64]
F64_TOL = {torch.float32: 2e-6, torch.float64: 1e-6, torch.float16: 2e-6, torch.bfloat16: 2e-6}
REF_TOL = {torch.float32: 1e-3, torch.float64: 1e-3, torch.float16: 3e-3, torch.bfloat16: 2e-2}
MANTISSA = {torch.float16: 10, torch.bfloat16: 7}


def _impl_values(item):
    """The values of the test's `impl` parametrization (None if it has none)."""
    for m in item.iter_markers("parametrize"):
        names = m.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if "impl" in names:
            i = names.index("impl")
            return [v if len(names) == 1 else v[i] for v in m.args[1]]
    return None


def pytest_collection_modifyitems(config, items):
    """The CPU runs one path whatever rope variant `impl` names (csrc/cpu/rope_cpu.cpp; the
    variants are CUDA kernel strategies), so an impl matrix runs once on the CPU: impl="auto"
    (or, for a matrix of explicit variants only, its first one, whose host-side handling
    -- eligibility checks, the gradient copy of rope_ext._ops._grad_input -- is what
    differs by name). The full matrix runs on CUDA. The other CPU items are deselected."""
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        impl = params.get("impl")
        if params.get("device") == "cpu" and impl in rope_ext.IMPLS:
            values = _impl_values(item) or []
            first = "auto" if "auto" in values else (values[0] if values else impl)
            if impl != first:
                drop.append(item)
                continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every output is filled with NaN before its kernel runs: unwritten elements fail."""
    rope_ext._C.set_poison(True)
    yield
    rope_ext._C.set_poison(False)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def ulp(ref, dtype):
    """ulp of each float64 value in `dtype` (normal range; subnormal spacing below)."""
    info = torch.finfo(dtype)
    e = torch.floor(torch.log2(ref.abs().clamp_min(info.tiny)))
    return torch.exp2(e - MANTISSA[dtype])


def assert_close_f64(out, ref, x_scale, what=""):
    """out (any dtype) against the float64 truth, by the table above."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    o = out.double().cpu()
    r = ref.double().cpu()
    assert torch.isfinite(o).all() or not torch.isfinite(r).all(), f"{what}: non-finite output (unwritten/NaN)"
    err = (o - r).abs()
    bound = F64_TOL[out.dtype] * x_scale
    if out.dtype in MANTISSA:
        bound = bound + ulp(r, out.dtype) / 2
    bad = ~(err <= bound)  # NaN in err counts as bad
    assert not bad.any(), (f"{what}: {int(bad.sum())} elements out of tolerance; max err {err.max().item():.3e}, "
                           f"at ref {r[bad][0].item():.6g} out {o[bad][0].item():.6g}")


def assert_close_ref(out, ref, x_scale, what=""):
    """out against an fp32-angle reference (rope_naive / rope_cached)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype, ref.dtype)
    err = (out.double().cpu() - ref.double().cpu()).abs()
    bad = ~(err <= REF_TOL[out.dtype] * x_scale)
    assert not bad.any(), f"{what}: max err {err.max().item():.3e} vs reference"


def randn(shape, dtype, device, scale=2.0):
    """Fresh random values (never zeros), well inside every dtype's range."""
    return (torch.randn(shape, dtype=torch.float32, device=device) * scale).to(dtype)


def make_view(shape, dtype, device, kind):
    """A tensor of `shape` whose memory is:
    'contiguous'; 'slice' - one third of a fused projection (the last dim is cut from a
    3x wider buffer: rows strided, features unit-stride, as q of a fused qkv);
    'transposed' - features not innermost (stride(-1) != 1)."""
    if kind == "contiguous":
        return randn(shape, dtype, device)
    if kind == "slice":
        *lead, d = shape
        return randn((*lead, 3 * d), dtype, device)[..., d:2 * d]
    if kind == "transposed":
        return randn((*shape[:-2], shape[-1], shape[-2]), dtype, device).transpose(-1, -2)
    raise ValueError(kind)


def vector_ok(x, rotary_dim=None, interleaved=False, inplace=False):
    """Independent statement of when the VECTOR_IMPLS must accept x (16-byte vectors)."""
    V = 16 // x.element_size()
    D = x.shape[-1]
    R = rotary_dim or D
    if (R % V) if interleaved else ((R // 2) % V):
        return False
    if not inplace and (D - R) % V:
        return False
    if x.stride(-1) != 1 or x.data_ptr() % 16:
        return False
    return all(s % V == 0 for s, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1)
