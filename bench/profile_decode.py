"""Decode calls for ncu (issue 18: find where the time goes):

    ncu --profile-from-start off -k regex:decode python bench/profile_decode.py

Profiles one call of each decode variant at B = 1, ctx 512 (latency-bound) and B = 64,
ctx 8192 (bandwidth-bound), Hq 32, Hk 8, D 128, bf16, contiguous cache, after warm-up;
the profiler range covers only those calls."""
import torch

import rope_ext

Hq, Hk, D = 32, 8, 128
calls = []
for B, ctx in ((1, 512), (64, 8192)):
    kc = torch.randn(B, ctx, Hk, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    for impl in ("hybrid", "hybrid_simt"):
        calls.append(lambda q=q, kc=kc, vc=vc, lens=lens, impl=impl, ctx=ctx: rope_ext.attention_decode(
            q, kc, vc, lens, impl=impl, max_seqlen=ctx))
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
