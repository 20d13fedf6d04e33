"""Frequencies bit-identical to the ones checkpoints were trained with (issue 10).

Three independent statements of the truth must agree with torch.equal (not allclose):
  - the HF transformers formulas, transcribed again here with the same operations, in
    the same order and dtypes as transformers' rope init functions;
  - transformers' real rope init functions, where transformers is installed;
  - the table the kernels use for `base` (built in C++, rope_ext._C.default_inv_freq),
    and the kernels' output with `base=` against `inv_freq=`.
"""
import math

import pytest
import torch

import rope_ext
from rope_ext import reference as ref
from conftest import assert_close_f64, randn

BASES = [10000.0, 500000.0, 1e6, 75000.0, 10000]  # rope_theta of Llama 2, Llama 3, Qwen, ..., an int
DIMS = [128, 96, 80, 64, 256, 10]


# ---------------------------------------------------------------------------- transcriptions
def hf_default(dim, base):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def hf_linear(dim, base, factor):
    f = hf_default(dim, base)
    f /= factor
    return f


def hf_dynamic(dim, base, factor, max_pos, seq_len):
    seq_len = max(seq_len, max_pos)
    base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def hf_yarn(dim, base, factor, orig, beta_fast=32, beta_slow=1, truncate=True):
    def cdim(n):
        return (dim * math.log(orig / (n * 2 * math.pi))) / (2 * math.log(base))
    low, high = cdim(beta_fast), cdim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extra = 1 - ramp.to(dtype=torch.float)
    return (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra


def hf_llama3(dim, base, factor, lo, hi, old):
    inv = hf_default(dim, base)
    wavelen = 2 * math.pi / inv
    f = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * f / factor + smooth * f
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, smoothed, f)


def hf_longrope(dim, base, ext):
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (torch.tensor(ext, dtype=torch.float32) * base**shape)


def scaled_cases(R):
    half = R // 2
    return [
        ("linear", {"rope_type": "linear", "factor": 4.0}, {}, hf_linear(R, 10000.0, 4.0)),
        ("dynamic", {"rope_type": "dynamic", "factor": 2.0}, dict(max_position_embeddings=4096, seq_len=16384),
         hf_dynamic(R, 10000.0, 2.0, 4096, 16384)),
        ("dynamic_short", {"type": "dynamic", "factor": 2.0}, dict(max_position_embeddings=4096, seq_len=100),
         hf_dynamic(R, 10000.0, 2.0, 4096, 100)),
        ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, {},
         hf_yarn(R, 10000.0, 4.0, 4096)),
        ("yarn_betas_notrunc", {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048,
                                "beta_fast": 16, "beta_slow": 2, "truncate": False}, {},
         hf_yarn(R, 10000.0, 8.0, 2048, 16, 2, False)),
        ("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}, {}, hf_llama3(R, 10000.0, 8.0, 1.0, 4.0, 8192)),
        ("longrope_short", {"rope_type": "longrope", "long_factor": [1 + i / 7 for i in range(half)],
                            "short_factor": [1 + i / 97 for i in range(half)], "original_max_position_embeddings": 4096,
                            "factor": 32.0}, dict(seq_len=100), hf_longrope(R, 10000.0, [1 + i / 97 for i in range(half)])),
        ("longrope_long", {"rope_type": "longrope", "long_factor": [1 + i / 7 for i in range(half)],
                           "short_factor": [1 + i / 97 for i in range(half)], "original_max_position_embeddings": 4096,
                           "factor": 32.0}, dict(seq_len=8192), hf_longrope(R, 10000.0, [1 + i / 7 for i in range(half)])),
    ]


@pytest.mark.parametrize("R", DIMS)
def test_default_matches_hf_formula_bitwise(R):
    for base in BASES:
        f = rope_ext.inv_freq(R, base)
        assert f.dtype == torch.float32 and f.shape == (R // 2,)
        assert torch.equal(f, hf_default(R, base)), (R, base)


def test_default_is_not_the_correctly_rounded_table():
    """The point of issue 10: the two definitions differ (19 of 64 entries for R = 128),
    and the correctly rounded one stays available as an opt-in."""
    hf, exact = rope_ext.inv_freq(128, 10000.0), rope_ext.inv_freq(128, 10000.0, correctly_rounded=True)
    assert torch.equal(exact, (10000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)).float())
    assert 10 <= int((hf != exact).sum()) <= 40
    with pytest.raises(ValueError, match="default frequencies only"):
        rope_ext.inv_freq(64, 10000.0, {"rope_type": "linear", "factor": 2.0}, correctly_rounded=True)


@pytest.mark.parametrize("R", [128, 96, 64])
def test_scaled_match_hf_formulas_bitwise(R):
    for name, sc, kw, want in scaled_cases(R):
        got = rope_ext.inv_freq(R, 10000.0, sc, **kw)
        assert got.dtype == torch.float32 and torch.equal(got, want), name


