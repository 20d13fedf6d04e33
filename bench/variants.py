"""Issue 12's ops against their PyTorch formulas compiled with torch.compile.

    python bench/run.py --suite variants        (or: python bench/variants.py)

Rows (bf16, sizes above L2; on the GPU each call captured in a CUDA graph, L2 flushed
before every replay, the rows of a table in turns (timing.graph_us_interleaved), median;
plus "eager us": back-to-back eager calls, host included, what an eager training loop
pays): the fused q/k RMSNorm + RoPE of Qwen3 (HF's formula: RMSNorm in fp32, weight,
then the cached rotate_half form), M-RoPE of Qwen2-VL (HF's section selection of a
[3, B, S, D] cos/sin inside the formula), and 2-D axial RoPE (a [S, D] cos/sin built
from both axes outside the timed call). Forward, and forward + backward. cos/sin of
the formulas are gathered outside the timed call (HF computes them once per forward
and shares them across layers), so the compiled rows are their best case. GB/s counts
q and k read once and written once (backward: dy and x read, dx written).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def _hf_norm(x, w, eps):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def hf_norm_rope(q, k, qw, kw, cos, sin, eps=1e-6):
    """Qwen3's q_norm/k_norm then apply_rotary_pos_emb (cos/sin [B, S, D])."""
    q, k = _hf_norm(q, qw, eps), _hf_norm(k, kw, eps)
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


def hf_mrope(q, k, cos, sin, section):
    """Qwen2-VL's apply_multimodal_rotary_pos_emb (cos/sin [3, B, S, D])."""
    sec = list(section) * 2
    c = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sec, dim=-1))], dim=-1).unsqueeze(2)
    s = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sec, dim=-1))], dim=-1).unsqueeze(2)
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


def hf_cached(q, k, cos, sin):
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


def _cos_sin(pos, inv_freq, dtype):
    """HF's cos/sin of positions [..., S] -> [..., S, 2 * len(inv_freq)] (fp32 angles)."""
    ang = pos.float()[..., None] * inv_freq.to(pos.device)
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _fwd_bwd(fn, outs_grads, inputs):
    def run():
        outs = fn()
        torch.autograd.backward(outs, outs_grads)
        for t in inputs:
            t.grad = None
    return run


def variants_suite(timer, bw, time_rows, print_table, dev="cuda", small=False):
    torch.manual_seed(0)
    dt = torch.bfloat16
    B, S, Hq, Hk, D = 1, 64 if small else 8192, 32, 8, 128
    rows_all = []

    def table(title, nbytes, fns):
        rows = time_rows(fns, nbytes, timer, bw, base="torch.compile", eager=dev == "cuda")
        print_table(title, rows, ratio="x compile")
        for r in rows:
            r["workload"] = title
        rows_all.extend(rows)

    q = torch.randn(B, S, Hq, D, device=dev, dtype=dt)
    k = torch.randn(B, S, Hk, D, device=dev, dtype=dt)
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
    pos = torch.arange(S, device=dev)[None].expand(B, S)
    inv_freq = rope_ext.inv_freq(D, 1e6)

    # Qwen3: q/k RMSNorm + RoPE.
    qw = (1 + 0.1 * torch.randn(D, device=dev)).to(dt)
    kw = (1 + 0.1 * torch.randn(D, device=dev)).to(dt)
    cos, sin = _cos_sin(pos, inv_freq, dt)
    comp = torch.compile(hf_norm_rope, dynamic=False)
    table(f"Qwen3 q/k RMSNorm + RoPE fwd  q{list(q.shape)} k{list(k.shape)} bf16", nbytes, [
        ("torch.compile(HF formula)", lambda: comp(q, k, qw, kw, cos, sin)),
        ("rope_ext rms_norm_rope_qk", lambda: rope_ext.rms_norm_rope_qk(q, k, qw, kw, pos, base=1e6)),
    ])
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    qwg, kwg = qw.clone().requires_grad_(), kw.clone().requires_grad_()
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    table("Qwen3 q/k RMSNorm + RoPE fwd+bwd", 2 * nbytes + nbytes // 2, [
        ("torch.compile(HF formula)", _fwd_bwd(lambda: comp(qg, kg, qwg, kwg, cos, sin), (gq, gk), (qg, kg, qwg, kwg))),
        ("rope_ext rms_norm_rope_qk", _fwd_bwd(lambda: rope_ext.rms_norm_rope_qk(qg, kg, qwg, kwg, pos, base=1e6),
                                               (gq, gk), (qg, kg, qwg, kwg))),
    ])

    # Qwen2-VL M-RoPE: positions [3, B, S], mrope_section [16, 24, 24].
    section = [16, 24, 24]
    pos3 = torch.randint(0, 4096, (3, B, S), device=dev)
    cos3, sin3 = _cos_sin(pos3, inv_freq, dt)
    compm = torch.compile(hf_mrope, dynamic=False)
    table("Qwen2-VL M-RoPE fwd", nbytes, [
        ("torch.compile(HF formula)", lambda: compm(q, k, cos3, sin3, section)),
        ("rope_ext apply_mrope", lambda: rope_ext.apply_mrope(q, k, pos3, section, base=1e6)),
    ])
    table("Qwen2-VL M-RoPE fwd+bwd", 2 * nbytes, [
        ("torch.compile(HF formula)", _fwd_bwd(lambda: compm(qg, kg, cos3, sin3, section), (gq, gk), (qg, kg))),
        ("rope_ext apply_mrope", _fwd_bwd(lambda: rope_ext.apply_mrope(qg, kg, pos3, section, base=1e6),
                                          (gq, gk), (qg, kg))),
    ])

    # 2-D axial (a ViT / DiT on a 128 x 64 grid), q and k with 16 heads of 64.
    Hh, Dh, gh, gw = 16, 64, (8 if small else 128), (4 if small else 64)
    xq = torch.randn(B, gh * gw, Hh, Dh, device=dev, dtype=dt)
    xk = torch.randn(B, gh * gw, Hh, Dh, device=dev, dtype=dt)
    rc = torch.stack(torch.meshgrid(torch.arange(gh, device=dev), torch.arange(gw, device=dev), indexing="ij"),
                     -1).reshape(-1, 2)
    f = rope_ext.axial_inv_freq([Dh // 2, Dh // 2], 100.0)
    h = Dh // 4  # pairs per axis
    ang = torch.cat([rc[:, :1].float() * f[:h].to(dev), rc[:, 1:].float() * f[h:].to(dev)], dim=-1)
    emb = torch.cat([ang, ang], dim=-1)
    cosa, sina = emb.cos().to(dt), emb.sin().to(dt)
    compa = torch.compile(hf_cached, dynamic=False)
    nb = 2 * (xq.numel() + xk.numel()) * xq.element_size()
    table(f"2-D axial RoPE fwd  q,k{list(xq.shape)} bf16", nb, [
        ("torch.compile(formula)", lambda: compa(xq, xk, cosa, sina)),
        ("rope_ext apply_rope_axial_qk", lambda: rope_ext.apply_rope_axial_qk(xq, xk, rc, base=100.0)),
    ])
    return rows_all


if __name__ == "__main__":
    import timing as T
    timer = T.Timer(reps=50)
    bw = T.copy_bandwidth(timer)
    timer = lambda fn: T.graph_us(fn)  # noqa: E731
    timer.many = T.graph_us_interleaved
    print(f"copy bandwidth (1 GiB): {bw:.0f} GB/s")
    variants_suite(timer, bw, T.time_rows, T.print_table)
