"""What the cold-L2 flush itself costs the timed call (issues 18-20).

    python bench/flush_study.py [--reps 50]

Every suite flushes L2 before each timed replay with a 256 MB write (bench/timing.py, as
triton's do_bench does with zero_()). L2 is write-back: the call then starts with ~50 MB
of the flush's dirty lines in L2, and every line the call allocates (its reads, its
writes to lines not yet in L2) evicts one, whose write-back shares DRAM with the call.
That is a cost of the harness, not of the kernel, and it falls unevenly: a call that
reads >= 50 MB pays for ~50 MB of writes (~16 us at 3 TB/s), a 2 MB call for ~2 MB; an
in-place call allocates one line per line it touches, an out-of-place call two.

This times the same calls (each in a CUDA graph, median) after the default flush
("dirty") and after a clean one ("clean": the same write, then a 256 MB read of another
buffer, so the dirty lines go back to DRAM before the call, and L2 holds clean lines the
call never touches: still cold for the call's own data). Rows: an empty kernel (the
launch floor), pure reads (x.sum()), copies, rope in place and out of place (and Liger
in place where importable), decode attention (rope_ext auto and rope + SDPA), append_kv.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from timing import graph_us  # noqa: E402

DEV = "cuda"
MB = 1e6


def cases():
    """(name, bytes that must move, fn)."""
    out = []
    z = torch.zeros(1, device=DEV)
    out.append(("empty kernel (z.add_(1), 1 element)", 0, lambda: z.add_(1)))
    for mb in (32, 128, 256):
        x = torch.randn(int(mb * MB) // 4, device=DEV)
        r = torch.empty((), device=DEV)
        out.append((f"read: x.sum() fp32 {mb} MB", x.numel() * 4, lambda x=x, r=r: torch.sum(x, dim=0, out=r)))
    for mb in (8, 32, 128):
        x = torch.randn(int(mb * MB) // 4, device=DEV)
        y = torch.empty_like(x)
        out.append((f"copy fp32 {mb} MB (y.copy_(x))", 2 * x.numel() * 4, lambda x=x, y=y: y.copy_(x)))
    # rope: bshd bf16 [1, S, 32, 128]; out of place, in place; Liger in place (q, k = the halves)
    try:
        from run import Peers, hf_cos_sin  # noqa: PLC0415
        peers = Peers()
    except Exception as e:  # noqa: BLE001
        print(f"peers: n/a ({type(e).__name__}: {e})")
        peers, hf_cos_sin = None, None
    for S in (16, 1024, 4096):
        x = torch.randn(1, S, 32, 128, device=DEV).bfloat16()
        nb = 2 * x.numel() * 2
        out.append((f"rope out of place [1,{S},32,128] bf16", nb, lambda x=x: rope_ext.apply_rope(x)))
        out.append((f"rope in place     [1,{S},32,128] bf16", nb, lambda x=x: rope_ext.apply_rope(x, inplace=True)))
        if peers is not None and "Liger" in peers.mods:
            cos, sin = hf_cos_sin(S, 128, x.dtype)
            pos = torch.arange(S, device=DEV)
            fns = peers.x_fns(x.view(S, 32, 128), cos, sin, pos, None)
            out.append((f"Liger in place    [1,{S},32,128] bf16", nb, fns["Liger"]))
    # decode: Hq 32, Hk 8, D 128, bf16, contiguous cache, every sequence at the full context
    for B, ctx in ((1, 512), (1, 2048), (1, 32768), (8, 8192), (64, 8192)):
        kc = torch.randn(B, ctx, 8, 128, device=DEV).bfloat16()
        vc = torch.randn_like(kc)
        q = torch.randn(B, 1, 32, 128, device=DEV).bfloat16()
        lens = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
        pos = torch.full((B, 1), ctx - 1, dtype=torch.long, device=DEV)
        nb = kc.numel() * 2 * 2

        def sep(q=q, kc=kc, vc=vc, pos=pos):
            qr = rope_ext.apply_rope(q, pos)
            return torch.nn.functional.scaled_dot_product_attention(
                qr.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), enable_gqa=True)
        out.append((f"decode rope_ext B={B} ctx={ctx}", nb,
                    lambda q=q, kc=kc, vc=vc, lens=lens, ctx=ctx: rope_ext.attention_decode(q, kc, vc, lens,
                                                                                          max_seqlen=ctx)))
        out.append((f"decode rope + SDPA B={B} ctx={ctx}", nb, sep))
    T = 8192
    k = torch.randn(1, T, 8, 128, device=DEV).bfloat16()
    v = torch.randn_like(k)
    kc, vc = torch.zeros_like(k), torch.zeros_like(k)
    z32 = torch.zeros(1, dtype=torch.int32, device=DEV)
    out.append((f"append_kv T={T} (no q)", 4 * k.numel() * 2, lambda: rope_ext.append_kv(k, v, kc, vc, z32)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print("us: one call in a CUDA graph, median; dirty = the suites' flush (256 MB write), clean = the same write "
          "then a 256 MB read of another buffer; GB/s = bytes that must move / clean time")
    print(f"  {'call':<44}{'MB':>8}{'dirty us':>10}{'clean us':>10}{'dirty-clean':>12}{'GB/s clean':>12}")
    for name, nb, fn in cases():
        try:
            d = graph_us(fn, args.reps, clean=False)
            c = graph_us(fn, args.reps, clean=True)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:<44} n/a: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        gbs = f"{nb / c / 1e3:>12.0f}" if nb else f"{'':>12}"
        print(f"  {name:<44}{nb / MB:>8.2f}{d:>10.1f}{c:>10.1f}{d - c:>12.1f}{gbs}")


if __name__ == "__main__":
    main()
