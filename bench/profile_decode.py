"""Decode and append calls for ncu (issues 18 and 20: where the time goes):

    ncu --profile-from-start off -k regex:"decode|append|merge" python bench/profile_decode.py [CASE ...]
    python bench/profile_decode.py --time [CASE ...]   # graph_us of each case instead (A/B runs)
    python bench/profile_decode.py --turns [CASE ...]  # the cases timed in turns

Profiles one call of each case after warm-up (the profiler range covers only those
calls), Hq 32, Hk 8, D 128, bf16 q, contiguous cache unless the case says paged. Cases
(default: all):
  bf16_b1_512, paged_b1_512 (block size 16), bf16_b1_2048, paged_b1_2048, bf16_b1_8192,
  bf16_b1_32768, bf16_b8_8192, fp8_b1_8192, fp8_b1_32768, fp8_b8_8192, fp8_b8_32768, fp8_b64_8192
  (fp8: auto's choice, two kv heads per CTA at these contexts since the fifth session of
  2026-11-26; rope_ext._C.set_decode_kv_pair(1) before the calls for one),
  step_b1_512, step_b1_8192 (the decode step in one call: attention_decode with k, v),
  mqa_b1_32768, mqa_b1_32768_s64, mqa_b1_32768_s128 (Hq 8, Hk 1; auto, 64 and 128 splits),
  append_8192 (append_kv without q, T = 8192 tokens of one sequence), append_16 (16
  sequences of one token), both varlen as in the attn suite; append_16q (with q),
  append_16b (batched [16, 1], with q), append_16bp (the same over a paged(16) cache),
  append_16f (varlen, with q, into fp8 caches), append_16bn (batched, no q), append_16bf
  (batched, with q, fp8), append_64b / append_256b (batched [T, 1], with q). CASE@4 /
  CASE@8: an append case with the lean kernel's chunk bytes forced."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # this tree's rope_ext
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rope_ext  # noqa: E402
from timing import graph_us, graph_us_interleaved, profile_once, switched  # noqa: E402

Hq, Hk, D = 32, 8, 128
dev = "cuda"
FP8 = torch.float8_e4m3fn


def decode_case(cache, B, ctx, step=False, paged=False, Hq=Hq, Hk=Hk, splits=None):
    kw = {} if splits is None else {"num_splits": splits}
    if paged:  # block size 16, shuffled blocks (the attn suite's paged rows)
        kw["block_table"] = torch.randperm(B * ctx // 16, device=dev).view(B, ctx // 16).to(torch.int32)
        kc = torch.randn(B * ctx // 16, 16, Hk, D, device=dev, dtype=torch.bfloat16)
    else:
        kc = torch.randn(B, ctx, Hk, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    if cache == "fp8":
        kc, vc = kc.to(FP8), vc.to(FP8)
        kw.update(k_scale=torch.ones(1, device=dev), v_scale=torch.ones(1, device=dev))
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.bfloat16)
    lens = torch.full((B,), ctx, dtype=torch.int32, device=dev)
    if step:  # the last slot is the step's new token
        k, v = torch.randn(B, 1, Hk, D, device=dev, dtype=q.dtype), torch.randn(B, 1, Hk, D, device=dev, dtype=q.dtype)
        return lambda: rope_ext.attention_decode(q, kc, vc, lens - 1, max_seqlen=ctx, k=k, v=v, **kw)
    return lambda: rope_ext.attention_decode(q, kc, vc, lens, max_seqlen=ctx, **kw)


def append_case(T, q=False, batched=False, paged=False, fp8=False):
    """As the attn suite's rows: T <= 256 is T sequences of one token (varlen, or batched
    [T, 1]; the decode step's shape), else one sequence of T; q: rotate q [T, Hq, D] in place too; paged: block
    size 16, a shuffled block table; fp8: e4m3 caches, per-head k_scale, per-tensor v_scale."""
    B = T if T <= 256 else 1
    k = torch.randn(T, Hk, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    qq = torch.randn(T, Hq, D, device=dev, dtype=torch.bfloat16) if q else None
    cap = T // B + 4096
    lens = torch.randint(0, 4096, (B,), dtype=torch.int32, device=dev)
    if paged:
        cap = (cap + 15) // 16 * 16
        nb = B * cap // 16
        kc = torch.zeros(nb, 16, Hk, D, device=dev, dtype=torch.bfloat16)
        bt = torch.randperm(nb, device=dev, dtype=torch.int32).view(B, cap // 16)
    else:
        kc = torch.zeros(B, cap, Hk, D, device=dev, dtype=torch.bfloat16)
        bt = None
    vc = torch.zeros_like(kc)
    sc = {}
    if fp8:
        kc, vc = kc.to(FP8), vc.to(FP8)
        sc = dict(k_scale=torch.rand(Hk, device=dev) * 0.1 + 0.02, v_scale=torch.tensor([0.03], device=dev))
    if batched:
        k, v = k.view(B, T // B, Hk, D), v.view(B, T // B, Hk, D)
        qq = qq.view(B, T // B, Hq, D) if q else None
        return lambda: rope_ext.append_kv(k, v, kc, vc, lens, q=qq, block_table=bt, **sc)
    cu = torch.arange(0, T + 1, T // B, dtype=torch.int32, device=dev)
    return lambda: rope_ext.append_kv(k, v, kc, vc, lens, q=qq, cu_seqlens=cu, block_table=bt, **sc)


CASES = {
    "bf16_b1_512": lambda: decode_case("bf16", 1, 512),
    "paged_b1_512": lambda: decode_case("bf16", 1, 512, paged=True),
    "bf16_b1_2048": lambda: decode_case("bf16", 1, 2048),
    "paged_b1_2048": lambda: decode_case("bf16", 1, 2048, paged=True),
    "bf16_b1_8192": lambda: decode_case("bf16", 1, 8192),
    "step_b1_512": lambda: decode_case("bf16", 1, 512, step=True),
    "step_b1_8192": lambda: decode_case("bf16", 1, 8192, step=True),
    "bf16_b1_32768": lambda: decode_case("bf16", 1, 32768),
    "bf16_b8_8192": lambda: decode_case("bf16", 8, 8192),
    "fp8_b1_8192": lambda: decode_case("fp8", 1, 8192),
    "fp8_b1_32768": lambda: decode_case("fp8", 1, 32768),
    "fp8_b8_8192": lambda: decode_case("fp8", 8, 8192),
    "fp8_b8_32768": lambda: decode_case("fp8", 8, 32768),
    "fp8_b64_8192": lambda: decode_case("fp8", 64, 8192),
    # MQA (Hq 8, Hk 1: Llama-3-70B's heads on each of 8 tensor-parallel GPUs), auto and forced splits
    "mqa_b1_32768": lambda: decode_case("bf16", 1, 32768, Hq=8, Hk=1),
    "mqa_b1_32768_s64": lambda: decode_case("bf16", 1, 32768, Hq=8, Hk=1, splits=64),
    "mqa_b1_32768_s128": lambda: decode_case("bf16", 1, 32768, Hq=8, Hk=1, splits=128),
    "append_8192": lambda: append_case(8192),
    "append_16": lambda: append_case(16),
    "append_16q": lambda: append_case(16, q=True),  # the attn suite's "with q" row
    "append_16b": lambda: append_case(16, q=True, batched=True),
    "append_16bp": lambda: append_case(16, q=True, batched=True, paged=True),
    "append_16f": lambda: append_case(16, q=True, fp8=True),
    "append_16bn": lambda: append_case(16, batched=True),
    "append_16bf": lambda: append_case(16, q=True, batched=True, fp8=True),
    "append_64b": lambda: append_case(64, q=True, batched=True),
    "append_256b": lambda: append_case(256, q=True, batched=True),
}
# --time CASE...: each case's graph_us (replayed back to back: its code and parameters
# stay warm in the SM); --turns CASE...: all cases in turns (graph_us_interleaved, as the
# suites time), with a copy of append_16q's bytes (k, v and q of T = 16) among them. No
# profiling either way.
mode = sys.argv[1] if sys.argv[1:2] in (["--time"], ["--turns"]) else None
names = sys.argv[1 + bool(mode):] or list(CASES)


def make(name):
    """CASE, or CASE@W: the append case with the lean kernel's chunk bytes forced to W
    (rope_ext._C.set_append_lean_bytes, read when the call launches: a graph keeps it)."""
    case, _, w = name.partition("@")
    fn = CASES[case]()
    if not w:
        return fn
    if not w.isdigit():
        sys.exit(f"profile_decode.py: {name}: {w!r} is not a chunk width (4 or 8)")
    return switched(rope_ext._C.set_append_lean_bytes, int(w), 0, fn)


calls = [make(n) for n in names]
if mode:
    if mode == "--time":
        for n, f in zip(names, calls):
            print(f"{n:<16}{graph_us(f):8.2f} us")
    else:
        src = torch.randn(16 * (2 * Hk + Hq) * D, device=dev, dtype=torch.bfloat16)  # k, v, q of T = 16
        dst = torch.empty_like(src)
        fns = dict(zip(names, calls), copy_16q=lambda: dst.copy_(src))
        t, err = graph_us_interleaved(fns, reps=200)
        for n, v in t.items():
            print(f"{n:<16}{v:8.2f} us (in turns)")
        for n, e in err.items():
            print(f"{n:<16}n/a: {e}")
    sys.exit(0)
profile_once(dict(zip(names, calls)))
print("profiled:", " ".join(names))
