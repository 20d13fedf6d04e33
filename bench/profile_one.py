"""One call of one workload, for ncu:  ncu --set full python bench/profile_one.py w1 fp32x4
    small [S]: bshd bf16 [1, S, 32, 128] (S = 8: 64 KB; issue 19's 0.12 MB point is S = 16);
               impl "ip": auto in place, "liger": Liger's rope_forward (in place), "compile",
               "study:NAME": variant NAME of bench/small_rope_study.cu (e.g. study:lean_global)
    PROFILE_DIRTY_L2=1: a 256 MB write before each call, so the profiled kernel meets an L2
    full of dirty lines as in the latency suite (profile with ncu --cache-control none)
    w5: thd bf16 q [16, 32, 128] + k [16, 8, 128] in place, random positions < 131072
    w4: the same at 8192 tokens (issue 19's W4); PROFILE_U=N: N rows a thread
               (set_lean_rows_per_thread; launch_lean's rule: 2)
    w4copy: a copy kernel of W4's bytes (torch.mul by 1; impl ignored)
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
    f = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
    emb = torch.cat([torch.arange(S, device="cuda").float()[:, None] * f] * 2, -1)
    cos, sin = emb.cos().bfloat16()[:, None, :], emb.sin().bfloat16()[:, None, :]
    if impl == "compile":
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        fn = lambda: comp(x, cos, sin)  # noqa: E731
    elif impl == "ip":
        fn = lambda: rope_ext.apply_rope(x, inplace=True)  # noqa: E731
    elif impl == "liger":  # as bench/run.py's Peers: q, k = the two halves of the tokens, bhsd views
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from run import import_liger
        rope_forward = import_liger().rope_forward
        h = S // 2
        xt = x.view(S, 32, 128)
        qb, kb = xt[:h].unsqueeze(0).transpose(1, 2), xt[h:2 * h].unsqueeze(0).transpose(1, 2)
        c, s_ = cos[:h, 0].unsqueeze(0).contiguous(), sin[:h, 0].unsqueeze(0).contiguous()
        fn = lambda: rope_forward(qb, kb, c, s_)  # noqa: E731
    elif impl.startswith("study:"):  # a variant of bench/small_rope_study.cu on the same x
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from small_rope_study import VARIANTS, build
        mod, v = build(), VARIANTS.index(impl.split(":", 1)[1])
        xt, out = x.view(S, 32, 128), torch.empty(S, 32, 128, device="cuda", dtype=x.dtype)
        inv = rope_ext.inv_freq(128, 10000.0).float().cpu().contiguous()
        fq, seq0 = inv.cuda(), torch.zeros(1, dtype=torch.int32, device="cuda")
        tc, ts = emb[:, :64].cos().contiguous(), emb[:, :64].sin().contiguous()
        fn = lambda: mod.run(v, xt, out, fq, inv, tc, ts, seq0)  # noqa: E731
    else:
        fn = lambda: rope_ext.apply_rope(x, impl=impl)  # noqa: E731
elif w == "w4copy":  # q's + k's bytes copied by a kernel (the suite's copy_ is a cudaMemcpyAsync)
    src = torch.randn(8192 * 40 * 128, device="cuda").bfloat16()
    dst = torch.empty_like(src)
    fn = lambda: torch.mul(src, 1, out=dst)  # noqa: E731 (a kernel: ncu cannot see copy_'s cudaMemcpyAsync)
elif w in ("w5", "w4"):  # decode step (w5) or prefill (w4): q + k thd in place, one launch
    T = 16 if w == "w5" else 8192
    q = torch.randn(T, 32, 128, device="cuda").bfloat16()
    k = torch.randn(T, 8, 128, device="cuda").bfloat16()
    pos = torch.randint(0, 131072, (T,), device="cuda")
    if os.environ.get("PROFILE_U"):
        rope_ext._C.set_lean_rows_per_thread(int(os.environ["PROFILE_U"]))
    fn = lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", impl=impl, inplace=True)  # noqa: E731
else:
    raise SystemExit(f"unknown workload {w}")
if os.environ.get("PROFILE_DIRTY_L2") == "1":
    dirty = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    call = fn

    def fn():
        dirty.fill_(1)
        call()
for _ in range(3):
    fn()
torch.cuda.synchronize()
