"""One call of one workload, for ncu:  ncu --set full python bench/profile_one.py w1 fp32x4"""
import sys

import torch

import rope_ext

w, impl = sys.argv[1], sys.argv[2]
if w == "w1" and impl == "compile":  # torch.compile's Triton kernel, for comparison
    from rope_ext import reference as ref
    x = torch.randn(4, 4096, 32, 128, device="cuda").bfloat16()
    f = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
    ang = torch.arange(4096, device="cuda").float()[:, None] * f
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().bfloat16()[:, None, :], emb.sin().bfloat16()[:, None, :]
    comp = torch.compile(ref.apply_cos_sin, dynamic=False)
    fn = lambda: comp(x, cos, sin)  # noqa: E731
elif w == "w1":
    x = torch.randn(4, 4096, 32, 128, device="cuda").bfloat16()
    fn = lambda: rope_ext.apply_rope(x, impl=impl)  # noqa: E731
elif w == "w3":
    x = torch.randn(128, 8192, 128, device="cuda")
    fn = lambda: rope_ext.rope(x, impl=impl)  # noqa: E731
elif w == "small":  # the sweep's 64 KB point, bshd [1, 8, 32, 128] bf16 (latency-bound)
    from rope_ext import reference as ref
    x = torch.randn(1, 8, 32, 128, device="cuda").bfloat16()
    if impl == "compile":
        f = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
        emb = torch.cat([torch.arange(8, device="cuda").float()[:, None] * f] * 2, -1)
        cos, sin = emb.cos().bfloat16()[:, None, :], emb.sin().bfloat16()[:, None, :]
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        fn = lambda: comp(x, cos, sin)  # noqa: E731
    else:
        fn = lambda: rope_ext.apply_rope(x, impl=impl)  # noqa: E731
else:
    raise SystemExit(f"unknown workload {w}")
for _ in range(3):
    fn()
torch.cuda.synchronize()
