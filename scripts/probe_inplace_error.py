"""Probe: an in-place op refused inside the C++ kernel, per device (torch 2.11 crash hunt)."""
import sys
import torch
import rope_ext  # noqa: F401
dev = sys.argv[1]
e = torch.randn(1, 4, 2, 8, device=dev).expand(2, 4, 2, 8)
try:
    torch.ops.rope_ext.rope_(e, None, None, None, None, None, 0, 10000.0, -1, False, False, "auto")
except ValueError as err:
    print(dev, "ok: ValueError:", str(err)[:60])
x = torch.randn(2, 4, 2, 8, device=dev)
try:
    torch.ops.rope_ext.rope_(x, None, None, None, None, None, 0, 10000.0, -1, False, False, "naive")
except ValueError as err:
    print(dev, "ok naive: ValueError:", str(err)[:60])
