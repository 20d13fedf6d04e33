"""One call of one workload, for ncu:  ncu --set full python bench/profile_one.py w1 fp32x4
    small [S]: bshd bf16 [1, S, 32, 128] (S = 8: 64 KB; issue 19's 0.12 MB point is S = 16)
    w5: thd bf16 q [16, 32, 128] + k [16, 8, 128] in place, random positions < 131072
Three calls (the last is the one to profile: ncu --launch-skip 2 --launch-count 1)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402

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
elif w == "small":  # bshd [1, S, 32, 128] bf16 (latency-bound); S = 8 is the sweep's 64 KB point
    from rope_ext import reference as ref
    S = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    x = torch.randn(1, S, 32, 128, device="cuda").bfloat16()
    if impl == "compile":
        f = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
        emb = torch.cat([torch.arange(S, device="cuda").float()[:, None] * f] * 2, -1)
        cos, sin = emb.cos().bfloat16()[:, None, :], emb.sin().bfloat16()[:, None, :]
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        fn = lambda: comp(x, cos, sin)  # noqa: E731
    else:
        fn = lambda: rope_ext.apply_rope(x, impl=impl)  # noqa: E731
elif w == "w5":  # decode step: q + k thd in place, one launch
    q = torch.randn(16, 32, 128, device="cuda").bfloat16()
    k = torch.randn(16, 8, 128, device="cuda").bfloat16()
    pos = torch.randint(0, 131072, (16,), device="cuda")
    fn = lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", impl=impl, inplace=True)  # noqa: E731
else:
    raise SystemExit(f"unknown workload {w}")
for _ in range(3):
    fn()
torch.cuda.synchronize()
