"""rope_ext timing sweeps.

    python bench/run.py                 # seed sweep + bshd bf16 [4, 4096, 32, 128] fwd/bwd
    python bench/run.py --quick         # the largest seed shapes + bshd only
    python bench/run.py --suite llm     # issue-4 workloads W1-W5 (+ max error vs float64, % of same-size copy)
    python bench/run.py --suite latency # issue 11: small tensors and decode, CUDA graph of one call, vs peers
    python bench/run.py --suite sweep --plot sweep.png   # 64 KB .. 4 GB, bf16/fp32, fwd/bwd, peers, copy
    python bench/run.py --suite variants   # norm+rope, M-RoPE, axial vs torch.compile (bench/variants.py)
    python bench/run.py --suite all --json out.json --csv out.csv

Timing: CUDA events around each call, after warm-up, with the L2 flushed (L2's persisting
lines reset, then a 256 MB write: bench/timing.py) before every timed call and the GPU held busy (torch.cuda._sleep) while the host
enqueues it, so host overhead stays out of the device time; the median of --reps calls. GB/s counts the bytes
that must move: x read once and the output written once. "% copy" compares with a
device-to-device copy measured in the same run the same way ("% ss copy": a copy of the
workload's own bytes, `y.copy_(x)`, timed the same way in the same run). Without a GPU
it runs a small CPU sweep (wall clock) and says so; --suite llm, sweep and variants
need a GPU and say so (exit status 1) instead of printing an empty table.

Peers (--suite latency, llm's W5, sweep): torch.compile of the cached cos/sin formula
always; Liger's Triton rope and FlashInfer's cos/sin-cache rope when importable
(`bash scripts/install_peers.sh` installs the wheels kept in bench/peers/wheels). A peer
that is missing or fails on a workload prints n/a, and the reason once.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
from rope_ext import reference as ref  # noqa: E402
from rope_ext._ops import ops  # noqa: E402
from rope_ext._args import op_options  # noqa: E402
import timing  # noqa: E402
from timing import (CUDA, DEV, Timer, copy_bandwidth, eager_us, graph_us, graph_us_interleaved, max_err,  # noqa: E402,F401
                    print_table, same_size_copy, time_rows)
GPU_SUITES = ("llm", "sweep", "variants")   # time CUDA kernels only: refused without a GPU
CPU_SUITES = ("seed", "latency", "attn", "fp8")    # also run on the CPU (wall clock, small sizes)


def hf_cos_sin(S, D, dtype, base=10000.0):
    """HF-style cos/sin [S, D] (halves duplicated) in x's dtype, for the cached baselines."""
    f = 1.0 / (base ** (torch.arange(0, D, 2, device=DEV).float() / D))
    ang = torch.arange(S, device=DEV).float()[:, None] * f
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def workload_rows(x, rope_call, cos, sin, inverse, timer, bw):
    """Time every implementation on x; rows of dicts."""
    nbytes = 2 * x.numel() * x.element_size()
    s = -sin if inverse else sin
    impls = [
        ("torch naive", lambda: ref.rope_naive(x, inverse=inverse) if x.dim() == 4 else
         ref.rope_naive(x.unsqueeze(2), inverse=inverse)),
        ("torch cached", lambda: ref.apply_cos_sin(x, cos, s)),
    ]
    if CUDA:
        # A fresh static-shape compile per workload: torch.compile's best case (its
        # warm-up, 0.7-3.6 s per new shape, happens in the untimed warm-up calls).
        torch._dynamo.reset()
        compiled = torch.compile(ref.apply_cos_sin, dynamic=False)
        impls.append(("torch.compile(cached)", lambda: compiled(x, cos, s)))
    for name in rope_ext.IMPLS + ("auto",):
        impls.append((f"rope_ext {name}", lambda name=name: rope_call(x, name, inverse)))
    return time_rows(impls, nbytes, timer, bw, base="torch naive")


def op_opts(inverse, impl):
    """The rope op's options after x (by name, in the compiled schema's order): positions
    0..S-1, base 10000, full rotary dim, neox, direction, impl."""
    return op_options(inverse=inverse, impl=impl)


def seed_call(x, impl, inverse):
    return ops.rope(x.unsqueeze(2), *op_opts(inverse, impl)) if inverse else rope_ext.rope(x, impl=impl)


def bshd_call(x, impl, inverse):
    return ops.rope(x, *op_opts(inverse, impl))


# ----------------------------------------------------------------------------- llm suite
def qk_cache_compiled():
    """torch.compile of the cos/sin-cache form for q and k (vLLM style): gather cos/sin
    rows by position, rotate both, in place. Its warm-up is untimed."""
    def f(q, k, pos, cache):
        cs = cache[pos]  # [T, R]
        half = cs.shape[-1] // 2
        cos = torch.cat([cs[:, :half], cs[:, :half]], -1)[:, None, :].to(q.dtype)
        sin = torch.cat([cs[:, half:], cs[:, half:]], -1)[:, None, :].to(q.dtype)
        q.copy_(ref.apply_cos_sin(q, cos, sin))
        k.copy_(ref.apply_cos_sin(k, cos, sin))
    torch._dynamo.reset()
    return torch.compile(f, dynamic=False)


