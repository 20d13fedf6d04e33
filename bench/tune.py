"""Temporary tuning sweep (env knobs read once per process): prints W1/W3 fwd µs."""
import statistics
import sys

import torch

import rope_ext

flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")


def t(fn, reps=30):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        flush.fill_(1)
        torch.cuda._sleep(1_000_000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


x1 = torch.randn(4, 4096, 32, 128, device="cuda").bfloat16()
x3 = torch.randn(128, 8192, 128, device="cuda")
q = torch.randn(8192, 32, 128, device="cuda").bfloat16()
k = torch.randn(8192, 8, 128, device="cuda").bfloat16()
pos = torch.randint(0, 131072, (8192,), device="cuda")
print(sys.argv[1:], "W1 %.1f  W3 %.1f  W4 %.1f" % (t(lambda: rope_ext.apply_rope(x1)), t(lambda: rope_ext.rope(x3)),
      t(lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True))))
