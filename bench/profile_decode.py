"""Decode and append calls for ncu (issues 18 and 20: where the time goes):

    ncu --profile-from-start off -k regex:"decode|append|merge" python bench/profile_decode.py [CASE ...]
    python bench/profile_decode.py --time [CASE ...]   # graph_us of each case instead (A/B runs)

Profiles one call of each case after warm-up (the profiler range covers only those
calls), Hq 32, Hk 8, D 128, bf16 q, contiguous cache. Cases (default: all):
  bf16_b1_512, paged_b1_512 (block size 16), bf16_b1_2048, paged_b1_2048, bf16_b1_8192,
  bf16_b1_32768, bf16_b8_8192, fp8_b1_8192, fp8_b1_32768, fp8_b8_8192, fp8_b8_32768, fp8_b64_8192
  (fp8: auto's choice, two kv heads per CTA at these contexts since the fifth session of
  2026-11-26; rope_ext._C.set_decode_kv_pair(1) before the calls for one),
  step_b1_512, step_b1_8192 (the decode step in one call: attention_decode with k, v),
  mqa_b1_32768, mqa_b1_32768_s64, mqa_b1_32768_s128 (Hq 8, Hk 1; auto, 64 and 128 splits),
  append_8192 (append_kv without q, T = 8192 tokens of one sequence), append_16 (16
  sequences of one token), both varlen as in the attn suite."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # this tree's rope_ext
import rope_ext  # noqa: E402

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


def append_case(T):
    """As the attn suite's rows: varlen, T = 16 is 16 sequences of one token, else one
    sequence of T."""
    B = 16 if T == 16 else 1
    k = torch.randn(T, Hk, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kc = torch.zeros(B, T // B + 4096, Hk, D, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    lens = torch.randint(0, 4096, (B,), dtype=torch.int32, device=dev)
    cu = torch.arange(0, T + 1, T // B, dtype=torch.int32, device=dev)
    return lambda: rope_ext.append_kv(k, v, kc, vc, lens, cu_seqlens=cu)


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
}
timed = sys.argv[1:2] == ["--time"]  # --time CASE...: each case's graph_us (the suites' timing), no profiling
names = sys.argv[1 + timed:] or list(CASES)
calls = [CASES[n]() for n in names]
if timed:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import graph_us
    for n, f in zip(names, calls):
        print(f"{n:<16}{graph_us(f):8.2f} us")
    sys.exit(0)
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for n, f in zip(names, calls):
    torch.cuda.nvtx.range_push(n)
    f()
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("profiled:", " ".join(names))