def llm_suite(timer, bw, peers=None):
    """Issue 4's workloads. Each row: µs, GB/s, % of copy (the 2 GiB reference), % of a
    same-size copy (the workload's own bytes, same timer, same run), max |out - float64|."""
    results = []
    impls = rope_ext.IMPLS + ("auto",)

    def table(title, nbytes, fns, want=None, outs=None, dtype=torch.bfloat16):
        # nbytes counts x read + out written: the same-size copy moves nbytes / 2 of x's dtype.
        ss_us = timer(same_size_copy(nbytes // 2 // torch.empty(0, dtype=dtype).element_size(), dtype))
        rows = time_rows(fns, nbytes, timer, bw, base="torch.compile", outs=outs, want=want, ss_us=ss_us)
        print_table(title, rows, "x compile", err=want is not None, ss_us=ss_us)
        results.append(dict(workload=title, same_size_copy_us=ss_us, rows=rows))

    # W1, W2: dense layouts, forward and backward (backward = rotation by -theta).
    for name, shape, layout in [("W1 bshd", (4, 4096, 32, 128), "bshd"), ("W2a sbhd", (4096, 1, 128, 128), "sbhd"),
                                ("W2b sbhd", (512, 32, 24, 128), "sbhd")]:
        x = torch.randn(*shape, device=DEV).bfloat16()
        S, D = (shape[1] if layout == "bshd" else shape[0]), shape[3]
        cos, sin = hf_cos_sin(S, D, x.dtype)
        if layout == "bshd":
            cos, sin = cos[:, None, :], sin[:, None, :]
        else:
            cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        for inverse in (False, True):
            want = ref.rope_float64(x, layout=layout, inverse=inverse)
            torch._dynamo.reset()
            comp = torch.compile(ref.apply_cos_sin, dynamic=False)
            s = -sin if inverse else sin
            call = lambda i, inverse=inverse: ops.rope(x.permute(1, 0, 2, 3) if layout == "sbhd" else x,  # noqa: E731
                                                       *op_opts(inverse, i))
            fix = (lambda y: y.permute(1, 0, 2, 3)) if layout == "sbhd" else (lambda y: y)
            fns = [("torch.compile(cached)", lambda: comp(x, cos, s))] + [(f"rope_ext {i}", lambda i=i: call(i)) for i in impls]
            outs = {"torch.compile(cached)": lambda: comp(x, cos, s)}
            outs.update({f"rope_ext {i}": (lambda i=i: fix(call(i))) for i in impls})
            if inverse:  # issue 19: the backward as training runs it, through autograd (grad of apply_rope)
                xg = x.detach().requires_grad_()
                y = rope_ext.apply_rope(xg, layout=layout)
                g = torch.randn_like(y)
                fns.append(("rope_ext auto, autograd backward",
                            lambda: torch.autograd.grad(y, xg, g, retain_graph=True)[0]))
                outs["rope_ext auto, autograd backward"] = lambda: torch.autograd.grad(y, xg, x, retain_graph=True)[0]
            table(f"{name} bf16 {list(shape)} {'backward' if inverse else 'forward'}", 2 * x.numel() * 2, fns, want, outs)
            del want
        del x
    # W3: the seed sweep's largest, fp32 single head, position = row mod 8192.
    x = torch.randn(128, 8192, 128, device=DEV)
    cos, sin = hf_cos_sin(8192, 128, x.dtype)
    want = ref.rope_float64(x[:8].unsqueeze(2)).squeeze(2)  # error on 8 of the 128 rows of positions
    torch._dynamo.reset()
    comp = torch.compile(ref.apply_cos_sin, dynamic=False)
    fns = [("torch.compile(cached)", lambda: comp(x, cos, sin))] + [(f"rope_ext {i}", lambda i=i: rope_ext.rope(x, impl=i)) for i in impls]
    outs = {"torch.compile(cached)": lambda: comp(x, cos, sin)[:8]}
    outs.update({f"rope_ext {i}": (lambda i=i: rope_ext.rope(x, impl=i)[:8]) for i in impls})
    table("W3 fp32 [128*8192, 128] one head forward", 2 * x.numel() * 4, fns, want, outs, dtype=torch.float32)
    del x
    # W4 / W5: q + k thd, random int64 positions < 131072, one launch, in place.
    cache = ref.cos_sin_table(128, 10000.0, 131072, DEV)
    for T in (8192, 16):
        q = torch.randn(T, 32, 128, device=DEV).bfloat16()
        k = torch.randn(T, 8, 128, device=DEV).bfloat16()
        pos = torch.randint(0, 131072, (T,), device=DEV)
        nbytes = 2 * (q.numel() + k.numel()) * 2
        comp = qk_cache_compiled()
        qc, kc = q.clone(), k.clone()
        wq = ref.rope_float64(q, pos, layout="thd")
        fns = [("torch.compile(cached)", lambda: comp(qc, kc, pos, cache))]
        outs = {}
        for i in impls:
            if i == "naive":
                continue  # cannot run in place
            for src, kw in (("sin/cos in kernel", {}), ("fp32 cache", {"cos_sin_cache": cache})):
                nm = f"rope_ext {i} ({src})"
                fns.append((nm, lambda i=i, kw=kw: rope_ext.apply_rope_qk(qc, kc, pos, layout="thd", impl=i,
                                                                       inplace=True, **kw)))
                outs[nm] = (lambda i=i, kw=kw: rope_ext.apply_rope_qk(q.clone(), k, pos, layout="thd", impl=i,
                                                                   inplace=True, **kw)[0])
        label = "W4" if T == 8192 else "W5 (device time, cold L2)"
        table(f"{label} q[{T},32,128]+k[{T},8,128] bf16 thd, random pos < 131072, in place", nbytes, fns, wq, outs)
        if T == 16 and CUDA:
            results.append(decode_latency(q, k, pos, cache, comp, peers))
    return results


def decode_latency(q, k, pos, cache, comp, peers=None):
    """W5: per call, (a) replayed in a CUDA graph with a cold L2, (b) eager Python calls
    back to back (host overhead included)."""
    rows = []
    fns = [("rope_ext auto", lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)),
           ("rope_ext auto (fp32 cache)", lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True,
                                                                        cos_sin_cache=cache)),
           ("torch.compile(cached)", lambda: comp(q, k, pos, cache))]
    for name, fn in (peers.qk_fns(q, k, pos, cache) if peers else {}).items():
        fns.append((name, fn))
    fns += [("same-size copy (q + k bytes)", same_size_copy(q.numel() + k.numel(), q.dtype)),
            # The floor for any kernel: one aten element-wise op over q's bytes.
            ("floor: aten q.mul_(1.0)", lambda: q.mul_(1.0))]
    for name, fn in fns:
        try:
            rows.append(dict(impl=name, graph_us=graph_us(fn), eager_us=eager_us(fn)))
        except Exception as e:  # a peer that fails here: say why, go on
            rows.append(dict(impl=name, error=first_line(e)))
    print("\nW5 decode T=16 per call: CUDA-graph replay with cold L2 / eager back-to-back (host included)")
    for r in rows:
        if "error" in r:
            print(f"  {r['impl']:<30}  n/a: {r['error']}")
        else:
            print(f"  {r['impl']:<30}{r['graph_us']:>8.1f} us graph {r['eager_us']:>8.1f} us eager")
    return dict(workload="W5 decode latency", rows=rows)


