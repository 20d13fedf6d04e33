"""Forced split counts for attention_decode over fp8 and bf16 caches (issue 20, NOTES run
3): where the split rule, tuned on bf16 rows, leaves fp8 time on the table.

    python bench/fp8_splits.py        # CUDA only; µs per call in a CUDA graph, cold L2
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rope_ext  # noqa: E402
from timing import graph_us  # noqa: E402

if not torch.cuda.is_available():
    sys.exit("bench/fp8_splits.py needs a GPU")
Hq, Hk, D, dev = 32, 8, 128, "cuda"
ks, vs = torch.full((Hk,), 0.02, device=dev), torch.full((1,), 0.02, device=dev)
print(f"{'B':>3} {'ctx':>6} {'cache':>5} " + "".join(f"{s if s else 'auto':>8}" for s in (0, 1, 2, 4, 8, 16, 32, 64)))
for B, ctx in ((1, 2048), (1, 8192), (8, 2048), (8, 8192), (8, 32768), (64, 8192)):
    kc = torch.randn(B, ctx, Hk, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    lens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
    for name, k, v, kw in (("bf16", kc, vc, {}), ("fp8", (kc / 0.02).to(torch.float8_e4m3fn),
                                                   (vc / 0.02).to(torch.float8_e4m3fn), dict(k_scale=ks, v_scale=vs))):
        ts = [graph_us(lambda s=s: rope_ext.attention_decode(q, k, v, lens, max_seqlen=ctx, num_splits=s or None,
                                                             **kw), 50) for s in (0, 1, 2, 4, 8, 16, 32, 64)]
        print(f"{B:>3} {ctx:>6} {name:>5} " + "".join(f"{t:>8.1f}" for t in ts), flush=True)
