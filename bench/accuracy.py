"""Accuracy at long positions against the truth a model expects: the exact rotation by
HF's float32 inverse frequencies (what checkpoints were trained with), in float64.

Columns, max |out - truth| / max|x|, for fp32 and bf16 x (and rope_ext's bf16 error in
ulps of each output: 0.5 is one correct rounding):
  rope_ext             sin/cos in the kernel (exact angle, reduced in double, accurate sincosf)
  fp32-angle table     cos/sin of the fp32 product pos * inv_freq, as HF eager and the
                       fp32 cos/sin caches of HF / vLLM compute them
  float64-built cache  an fp32 cos/sin table built from exact float64 angles, read by rope_ext
  correctly-rounded    rope_ext fed the correctly rounded frequencies (rope_ext's default
  freqs                before issue 10): every frequency off by up to an ulp drifts with
                       the position

    python bench/accuracy.py            # on CUDA if there is a GPU, else CPU
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
R, BASE, N = 128, 10000.0, 64
f32 = rope_ext.inv_freq(R, BASE, device=dev)
f_exact = rope_ext.inv_freq(R, BASE, correctly_rounded=True, device=dev)


def caches(pos):
    """The two cos/sin tables for positions pos (rows 0..N-1 map to pos)."""
    ang32 = pos.float()[:, None] * f32  # fp32 product, as HF/vLLM
    ang64 = pos.double()[:, None] * f32.double()
    return torch.cat([ang32.cos(), ang32.sin()], -1), torch.cat([ang64.cos(), ang64.sin()], -1).float()


def errs(x, pos, truth):
    table32, table64 = caches(pos[0])
    local = torch.arange(N, device=dev)[None]
    outs = [rope_ext.apply_rope(x, pos),
            rope_ext.apply_rope(x, local, cos_sin_cache=table32),
            rope_ext.apply_rope(x, local, cos_sin_cache=table64),
            rope_ext.apply_rope(x, pos, inv_freq=f_exact)]
    res = [(o.double() - truth).abs().max().item() / x.abs().max().item() for o in outs]
    if x.dtype == torch.bfloat16:
        ulp = torch.exp2(torch.floor(torch.log2(truth.abs().clamp_min(1e-30))) - 7)
        res.append(((outs[0].double() - truth).abs() / ulp).max().item())
    return res


print(f"device: {torch.cuda.get_device_name() if dev == 'cuda' else 'CPU'}; x [1, {N}, 4, {R}], base {BASE:g}; "
      "truth: float64 rotation by HF's float32 inverse frequencies")
cols = ["rope_ext", "fp32 table", "f64 cache", "exact freqs"]
print(f"{'':>9} {'fp32 x: max err / max|x|':^48} {'bf16 x: max err / max|x|':^48} rope_ext")
print(f"{'position':>9} " + "".join(f"{c:>12}" for c in cols) + " " + "".join(f"{c:>12}" for c in cols) + "  bf16 ulps")
for k in (10, 13, 16, 17, 20, 22, 24):
    p0 = 2**k - N
    pos = torch.arange(p0, p0 + N, device=dev)[None]
    x = torch.randn(1, N, 4, R, device=dev)
    e32 = errs(x, pos, ref.rope_float64(x, pos))
    xb = x.bfloat16()
    e16 = errs(xb, pos, ref.rope_float64(xb, pos))
    print(f"{'2^%d' % k:>9} " + "".join(f"{e:>12.2e}" for e in e32) + " " + "".join(f"{e:>12.2e}" for e in e16[:4])
          + f"{e16[4]:>11.2f}")