def first_line(e):
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:100] if str(e).strip() else ''}"


# ----------------------------------------------------------------------------- peers
def import_liger():
    """Liger's Triton rope module (liger_kernel.ops.rope: rope_forward/rope_backward).
    If the package's __init__ pulls in something this environment lacks, the one file
    is loaded alone: it needs only torch and triton."""
    try:
        from liger_kernel.ops import rope
        return rope
    except Exception as first:
        import importlib.util
        spec = importlib.util.find_spec("liger_kernel")
        if spec is None or not spec.submodule_search_locations:
            raise first
        path = os.path.join(list(spec.submodule_search_locations)[0], "ops", "rope.py")
        fspec = importlib.util.spec_from_file_location("_liger_rope", path)
        mod = importlib.util.module_from_spec(fspec)
        fspec.loader.exec_module(mod)
        return mod


class Peers:
    """The optional peer kernels, from PyPI wheels installed into the bench environment
    (scripts/install_peers.sh), never vendored: Liger's Triton rope (cos/sin [1, S, D]
    gathered by position outside the timed call, as a model passes them) and
    FlashInfer's apply_rope_with_cos_sin_cache_inplace (fp32 cache [max_pos, R], the
    gather in its kernel). Both rotate q and k in place in one launch. For a single x
    they get x's tokens split in two halves as q and k: the same bytes and one launch,
    so the time is comparable (the second half is rotated with the first half's
    positions). Reasons for n/a are kept and printed once (report())."""

    def __init__(self, load=True):
        self.mods, self.why = {}, {}
        loaders = (("Liger", import_liger), ("FlashInfer", lambda: __import__("flashinfer"))) if load else ()
        for name, imp in loaders:
            try:
                self.mods[name] = imp()
            except Exception as e:
                self.why[name] = "not importable: " + first_line(e)

    names = ("Liger", "FlashInfer")

    def note(self, name, e):
        self.why.setdefault(name, first_line(e))

    def report(self):
        for name, why in self.why.items():
            print(f"  {name}: n/a ({why})")

    @classmethod
    def for_script(cls, script, extra=""):
        """A GPU-only bench script's start: exits without a GPU, else the peers (those
        missing reported) and a line naming the device and torch (then `extra`)."""
        if not CUDA:
            sys.exit(f"{script} needs a GPU")
        peers = cls()
        peers.report()
        print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}" + (f"; {extra}" if extra else ""))
        return peers

    def _liger(self, q, k, cos, sin, backward=False):
        m = self.mods["Liger"]
        qb, kb = q.unsqueeze(0).transpose(1, 2), k.unsqueeze(0).transpose(1, 2)  # bhsd views of thd memory
        c, s_ = cos.unsqueeze(0).contiguous(), sin.unsqueeze(0).contiguous()
        f = m.rope_backward if backward else m.rope_forward
        return lambda: f(qb, kb, c, s_)

    def _flashinfer(self, q, k, pos, cache):
        fi = self.mods["FlashInfer"]
        T, D = q.shape[0], q.shape[-1]
        q2, k2 = q.view(T, -1), k.view(T, -1)
        return lambda: fi.apply_rope_with_cos_sin_cache_inplace(pos, q2, k2, D, cache, is_neox=True)

    def x_fns(self, x_tok, cos, sin, pos, cache, backward=False):
        """{peer: fn} for x as tokens [N, H, D] (contiguous) with cos/sin [N, D] in x's
        dtype (halves duplicated, HF style), int64 positions [N] and an fp32 cache."""
        out = {}
        h = x_tok.shape[0] // 2
        q, k = x_tok[:h], x_tok[h:2 * h]
        if "Liger" in self.mods:
            out["Liger"] = self._liger(q, k, cos[:h], sin[:h], backward)
        if "FlashInfer" in self.mods and not backward:  # no backward in FlashInfer
            out["FlashInfer"] = self._flashinfer(q, k, pos[:h].contiguous(), cache)
        return out

    def qk_fns(self, q, k, pos, cache):
        """{peer: fn} for thd q [T, Hq, D] + k [T, Hk, D] in place at positions pos."""
        out = {}
        if "Liger" in self.mods:
            cs = cache[pos]
            half = cs.shape[-1] // 2
            cos = torch.cat([cs[:, :half], cs[:, :half]], -1).to(q.dtype)
            sin = torch.cat([cs[:, half:], cs[:, half:]], -1).to(q.dtype)
            out["Liger"] = self._liger(q, k, cos, sin)
        if "FlashInfer" in self.mods:
            out["FlashInfer"] = self._flashinfer(q, k, pos, cache)
        return out


