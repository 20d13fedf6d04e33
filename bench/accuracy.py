"""Accuracy at long positions: max |out - float64| / max|x| for
  rope_ext (sin/cos in the kernel: exact angle, reduced in double, accurate sincosf),
  fp32 angles pos * inv_freq, as the HF eager formula and the fp32 cos/sin tables of
  HF / vLLM compute them (rope_naive; rope_cached gives the same numbers, but its
  table would need 2^24 rows here).
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
print(f"device: {torch.cuda.get_device_name() if dev == 'cuda' else 'CPU'}; x fp32 [1, 64, 4, 128], base 10000")
print(f"{'positions near':>16}{'rope_ext fp32':>15}{'fp32 angles':>13}{'rope_ext bf16 (ulps)':>22}")
for k in (10, 13, 16, 17, 20, 22, 24):
    p0 = 2**k - 64
    pos = torch.arange(p0, p0 + 64, device=dev)[None]
    x = torch.randn(1, 64, 4, 128, device=dev)
    want = ref.rope_float64(x, pos)
    scale = x.abs().max().item()
    e_ext = (rope_ext.apply_rope(x, pos).double() - want).abs().max().item() / scale
    e_hf = (ref.rope_naive(x, pos).double() - want).abs().max().item() / scale
    xb = x.bfloat16()
    wb = ref.rope_float64(xb, pos)
    ob = rope_ext.apply_rope(xb, pos).double()
    ulp = torch.exp2(torch.floor(torch.log2(wb.abs().clamp_min(1e-30))) - 7)
    e_b = ((ob - wb).abs() / ulp).max().item()
    print(f"{'2^%d' % k:>16}{e_ext:>15.2e}{e_hf:>13.2e}{e_b:>22.3f}")
