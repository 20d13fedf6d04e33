"""Why the latency suite's Liger column is faster than Liger elsewhere (issue 19, bench/NOTES.md,
evening of 2026-11-25): Liger's in-place rope timed with graph_us in one process, before
and after a torch.compile'd call of the cached formula has run and been timed (the
suite's column order: compile, then Liger), with the dirty and the clean flush, beside a
same-size copy. Needs no rope_ext build (torch, triton and Liger's wheel only).

    python bench/liger_order.py [--reps 100]
"""
import argparse
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import graph_us  # noqa: E402


def liger_rope():
    spec = importlib.util.find_spec("liger_kernel")
    path = os.path.join(list(spec.submodule_search_locations)[0], "ops", "rope.py")
    fspec = importlib.util.spec_from_file_location("_liger_rope", path)
    mod = importlib.util.module_from_spec(fspec)
    fspec.loader.exec_module(mod)
    return mod


def apply_cos_sin(x, cos, sin):  # the suite's torch.compile baseline (rope_ext.reference)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    args = ap.parse_args()
    lig = liger_rope()
    print(f"device: {torch.cuda.get_device_name()}; us, median of {args.reps} graph replays")
    for S in (256, 1024, 4096):
        H, D = 32, 128
        x = torch.randn(1, S, H, D, device="cuda").bfloat16()
        y = torch.empty_like(x)
        f = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device="cuda").float() / D))
        ang = torch.arange(S, device="cuda").float()[:, None] * f
        emb = torch.cat([ang, ang], -1)
        cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
        h = S // 2
        xt = x.view(S, H, D)
        qb, kb = xt[:h].unsqueeze(0).transpose(1, 2), xt[h:2 * h].unsqueeze(0).transpose(1, 2)
        c, s_ = cos[:h].unsqueeze(0).contiguous(), sin[:h].unsqueeze(0).contiguous()
        liger = lambda: lig.rope_forward(qb, kb, c, s_)  # noqa: E731
        row = {}
        for clean in (False, True):
            tag = "clean" if clean else "dirty"
            row[f"liger {tag} first"] = graph_us(liger, args.reps, clean=clean)
            row[f"copy {tag}"] = graph_us(lambda: y.copy_(x), args.reps, clean=clean)
        torch._dynamo.reset()
        comp = torch.compile(apply_cos_sin, dynamic=False)
        c4, s4 = cos.view(S, 1, D), sin.view(S, 1, D)
        row["compile dirty"] = graph_us(lambda: comp(x, c4, s4), args.reps)
        for clean in (False, True):
            tag = "clean" if clean else "dirty"
            row[f"liger {tag} after compile"] = graph_us(liger, args.reps, clean=clean)
        print(f"S={S} ({x.numel() * 2 / 2**20:.0f} MB): " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