# ----------------------------------------------------------------------------- latency suite
ROPE_ONLY = False  # --rope-only: rope_ext's columns and the copy, no torch.compile or peers
LAT_COLS = [("rope_ext auto", "auto"), ("rope_ext auto (in place)", "auto ip"),
            ("rope_ext auto (cos_sin_cache)", "auto csc"), ("rope_ext flat", "flat"),
            ("rope_ext fp32x4_tile", "tile"), ("torch.compile", "compile"), ("Liger", "Liger"),
            ("FlashInfer", "FlashInf"), ("same-size copy", "copy")]
# Like with like: torch.compile's function returns a new tensor (out of place), Liger and
# FlashInfer rotate in place (their writes land in the lines they just read, which a
# cold-L2 timing rewards up to ~L2 size). "x oop" = compile / auto, "x ip" = the best
# in-place peer / auto (in place); >= 1: rope_ext at or ahead.
LAT_OOP_PEERS = ("torch.compile",)
LAT_IP_PEERS = ("Liger", "FlashInfer")


def latency_x_workload(layout, dtype, S, peers, positions=False):
    """x [1, S, 32, 128] bshd, [S, 1, 32, 128] sbhd or [S, 32, 128] thd (cu_seqlens
    [0, S]): one token-major memory, out of place, positions 0..S-1 (positions=True: given
    to rope_ext as an int64 tensor, serving's call)."""
    H, D = 32, 128
    shape = {"bshd": (1, S, H, D), "sbhd": (S, 1, H, D), "thd": (S, H, D)}[layout]
    x = torch.randn(*shape, device=DEV).to(dtype)
    kw = {"cu_seqlens": torch.tensor([0, S], dtype=torch.int32, device=DEV)} if layout == "thd" else {}
    if positions:
        kw["positions"] = torch.arange(S, device=DEV)
    cos, sin = hf_cos_sin(S, D, dtype)
    cshape = (S, 1, 1, D) if layout == "sbhd" else (S, 1, D)
    c4, s4 = cos.view(cshape), sin.view(cshape)
    torch._dynamo.reset()
    comp = torch.compile(ref.apply_cos_sin, dynamic=False)
    fns = {f"rope_ext {i}": (lambda i=i: rope_ext.apply_rope(x, layout=layout, impl=i, **kw))
           for i in ("auto", "flat", "fp32x4_tile")}
    fns["rope_ext auto (in place)"] = lambda: rope_ext.apply_rope(x, layout=layout, inplace=True, **kw)
    # The table the peers read, given to rope_ext (read, not computed; out of place, in
    # x's dtype as torch.compile's cos/sin): like with like for the "x oop" column's peer.
    csc = ref.cos_sin_table(D, 10000.0, S, DEV).to(dtype)
    fns["rope_ext auto (cos_sin_cache)"] = lambda: rope_ext.apply_rope(x, layout=layout, cos_sin_cache=csc, **kw)
    if not ROPE_ONLY:
        fns["torch.compile"] = lambda: comp(x, c4, s4)
        pos = torch.arange(S, device=DEV)
        cache = ref.cos_sin_table(D, 10000.0, S, DEV)
        fns.update(peers.x_fns(x.view(S, H, D), cos, sin, pos, cache))
    fns["same-size copy"] = same_size_copy(x.numel(), dtype)
    name = ("bf16" if dtype == torch.bfloat16 else "fp32") + (" positions" if positions else "")
    return f"{layout} {name} {list(shape)}", x.numel() * x.element_size(), fns