def test_attention_factors():
    _, att = rope_ext.inv_freq(64, 10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
                               return_attention_factor=True)
    assert att == 0.1 * math.log(4.0) + 1.0
    _, att2 = rope_ext.inv_freq(64, 10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                                              "mscale": 1.0, "mscale_all_dim": 0.5}, return_attention_factor=True)
    assert math.isclose(att2, (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1))
    sc = {"rope_type": "longrope", "long_factor": [1.0] * 16, "short_factor": [1.0] * 16,
          "original_max_position_embeddings": 4096}
    _, att3 = rope_ext.inv_freq(32, 10000.0, sc, max_position_embeddings=131072, return_attention_factor=True)
    assert math.isclose(att3, math.sqrt(1 + math.log(32) / math.log(4096)))


# ---------------------------------------------------------------------------- real transformers
def _hf_config(R, base, scaling, max_pos):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=4 * R, num_attention_heads=4, head_dim=R, rope_theta=base,
                       rope_scaling=dict(scaling) if scaling else None, max_position_embeddings=max_pos)


def _hf_init(config, kind, seq_len=None):
    from transformers import modeling_rope_utils as mru
    if kind == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        fn = getattr(LlamaRotaryEmbedding, "compute_default_rope_parameters", None) or mru.ROPE_INIT_FUNCTIONS["default"]
    else:
        fn = mru.ROPE_INIT_FUNCTIONS[kind]
    return fn(config, seq_len=seq_len) if seq_len is not None else fn(config)


@pytest.mark.parametrize("R", [128, 96, 80])
def test_against_installed_transformers(R):
    pytest.importorskip("transformers")
    for base in BASES:
        f, _ = _hf_init(_hf_config(R, base, None, 4096), "default")
        assert torch.equal(rope_ext.inv_freq(R, base), f), (R, base)
    for name, sc, kw, _ in scaled_cases(R):
        kind = sc.get("rope_type", sc.get("type"))
        max_pos = kw.get("max_position_embeddings", 131072 if kind == "longrope" else 4096)
        cfg = _hf_config(R, 10000.0, sc, max_pos)
        f_hf, att_hf = _hf_init(cfg, kind, kw.get("seq_len"))
        f, att = rope_ext.inv_freq(R, 10000.0, sc, max_position_embeddings=max_pos, seq_len=kw.get("seq_len"),
                                   return_attention_factor=True)
        assert torch.equal(f, f_hf.to(torch.float32)), name
        assert math.isclose(att, float(att_hf), rel_tol=1e-12), (name, att, att_hf)


# ---------------------------------------------------------------------------- the kernels' table
@pytest.mark.parametrize("R", DIMS + [512, 300])
def test_kernel_table_is_hf(R):
    """The table the C++ op layer builds for `base` (kept in the params, or as a cached
    tensor past 128 pairs) is HF's, bit for bit."""
    for base in BASES:
        assert torch.equal(rope_ext._C.default_inv_freq(float(base), R), rope_ext.inv_freq(R, base)), (R, base)


@pytest.mark.parametrize("D", [128, 96, 512])
def test_base_equals_inv_freq_bitwise(device, D):
    """apply_rope(base=b) computes exactly what apply_rope(inv_freq=inv_freq(R, b)) does,
    in every variant (D = 512 takes the cached-tensor path), q+k and backward."""
    x = randn((2, 9, 3, D), torch.float32, device)
    pos = torch.randint(0, 1 << 20, (2, 9), device=device)
    for impl in rope_ext.IMPLS + ("auto",):
        for base in (10000.0, 500000.0):
            f = rope_ext.inv_freq(D, base, device=device)
            a = rope_ext.apply_rope(x, pos, base=base, impl=impl)
            assert torch.equal(a, rope_ext.apply_rope(x, pos, inv_freq=f, impl=impl)), (impl, base)
    assert_close_f64(rope_ext.apply_rope(x, pos), ref.rope_float64(x, pos, inv_freq=rope_ext.inv_freq(D)),
                     x.abs().max().item(), "base vs float64 with HF frequencies")


def test_module_default_frequencies_are_hf(device):
    m = rope_ext.RotaryEmbedding(128, base=500000.0)
    assert torch.equal(m.inv_freq, hf_default(128, 500000.0))


@pytest.mark.parametrize("bad, pattern", [
    (dict(rotary_dim=7), "rotary_dim"),
    (dict(scaling={"rope_type": "weird"}), "unknown rope_scaling"),
    (dict(scaling={"rope_type": "linear"}), "needs 'factor'"),
    (dict(scaling={"rope_type": "dynamic", "factor": 2.0}), "max_position_embeddings"),
    (dict(scaling={"rope_type": "yarn", "factor": 2.0}), "original_max_position_embeddings"),
    (dict(scaling={"rope_type": "longrope", "long_factor": [1.0], "short_factor": [1.0],
                   "original_max_position_embeddings": 8, "factor": 2.0}), "entries"),
    (dict(base=-2.0), "base"),
    (dict(base=float("inf")), "base"),
])
def test_inv_freq_errors(bad, pattern):
    kw = dict(rotary_dim=64)
    kw.update(bad)
    with pytest.raises(ValueError, match=pattern):
        rope_ext.inv_freq(**kw)
