"""rope_ext.inv_freq against the HF transformers formulas, written out here again
(no transformers install, no network)."""
import math

import pytest
import torch

import rope_ext


def hf_default(dim, base):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def test_default_is_the_kernels_definition():
    for R, base in [(128, 10000.0), (64, 500000.0), (10, 1e6)]:
        f = rope_ext.inv_freq(R, base)
        assert f.dtype == torch.float32 and f.shape == (R // 2,)
        assert torch.equal(f, hf_default(R, base).float())


def test_linear():
    f = rope_ext.inv_freq(64, 10000.0, {"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(f.double(), hf_default(64, 10000.0) / 4.0, rtol=1e-7, atol=0)


def test_dynamic_ntk():
    sc = {"type": "dynamic", "factor": 2.0}
    f = rope_ext.inv_freq(64, 10000.0, sc, max_position_embeddings=4096, seq_len=16384)
    base = 10000.0 * ((2.0 * 16384 / 4096) - (2.0 - 1)) ** (64 / 62)
    torch.testing.assert_close(f.double(), hf_default(64, base), rtol=1e-7, atol=0)
    # At or below the trained length it is the default.
    f0 = rope_ext.inv_freq(64, 10000.0, sc, max_position_embeddings=4096, seq_len=100)
    torch.testing.assert_close(f0.double(), hf_default(64, 10000.0), rtol=1e-7, atol=0)


def test_llama3():
    sc = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    f = rope_ext.inv_freq(128, 500000.0, sc).double()
    base_f = hf_default(128, 500000.0)
    for i, f0 in enumerate(base_f.tolist()):
        wl = 2 * math.pi / f0
        if wl < 8192 / 4.0:
            want = f0
        elif wl > 8192 / 1.0:
            want = f0 / 8.0
        else:
            s = (8192 / wl - 1.0) / (4.0 - 1.0)
            want = (1 - s) * f0 / 8.0 + s * f0
        assert math.isclose(f[i].item(), want, rel_tol=1e-7), i


def test_yarn():
    sc = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    f, att = rope_ext.inv_freq(64, 10000.0, sc, return_attention_factor=True)
    assert math.isclose(att, 0.1 * math.log(4.0) + 1.0)
    dim, base = 64, 10000.0

    def cdim(rot):
        return dim * math.log(4096 / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(cdim(32)), 0), min(math.ceil(cdim(1)), dim - 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra = 1 - ramp
    want = (1 / (4.0 * pos_freqs)) * (1 - extra) + (1 / pos_freqs) * extra
    torch.testing.assert_close(f.double(), want, rtol=1e-7, atol=0)
    _, att2 = rope_ext.inv_freq(64, 10000.0, dict(sc, mscale=1.0, mscale_all_dim=0.5), return_attention_factor=True)
    assert math.isclose(att2, (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1))


def test_longrope():
    long_f, short_f = [1.0 + i / 10 for i in range(16)], [1.0 + i / 100 for i in range(16)]
    sc = {"rope_type": "longrope", "long_factor": long_f, "short_factor": short_f,
          "original_max_position_embeddings": 4096}
    f_short, att = rope_ext.inv_freq(32, 10000.0, sc, max_position_embeddings=131072, return_attention_factor=True)
    f_long = rope_ext.inv_freq(32, 10000.0, sc, max_position_embeddings=131072, seq_len=8192)
    shape = torch.arange(0, 32, 2, dtype=torch.float64) / 32
    torch.testing.assert_close(f_short.double(), 1 / (torch.tensor(short_f, dtype=torch.float64) * 10000.0 ** shape), rtol=1e-7, atol=0)
    torch.testing.assert_close(f_long.double(), 1 / (torch.tensor(long_f, dtype=torch.float64) * 10000.0 ** shape), rtol=1e-7, atol=0)
    assert math.isclose(att, math.sqrt(1 + math.log(32) / math.log(4096)))


@pytest.mark.parametrize("bad, pattern", [
    (dict(rotary_dim=7), "rotary_dim"),
    (dict(scaling={"rope_type": "weird"}), "unknown rope_scaling"),
    (dict(scaling={"rope_type": "linear"}), "needs 'factor'"),
    (dict(base=-2.0), "base"),
])
def test_inv_freq_errors(bad, pattern):
    kw = dict(rotary_dim=64)
    kw.update(bad)
    with pytest.raises(ValueError, match=pattern):
        rope_ext.inv_freq(**kw)