def latency_sbhd_workload(name, shape, peers):
    """W2a / W2b: sbhd bf16 [S, B, H, D] forward, out of place."""
    S, B, H, D = shape
    x = torch.randn(*shape, device=DEV).bfloat16()
    cos, sin = hf_cos_sin(S, D, x.dtype)
    c4, s4 = cos[:, None, None, :], sin[:, None, None, :]
    torch._dynamo.reset()
    comp = torch.compile(ref.apply_cos_sin, dynamic=False)
    fns = {f"rope_ext {i}": (lambda i=i: rope_ext.apply_rope(x, layout="sbhd", impl=i))
           for i in ("auto", "flat", "fp32x4_tile")}
    fns["rope_ext auto (in place)"] = lambda: rope_ext.apply_rope(x, layout="sbhd", inplace=True)
    if not ROPE_ONLY:
        fns["torch.compile"] = lambda: comp(x, c4, s4)
        # Peers see sbhd memory as S * B tokens, each with its own cos/sin row (gathered once).
        tok_cos, tok_sin = cos.repeat_interleave(B, 0), sin.repeat_interleave(B, 0)
        pos = torch.arange(S, device=DEV).repeat_interleave(B)
        cache = ref.cos_sin_table(D, 10000.0, S, DEV)
        fns.update(peers.x_fns(x.view(S * B, H, D), tok_cos, tok_sin, pos, cache))
    fns["same-size copy"] = same_size_copy(x.numel(), x.dtype)
    return f"{name} sbhd bf16 {list(shape)} fwd", x.numel() * 2, fns


def latency_qk_workload(T, peers):
    """W4 (T = 8192) / W5 (T = 16): q [T, 32, 128] + k [T, 8, 128] bf16 thd, random
    int64 positions < 131072, one launch; rope_ext auto out of place and in place, the
    explicit variants in place."""
    cache = ref.cos_sin_table(128, 10000.0, 131072, DEV)
    q = torch.randn(T, 32, 128, device=DEV).bfloat16()
    k = torch.randn(T, 8, 128, device=DEV).bfloat16()
    pos = torch.randint(0, 131072, (T,), device=DEV)
    fns = {f"rope_ext {i}": (lambda i=i: rope_ext.apply_rope_qk(q, k, pos, layout="thd", impl=i, inplace=True))
           for i in ("flat", "fp32x4_tile")}
    fns["rope_ext auto"] = lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd")
    fns["rope_ext auto (in place)"] = lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)
    # FlashInfer's fp32 table, in place as the peers.
    fns["rope_ext auto (cos_sin_cache)"] = lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True,
                                                                           cos_sin_cache=cache)
    if not ROPE_ONLY:
        comp = qk_cache_compiled()
        fns["torch.compile"] = lambda: comp(q, k, pos, cache)
        fns.update(peers.qk_fns(q, k, pos, cache))
    fns["same-size copy"] = same_size_copy(q.numel() + k.numel(), q.dtype)
    label = "W5" if T == 16 else "W4"
    return f"{label} q[{T},32,128]+k[{T},8,128] thd", (q.numel() + k.numel()) * 2, fns


def ratios(cells, compile_inplace=False):
    """The "x oop" and "x ip" cells of a latency row (blank where a side is missing).
    compile_inplace: W4/W5's compiled function writes q and k back (qk_cache_compiled)."""
    oop, ip = ((), LAT_OOP_PEERS + LAT_IP_PEERS) if compile_inplace else (LAT_OOP_PEERS, LAT_IP_PEERS)
    out = ""
    for ours, peers in (("rope_ext auto", oop), ("rope_ext auto (in place)", ip)):
        best = min((cells[c] for c in peers if c in cells), default=None)
        out += f"{best / cells[ours]:>7.2f}x" if ours in cells and best else f"{'':>8}"
    return out


