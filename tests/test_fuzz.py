"""Property-based test: random shapes, strides, layouts, dtypes and options, every
variant, against float64. Bounded for CI (ROPE_EXT_FUZZ_EXAMPLES, default 80 per device)."""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rope_ext
from rope_ext import reference as ref
from conftest import DEVICES, assert_close_f64, make_view, vector_ok, VECTOR_IMPLS

EXAMPLES = int(os.environ.get("ROPE_EXT_FUZZ_EXAMPLES", "80"))


@st.composite
def cases(draw):
    layout = draw(st.sampled_from(rope_ext.LAYOUTS))
    B, S, H = draw(st.integers(1, 3)), draw(st.integers(1, 24)), draw(st.integers(1, 5))
    D = 2 * draw(st.integers(1, 48))
    R = 2 * draw(st.integers(1, D // 2))
    shape = {"bshd": (B, S, H, D), "sbhd": (S, B, H, D), "bhsd": (B, H, S, D), "thd": (B * S, H, D)}[layout]
    kw = dict(layout=layout, rotary_dim=R, interleaved=draw(st.booleans()))
    mode = draw(st.sampled_from(["default", "positions", "offsets", "inv_freq", "cache"]))
    return shape, kw, mode, draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])), \
        draw(st.sampled_from(["contiguous", "slice", "transposed"])), \
        draw(st.sampled_from(rope_ext.IMPLS + ("auto",))), draw(st.booleans()), draw(st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
def test_fuzz_against_float64(device, case):
    shape, kw, mode, dtype, view, impl, inplace, seed = case
    g = torch.Generator().manual_seed(seed)
    T = shape[0] if kw["layout"] == "thd" else None
    B = 1 if T else (shape[1] if kw["layout"] == "sbhd" else shape[0])
    S = T or (shape[0] if kw["layout"] == "sbhd" else shape[2] if kw["layout"] == "bhsd" else shape[1])
    if kw["layout"] == "thd":
        cuts = sorted(torch.randint(0, T + 1, (2,), generator=g).tolist())
        kw["cu_seqlens"] = torch.tensor([0, *cuts, T], dtype=torch.int32, device=device)
    R = kw["rotary_dim"]
    if mode == "positions":
        kw["positions"] = torch.randint(0, 2**24, (S,) if T else (B, S), generator=g).to(device)
        kw.pop("cu_seqlens", None)
    elif mode == "offsets":
        n = 3 if T else B
        kw["offsets"] = torch.randint(0, 10**6, (n,), generator=g).to(device)
    elif mode == "inv_freq":
        kw["inv_freq"] = (torch.rand(R // 2, generator=g) * 2).to(device)
    elif mode == "cache":
        kw["cos_sin_cache"] = ref.cos_sin_table(R, 10000.0, 64, device).to(dtype)
        kw["positions"] = torch.randint(0, 64, (S,) if T else (B, S), generator=g).to(device)
        kw.pop("cu_seqlens", None)
    torch.manual_seed(seed)
    x = make_view(shape, dtype, device, view)
    expect = ref.rope_float64(x, **kw)
    scale = x.abs().max().item()
    if impl == "naive" and inplace:
        with pytest.raises(ValueError, match="naive"):
            rope_ext.apply_rope(x, impl=impl, inplace=True, **kw)
        return
    if impl in VECTOR_IMPLS and not vector_ok(x, R, kw["interleaved"], inplace):
        with pytest.raises(ValueError, match=f"impl=.{impl}. needs 16-byte"):
            rope_ext.apply_rope(x, impl=impl, inplace=inplace, **kw)
        return
    out = rope_ext.apply_rope(x, impl=impl, inplace=inplace, **kw)
    assert (out is x) == inplace
    assert_close_f64(out, expect, scale, f"{case}")
