"""Probe: how C++ errors surface on this torch (direct op call vs the autograd wrapper)."""
import sys
import torch
import rope_ext
ops = torch.ops.rope_ext
dev = sys.argv[1]
x = torch.randn(2, 4, 2, 34, device=dev)
def args(**kw):
    a = dict(positions=None, offsets=None, cu_seqlens=None, inv_freq=None, cos_sin_cache=None, offset=0,
             base=10000.0, rotary_dim=7, interleaved=False, inverse=False, impl="auto")
    a.update(kw)
    return list(a.values())
for what, fn in [("direct rope_ (no autograd kernel)", lambda: ops.rope_(x, *args())),
                 ("direct rope via dispatcher, no grad", lambda: ops.rope(x, *args())),
                 ("type error direct", lambda: ops.rope(x.int(), *args())),
                 ("apply_rope odd rotary", lambda: rope_ext.apply_rope(x, rotary_dim=7))]:
    try:
        fn()
        print(dev, what, ": NO ERROR")
    except Exception as e:
        print(dev, what, ":", type(e).__name__, str(e).splitlines()[0][:70], flush=True)