def latency_suite(peers, reps, quick=False):
    """Issue 11's table: each workload's call captured alone in a CUDA graph, L2 flushed
    before every replay, median of `reps` replays; then W5 as eager calls back to back.
    "x oop" / "x ip": see LAT_OOP_PEERS (>= 1: rope_ext at or ahead)."""
    sizes = (16, 64, 256, 1024, 4096, 16384, 65536) if CUDA else (16, 64)
    groups = [("bshd", torch.bfloat16)] + ([] if quick else [("bshd", torch.float32), ("sbhd", torch.bfloat16),
                                                              ("thd", torch.bfloat16)])
    builders = [lambda lay=lay, dt=dt, S=S: latency_x_workload(lay, dt, S, peers) for lay, dt in groups for S in sizes]
    if CUDA:
        builders += [lambda: latency_sbhd_workload("W2a", (4096, 1, 128, 128), peers),
                     lambda: latency_sbhd_workload("W2b", (512, 32, 24, 128), peers)]
    builders += [lambda: latency_qk_workload(8192 if CUDA else 64, peers), lambda: latency_qk_workload(16, peers)]
    timeit = (lambda fn: graph_us(fn, reps)) if CUDA else Timer(reps)
    sequential = os.environ.get("ROPE_EXT_BENCH_SEQUENTIAL") == "1"
    how = (f"one call in a CUDA graph, L2 flushed before each replay (flush {timing.FLUSH}), median of {reps} replays" +
           (", columns timed one after another (ROPE_EXT_BENCH_SEQUENTIAL=1)" if sequential else
            ", the columns' replays taking turns (timing.graph_us_interleaved)") if CUDA else
           "CPU smoke run: wall clock of eager calls, small sizes only")
    print(f"\nlatency suite (us): {how}")
    head = (f"  {'workload':<36}{'MB':>7}" + "".join(f"{c:>9}" for _, c in LAT_COLS) +
            f"{'% copy':>8}{'x oop':>8}{'x ip':>8}")
    print(head)
    results = []
    for build in builders:
        title, nbytes, fns = build()
        cells, rows = {}, []
        # A column timed right after a torch.compile'd call's compile and timing ran ~2-4
        # us faster at 2-32 MB with the same dirty flush (Liger 8 MB 10.2 -> 8.0 us, like a
        # clean flush's 8.4: bench/liger_order.py, NOTES evening of 2026-11-25), and the
        # compiled column's own time moved with what ran before it (8 MB 8.6-10.4 us): so
        # on the GPU the columns' replays take turns (graph_us_interleaved) and all see
        # the same states. ROPE_EXT_BENCH_SEQUENTIAL=1 times them one after another as
        # before (torch.compile last, a discarded timing after it). (Much of that was the
        # compiled kernel's evict_last lines of the shared x outliving the flush's write:
        # the flush now resets them first, timing.FLUSH, twentieth session.)
        if CUDA and not sequential:
            got, errs = graph_us_interleaved({c: fns[c] for c, _ in LAT_COLS if c in fns}, reps)
            for col, _ in LAT_COLS:
                if col in got:
                    cells[col] = got[col]
                    rows.append(dict(impl=col, graph_us=got[col]))
                elif col in errs:
                    if col in Peers.names:
                        peers.note(col, errs[col])
                    rows.append(dict(impl=col, error=first_line(errs[col])))
        for col, _ in sorted(LAT_COLS, key=lambda c: c[0] == "torch.compile") if (sequential or not CUDA) else ():
            fn = fns.get(col)
            if fn is None:
                continue
            try:
                cells[col] = timeit(fn)
                rows.append(dict(impl=col, graph_us=cells[col]))
            except Exception as e:
                if col in Peers.names:
                    peers.note(col, e)
                rows.append(dict(impl=col, error=first_line(e)))
        if (sequential or not CUDA) and "torch.compile" in cells and "same-size copy" in fns:
            timeit(fns["same-size copy"])  # discarded: the next workload's first column is not timed right after it
        line = f"  {title:<36}{nbytes / 2**20:>7.2f}" + "".join(
            f"{cells[c]:>9.1f}" if c in cells else f"{'n/a':>9}" for c, _ in LAT_COLS)
        auto = cells.get("rope_ext auto")
        pct = f"{100 * cells['same-size copy'] / auto:>7.1f}%" if auto and "same-size copy" in cells else f"{'':>8}"
        print(line + pct + ratios(cells, title.startswith(("W4", "W5"))))
        results.append(dict(workload=f"latency {title}", rows=rows))
        del fns
    # W5 eager: the host's share of a decode step.
    title, _, fns = latency_qk_workload(16, peers)
    cells = {}
    for col, _ in LAT_COLS:
        if col in fns:
            try:
                cells[col] = eager_us(fns[col])
            except Exception as e:
                if col in Peers.names:
                    peers.note(col, e)
    print(f"  {title + ' eager':<36}{'':>7}" + "".join(f"{cells[c]:>9.1f}" if c in cells else f"{'n/a':>9}"
                                                      for c, _ in LAT_COLS) + f"{'':>8}" + ratios(cells, True))
    results.append(dict(workload=f"latency {title} eager", rows=[dict(impl=c, eager_us=v) for c, v in cells.items()]))
    print("  (eager: back-to-back calls, host included, us per call; MB: bytes of x (q + k) read; % copy: the "
          "same-size copy's time / auto's)")
    peers.report()
    return results


# ----------------------------------------------------------------------------- size sweep
def sweep_suite(timer, bw, max_bytes, peers):
    """x of 64 KB .. max_bytes (bshd [1, S, 32, 128]), bf16 and fp32, forward and
    backward: rope_ext auto vs torch.compile(cached) (a fresh static compile per point,
    its warm-up untimed), Liger and FlashInfer (forward) when importable, and the
    same-size copy (y.copy_(x), x's bytes)."""
    results = []
    sizes = [2**k for k in range(16, 33, 2) if 2**k <= max_bytes]
    points = [(n, dt, inv) for n in sizes for dt in (torch.bfloat16, torch.float32) for inv in (False, True)]
    others = [("compile", "torch.compile")] + [(n.lower(), n) for n in Peers.names] + [("copy", "same-size copy")]
    for idx, (nbytes, dt, inv) in enumerate(points):
        esz = 2 if dt == torch.bfloat16 else 4
        S = max(2, nbytes // (32 * 128 * esz))
        x = torch.randn(1, S, 32, 128, device=DEV).to(dt)
        cos, sin = hf_cos_sin(S, 128, dt)
        c3, s3 = cos[:, None, :], (-sin if inv else sin)[:, None, :]
        torch._dynamo.reset()
        comp = torch.compile(ref.apply_cos_sin, dynamic=False)
        moved = 2 * x.numel() * esz
        fns = {"torch.compile": lambda: comp(x, c3, s3)}
        cache = ref.cos_sin_table(128, 10000.0, S, DEV)
        fns.update(peers.x_fns(x.view(S, 32, 128), cos, sin, torch.arange(S, device=DEV), cache, backward=inv))
        fns["same-size copy"] = same_size_copy(x.numel(), dt)
        us_r = timer(lambda: bshd_call(x, "auto", inv))
        row = dict(bytes=x.numel() * esz, dtype=str(dt).split(".")[-1], direction="backward" if inv else "forward",
                   rope_ext_us=us_r, rope_ext_gbs=moved / us_r / 1e3)
        for key, col in others:
            if col not in fns:
                continue
            try:
                us = timer(fns[col])
            except Exception as e:
                if col in Peers.names:
                    peers.note(col, e)
                continue
            row[f"{key}_us"], row[f"{key}_gbs"] = us, moved / us / 1e3
        results.append(row)
        print(f"\r  sweep {idx + 1}/{len(points)}: {row['bytes'] / 2**20:9.2f} MB {row['dtype']:<8} {row['direction']:<8}"
              f" rope_ext {row['rope_ext_gbs']:6.0f} GB/s  compile {row.get('compile_gbs', 0):6.0f} GB/s",
              file=sys.stderr)
        del x, fns
    print("\nsize sweep (bshd [1, S, 32, 128]): GB/s; ratio = the fastest other kernel's time / rope_ext auto's")
    print(f"  {'MB':>10} {'dtype':<9}{'dir':<9}{'rope_ext':>9}" + "".join(f"{k:>11}" for k, _ in others[:-1]) +
          f"{'copy':>9}{'% copy':>8}{'ratio':>8}")
    for r in results:
        cells = "".join(f"{r[k + '_gbs']:>11.0f}" if k + "_gbs" in r else f"{'n/a':>11}" for k, _ in others[:-1])
        best = min((r[k + "_us"] for k, _ in others[:-1] if k + "_us" in r), default=float("nan"))
        cp = f"{r['copy_gbs']:>9.0f}{100 * r['copy_us'] / r['rope_ext_us']:>7.1f}%" if "copy_us" in r else ""
        print(f"  {r['bytes'] / 2**20:>10.2f} {r['dtype']:<9}{r['direction']:<9}{r['rope_ext_gbs']:>9.0f}{cells}"
              f"{cp}{best / r['rope_ext_us']:>7.2f}x")
    peers.report()
    return results


def plot_sweep(rows, bw, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    series = [("rope_ext", "rope_ext auto", "o", "C0"), ("compile", "torch.compile", "s", "C1"),
              ("liger", "Liger", "^", "C2"), ("flashinfer", "FlashInfer", "v", "C3"),
              ("copy", "same-size copy", "x", "0.4")]
    for ax, dt in zip(axes, ("bfloat16", "float32")):
        for direction, ls in (("forward", "-"), ("backward", "--")):
            pts = [r for r in rows if r["dtype"] == dt and r["direction"] == direction]
            for key, label, marker, color in series:
                if key == "copy" and direction == "backward":
                    continue  # the same bytes both ways: one copy curve
                have = [r for r in pts if f"{key}_gbs" in r]
                if have:
                    ax.plot([r["bytes"] for r in have], [r[f"{key}_gbs"] for r in have], marker + ls, color=color,
                            ms=4, label=f"{label} {direction}")
        ax.axhline(bw, color="k", lw=1, label=f"copy 2 GiB {bw:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, bw * 1.08)
        ax.set_title(f"{dt}: bshd [1, S, 32, 128]")
        ax.set_xlabel("size of x (bytes)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s (x read + out written)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="largest seed shapes and the bshd workload only")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--suite", choices=["seed", "llm", "latency", "sweep", "variants", "attn", "fp8", "all"], default="seed",
                    help="seed: the seed sweep + bshd bf16 (default); llm: W1-W5; latency: issue 11's small "
                         "tensors and decode vs peers (--quick: bshd bf16 and W2-W5 only); sweep: 64 KB..--max-bytes")
    ap.add_argument("--graph-reps", type=int, default=200, help="CUDA-graph replays per latency point")
    ap.add_argument("--attn-reps", type=int, default=50, help="CUDA-graph replays per attn suite row")
    ap.add_argument("--rope-only", action="store_true",
                    help="latency suite: rope_ext and the same-size copy only (no torch.compile, no peers): "
                         "a second build compared with a first run's peers (scripts/gpu_latency.sh)")
    ap.add_argument("--max-bytes", type=float, default=4 * 2**30, help="largest x in the size sweep")
    ap.add_argument("--plot", help="PNG of the size sweep (GB/s against size)")
    ap.add_argument("--plot-attn", help="PNG of the attn suite: decode time against context length")
    ap.add_argument("--clean-l2", action="store_true",
                    help="flush L2 with a write AND a read of another buffer, so the timed call starts with no "
                         "dirty line (bench/timing.py; the default flush, a write as do_bench's, leaves ~50 MB dirty)")
    ap.add_argument("--json")
    ap.add_argument("--csv")
    args = ap.parse_args()
    if args.clean_l2:
        timing.CLEAN_L2 = True
    global ROPE_ONLY
    ROPE_ONLY = args.rope_only
    if not CUDA and args.suite in GPU_SUITES:
        sys.exit(f"bench/run.py: --suite {args.suite} needs a GPU (torch.cuda.is_available() is False here). "
                 f"On the CPU these suites run: {', '.join(CPU_SUITES)} (a small wall-clock sweep; "
                 f"--suite all skips {', '.join(GPU_SUITES)}).")
    if not CUDA and args.suite == "all":
        print(f"note: no GPU: --suite all runs {', '.join(CPU_SUITES)} only ({', '.join(GPU_SUITES)} need a GPU)")
    torch.manual_seed(0)
    timer = Timer(args.reps)
    if CUDA:
        dev_name = torch.cuda.get_device_name()
        seed_shapes = [(bs, n, m) for bs in (64, 128) for n in (512, 1024, 2048, 4096, 8192) for m in (128, 256)]
        if args.quick:
            seed_shapes = [(128, 8192, 128), (128, 8192, 256)]
        bshd_shape = (4, 4096, 32, 128)
    else:
        dev_name = "CPU (no GPU found: a small CPU sweep, wall-clock timing)"
        seed_shapes = [(4, n, m) for n in (512, 2048) for m in (64, 128)]
        bshd_shape = (1, 512, 8, 128)
    bw = copy_bandwidth(timer, 2**30 if CUDA else 2**26)
    print(f"device: {dev_name}; torch {torch.__version__}; copy bandwidth {bw:.0f} GB/s (read + write; "
          f"y.copy_(x) of {'1 GiB' if CUDA else '64 MiB'}: the reference of '% copy')")
    results = []
    peers = Peers(load=not args.rope_only) if args.suite in ("llm", "latency", "sweep", "all") else None
    if args.suite in ("latency", "all"):
        results += latency_suite(peers, args.graph_reps, quick=args.quick)
    if args.suite in ("llm", "all") and CUDA:
        results += llm_suite(timer, bw, peers)
    if args.suite in ("variants", "all") and CUDA:  # issue 12's ops vs torch.compile (bench/variants.py)
        from variants import variants_suite

        def variants_timer(fn):  # every call in a CUDA graph, cold L2; a table's rows in turns
            return graph_us(fn, args.graph_reps)
        variants_timer.many = lambda fns: graph_us_interleaved(fns, args.graph_reps)
        rows = variants_suite(variants_timer, bw, time_rows, print_table)
        results += [dict(workload=w, rows=[r for r in rows if r["workload"] == w])
                    for w in dict.fromkeys(r["workload"] for r in rows)]
    if args.suite in ("attn", "fp8", "all"):  # issues 9, 18, 20: bench/attn.py, every call in a CUDA graph, cold L2
        from attn import attn_suite, plot_attn
        # % copy against the copy bandwidth above: a 1 GiB y.copy_(x) captured in a graph
        # becomes a copy-engine memcpy node (2.43 TB/s on the H100, run 1 of issue 18),
        # not the SM copy kernel that eager timing measures (3.0 TB/s).
        # A workload's rows take turns (timing.graph_us_interleaved, as the latency suite's
        # columns; ROPE_EXT_BENCH_SEQUENTIAL=1: one after another): the fused step was
        # timed right after torch.compile(separate)'s column.
        if CUDA:
            def attn_timer(fn):
                return graph_us(fn, args.attn_reps)
            if os.environ.get("ROPE_EXT_BENCH_SEQUENTIAL") != "1":
                # (one capture per row: every row's graphs are held at once, and the paged
                # separate rows' gathers take ~8.6 GB each at B = 64 ctx 32768)
                attn_timer.many = lambda fns: graph_us_interleaved(fns, args.attn_reps, captures=1)
        else:
            attn_timer = timer
        attn = attn_suite(attn_timer, bw, args.quick, fp8_only=args.suite == "fp8")
        results += attn
        if args.plot_attn:
            plot_attn(attn, args.plot_attn)
    sweep = []
    if args.suite in ("sweep", "all") and CUDA:
        sweep = sweep_suite(timer, bw, args.max_bytes, peers)
        if args.plot:
            plot_sweep(sweep, bw, args.plot)
    if args.suite not in ("seed", "all"):
        seed_shapes, bshd_shape = [], None
    for bs, n, m in seed_shapes:
        x = torch.randn(bs, n, m, device=DEV)
        cos, sin = hf_cos_sin(n, m, x.dtype)
        rows = workload_rows(x, seed_call, cos, sin, False, timer, bw)
        title = f"seed fp32 [{bs}, {n}, {m}] forward ({2 * x.numel() * 4 / 1e6:.0f} MB moved)"
        print_table(title, rows)
        results.append(dict(workload=title, rows=rows))
        del x
    x = torch.randn(*bshd_shape, device=DEV).bfloat16() if bshd_shape else None
    if x is not None:
        cos, sin = hf_cos_sin(bshd_shape[1], bshd_shape[3], x.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]
    for inverse in ((False, True) if x is not None else ()):
        rows = workload_rows(x, bshd_call, cos, sin, inverse, timer, bw)
        title = f"bshd bf16 {list(bshd_shape)} {'backward' if inverse else 'forward'}"
        print_table(title, rows)
        results.append(dict(workload=title, rows=rows))
    meta = dict(device=dev_name, torch=torch.__version__, copy_gbs=bw, reps=args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results, sweep=sweep), f, indent=1)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("workload,impl,us,gbs,pct_copy,speedup,max_err,graph_us,eager_us\n")
            for w in results:
                for r in w["rows"]:
                    if "error" not in r:
                        f.write(f"\"{w['workload']}\",{r['impl']},{r.get('us', '')},{r.get('gbs', '')},"
                                f"{r.get('pct_copy', '')},{r.get('speedup', '')},{r.get('err', '')},"
                                f"{r.get('graph_us', '')},{r.get('eager_us', '')}\n")
            for r in sweep:
                for key, name in (("rope_ext", "rope_ext auto"), ("compile", "torch.compile(cached)"),
                                  ("liger", "Liger"), ("flashinfer", "FlashInfer"), ("copy", "same-size copy")):
                    if f"{key}_us" in r:
                        f.write(f"\"sweep {r['bytes']} {r['dtype']} {r['direction']}\",{name},{r[key + '_us']:.2f},"
                                f"{r[key + '_gbs']:.1f},,,,,\n")


if __name__ == "__main__":
    main()
