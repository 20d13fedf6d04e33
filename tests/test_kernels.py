"""Every variant x dtype x layout x memory view, forward and backward, against the
float64 truth and both PyTorch references. CPU always; CUDA where there is a GPU."""
import os
import subprocess
import sys
import zlib

import pytest
import torch

import rope_ext
from rope_ext import reference as ref
from conftest import IMPLS, DTYPES, assert_close_f64, assert_close_ref, make_view, randn, vector_ok, VECTOR_IMPLS

B, S, H, D = 2, 37, 3, 64
CU = [0, 5, 30, 74]  # thd: three packed sequences, T = B * S = 74


def shape_of(layout):
    return {"bshd": (B, S, H, D), "sbhd": (S, B, H, D), "bhsd": (B, H, S, D), "thd": (B * S, H, D)}[layout]


def layout_kwargs(layout, device):
    if layout == "thd":
        return {"layout": "thd", "cu_seqlens": torch.tensor(CU, dtype=torch.int32, device=device)}
    return {"layout": layout}


def check_fwd_bwd(x, impl, **kw):
    """apply_rope(x) against float64 and the references; then its gradient."""
    scale = x.abs().max().item()
    x_before = x.clone()
    if impl in VECTOR_IMPLS and not vector_ok(x, kw.get("rotary_dim"), kw.get("interleaved", False)):
        with pytest.raises(ValueError, match=f"impl=.{impl}. needs 16-byte"):
            rope_ext.apply_rope(x, impl=impl, **kw)
        return
    out = rope_ext.apply_rope(x, impl=impl, **kw)
    assert out.dtype == x.dtype and out.shape == x.shape
    assert torch.equal(x, x_before), "input was modified"
    assert_close_f64(out, ref.rope_float64(x, **kw), scale, "forward vs float64")
    assert_close_ref(out, ref.rope_naive(x, **kw), scale, "forward vs rope_naive")
    assert_close_ref(out, ref.rope_cached(x, **kw), scale, "forward vs rope_cached")
    # Backward: grad_x = R(-theta) grad_out.
    xl = x.detach().requires_grad_()
    g = randn(out.shape, x.dtype, x.device)
    rope_ext.apply_rope(xl, impl=impl, **kw).backward(g)
    assert_close_f64(xl.grad, ref.rope_float64(g, inverse=True, **kw), g.abs().max().item(), "backward vs float64")


@pytest.mark.parametrize("view", ["contiguous", "slice", "transposed"])
@pytest.mark.parametrize("layout", rope_ext.LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_variant_dtype_layout_view(device, impl, dtype, layout, view):
    x = make_view(shape_of(layout), dtype, device, view)
    check_fwd_bwd(x, impl, **layout_kwargs(layout, device))


@pytest.mark.parametrize("impl", IMPLS)
def test_float64_input(device, impl):
    x = randn((B, S, H, D), torch.float64, device)
    check_fwd_bwd(x, impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_long_positions_fp32(device, impl):
    """In-kernel sin/cos stay accurate far out: positions up to 2^24, fp32 within
    2e-6 * max|x| of float64 (an fp32 angle would be off by up to ~1 rad here)."""
    x = randn((2, 64, 2, 128), torch.float32, device)
    pos = torch.randint(0, 2**24, (2, 64), device=device)
    pos[0, :4] = torch.tensor([2**20, 2**24 - 1, 10**6, 131071])
    out = rope_ext.apply_rope(x, pos, impl=impl)
    assert_close_f64(out, ref.rope_float64(x, pos), x.abs().max().item(), "long positions")


@pytest.mark.parametrize("impl", IMPLS)
def test_seed_rope_single_call(device, impl):
    """rope(x): x [..., S, D], position = index along S."""
    for shape in [(96, 64), (4, 96, 128), (2, 3, 40, 32)]:
        x = randn(shape, torch.float32, device)
        out = rope_ext.rope(x, impl=impl)
        x4 = x.reshape(-1, shape[-2], 1, shape[-1])
        assert_close_f64(out, ref.rope_float64(x4).reshape(shape), x.abs().max().item(), f"rope {shape}")


@pytest.mark.parametrize("impl", VECTOR_IMPLS)
def test_vector_impl_backward_any_grad(device, impl):
    """An explicit 16-byte variant also runs the backward: on an expanded grad (from .sum())
    and on a contiguous grad that starts mid-chunk (cat's backward slices it at 1 element)."""
    for layout in ("bshd", "bhsd"):
        x = randn(shape_of(layout), torch.float32, device).requires_grad_()
        y = rope_ext.apply_rope(x, layout=layout, impl=impl)
        y.sum().backward()
        assert_close_f64(x.grad, ref.rope_float64(torch.ones_like(x), layout=layout, inverse=True), 1.0, "sum grad")
        x.grad = None
        g = randn((1 + y.numel(),), torch.float32, device)
        (torch.cat([torch.zeros(1, device=device), rope_ext.apply_rope(x, layout=layout, impl=impl).flatten()]) * g
         ).sum().backward()
        gy = g[1:].view(y.shape)
        assert_close_f64(x.grad, ref.rope_float64(gy, layout=layout, inverse=True), gy.abs().max().item(),
                         "misaligned grad")


def test_layouts_agree(device):
    """The same tokens in every layout give the same rotated values."""
    x = randn((B, S, H, D), torch.bfloat16, device)
    base = rope_ext.apply_rope(x)
    assert torch.equal(rope_ext.apply_rope(x.transpose(0, 1).contiguous(), layout="sbhd").transpose(0, 1), base)
    assert torch.equal(rope_ext.apply_rope(x.transpose(1, 2).contiguous(), layout="bhsd").transpose(1, 2), base)


def test_deterministic(device):
    x = randn((B, S, H, D), torch.bfloat16, device)
    pos = torch.randint(0, 100000, (B, S), device=device)
    for impl in IMPLS:
        a = rope_ext.apply_rope(x, pos, impl=impl)
        assert torch.equal(a, rope_ext.apply_rope(x, pos, impl=impl)), impl


def test_nonfinite_propagate_locally(device):
    """NaN/Inf in x reach only the outputs that read them (the element and its partner)."""
    x = randn((1, 4, 2, 16), torch.float32, device)
    x[0, 1, 0, 3] = float("nan")
    x[0, 2, 1, 12] = float("inf")
    for impl in IMPLS:
        out = rope_ext.apply_rope(x, impl=impl)
        bad = ~torch.isfinite(out)
        expect = torch.zeros_like(bad)
        expect[0, 1, 0, [3, 11]] = True
        expect[0, 2, 1, [4, 12]] = True
        assert torch.equal(bad, expect), impl


cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@cuda_only
@pytest.mark.parametrize("rows_per_thread", [0, 1, 3, 1000])
def test_flat_rows_per_thread(rows_per_thread):
    """Variant 5 (flat) at every row-set size, from one row per thread to all rows of a
    token group (heads of q then k): q + k GQA in place at random positions, and out of
    place with a pass-through tail and GPT-J pairs, against float64."""
    rope_ext._C.set_flat_rows_per_thread(rows_per_thread)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            q, k = randn((16, 32, 128), dtype, "cuda"), randn((16, 8, 128), dtype, "cuda")
            pos = torch.randint(0, 131072, (16,), device="cuda")
            eq, ek = ref.rope_float64(q, pos, layout="thd"), ref.rope_float64(k, pos, layout="thd")
            sq, sk = q.abs().max().item(), k.abs().max().item()
            rope_ext.apply_rope_qk(q, k, pos, layout="thd", impl="flat", inplace=True)
            assert_close_f64(q, eq, sq, "flat q in place")
            assert_close_f64(k, ek, sk, "flat k in place")
            x = randn((B, S, H, D), dtype, "cuda")
            for kw in (dict(rotary_dim=32), dict(rotary_dim=48, interleaved=True)):
                out = rope_ext.apply_rope(x, impl="flat", **kw)
                assert_close_f64(out, ref.rope_float64(x, **kw), x.abs().max().item(), f"flat {kw}")
    finally:
        rope_ext._C.set_flat_rows_per_thread(0)




# Variant 6 (lean) is auto's kernel in the cases it covers (every size but few rows a
# token: test_lean_large_and_batch_fold has the large ones, test_lean_small_block_limit
# the few rows); no impl name selects it. These cases go through it (and some, on
# purpose, just past what it covers), at token counts that give every rows-per-thread choice (1, 2, 4, 8 on an H100), and are
# held against the float64 truth and bit for bit against variant 4 (the same arithmetic).
LEAN_CASES = [
    dict(),
    dict(interleaved=True),
    dict(backward=True),
    dict(offsets=True),
    dict(positions="int32"),
    dict(positions="strided"),
    # Around 2^24, where turns' fp32 reduction hands over to the double one (rope_math.h),
    # and frequencies above 1.5 rad, for which only some pairs of a chunk hand over there.
    dict(positions="huge"),
    dict(positions="huge", inv_freq="wide"),
    # A cos_sin_cache is read instead of computed (fp32 and the tensor's dtype).
    dict(cache="float32"),
    dict(cache="x", qk=True, inplace=True),
    dict(cache="float32", interleaved=True, backward=True),
    dict(cache="float16"),  # another 16-bit dtype than x's (bf16): scalar loads
    dict(thd_one_seq=True),
    dict(thd_one_seq=True, offsets=True),
    dict(qk=True),
    dict(qk=True, inplace=True),
    dict(rotary_dim=32, inplace=True),  # in place: the tail is left as it is (lean covers it)
    dict(rotary_dim=32),                # out of place: a tail to copy (the tiles take it)
    dict(view="slice"),
    dict(attention_factor=0.75),
]


@pytest.fixture(params=[(16, True), (8, True), (4, True), (16, False), (8, False)],
                ids=lambda p: f"{p[0]}B" + ("" if p[1] else "-noshare"))
def lean_up_to_32mb(request):
    """auto gives lean tensors up to 32 MB here (its defaults have no size limit), so every
    rows-per-thread choice runs through it, at each access width (its
    defaults pick 8 or 16 bytes by size; 4 is an A/B instance), with the block's sin/cos
    table in shared memory (the default) and with each lane computing its own."""
    width, share = request.param
    rope_ext._C.set_lean_max_bytes(32 << 20)
    rope_ext._C.set_lean_bytes(width)
    rope_ext._C.set_lean_share(share)
    yield
    rope_ext._C.set_lean_max_bytes(-1)
    rope_ext._C.set_lean_bytes(-1)
    rope_ext._C.set_lean_share(True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.usefixtures("lean_up_to_32mb")
@pytest.mark.parametrize("tokens", [1, 16, 300, 1024, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("case", range(len(LEAN_CASES)))
def test_lean_small_tensor_path(case, dtype, tokens):
    if tokens == 4096 and dtype == torch.float32:
        tokens = 2048  # keep the tensor within the 32 MB set by the fixture
    lean_case(LEAN_CASES[case], dtype, tokens, 32, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("tpb", [0, 2, 8])
@pytest.mark.parametrize("tokens", [1, 16, 300, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", range(len(LEAN_CASES)))
def test_lean_tokens_per_block(case, dtype, tokens, tpb):
    """Lean's cases with one head a tensor (q and k: one each), where a block holds several
    consecutive tokens (blockDim.y: the rule's choice, 0, or 2 / 8 forced through
    set_lean_tokens_per_block, fewer where S or 128 threads do not allow it), each row slot
    computing its own token's sin/cos. Positions per batch where the case has positions, so
    that the one-head fold does not take them. Each case against the float64 truth and bit
    for bit against the tiles (lean_case); the launch covers S exactly. By the rule at 4096
    tokens (S = 2048 or 4096), the neox cases that lean covers run a token under 64 threads
    (its rows, q and k's one head each times the one-head fold's B = 2 where no positions
    or offsets tensor keeps the batch apart, x a row's 16 bf16 / 32 fp32 threads) at 64
    threads' worth of tokens a block (a thread takes the token's rows): 4 bf16 tokens, 2
    fp32; a token of 64 threads or more at one a block."""
    C = rope_ext._C
    C.set_lean_tokens_per_block(tpb)
    if tpb:  # forced: no small-block limit, so that lean runs these blocks at every size
        C.set_lean_min_threads(0, 0)
    try:
        cfg = LEAN_CASES[case]
        lean_case(cfg, dtype, tokens, 1, 1)
        gx, gy, gz, _, _, got = C.last_lean_launch()
        # (the tiles take a tail to copy out of place; the backward case's last call is the tiles')
        covered = not cfg.get("backward") and not (cfg.get("rotary_dim") and not cfg.get("inplace"))
        if tpb == 0 and tokens == 4096 and covered and not cfg.get("interleaved") and not cfg.get("rotary_dim"):
            thd = cfg.get("thd_one_seq", False)
            folded = not thd and not cfg.get("positions") and not cfg.get("offsets")
            rows = (2 if folded else 1) * (2 if cfg.get("qk") else 1)
            row_threads = 16 if dtype == torch.bfloat16 else 32
            want = 64 // row_threads if rows * row_threads < 64 else 1
            assert gx > 0 and got == want, f"rule: launch {(gx, gy, gz)}, {got} tokens a block, {want} expected"
        if gx > 0:
            S = tokens if tokens < 4 or LEAN_CASES[case].get("thd_one_seq") else tokens // 2
            assert gy * got == S and got >= 1, f"launch {(gx, gy, gz, got)} for S {S}"
            if tpb:
                assert got <= tpb, f"{got} tokens a block, {tpb} forced"
            threads = 64 // (8 // torch.tensor([], dtype=dtype).element_size())  # a row's chunks at 8 bytes
            # one row a token (positions per batch: no fold), neox
            if tpb == 8 and S % 8 == 0 and cfg.get("positions") and not cfg.get("interleaved") and not cfg.get("qk"):
                assert got == min(8, 128 // threads), f"{got} tokens a block for S {S} ({threads} threads a row)"
    finally:
        C.set_lean_tokens_per_block(0)
        C.set_lean_min_threads(-1, -1)


def lean_case(cfg, dtype, tokens, Hq, Hk):
    """One of LEAN_CASES at Hq / Hk heads: auto (lean where it covers the case) against the
    float64 truth and bit for bit against the tiles, out of place or in place as the case
    says; the backward case through autograd."""
    cfg = dict(cfg)
    D = 128
    dev = "cuda"
    layout = "thd" if cfg.pop("thd_one_seq", False) else "bshd"
    Bn, Sn = (1, tokens) if layout == "thd" or tokens < 4 else (2, tokens // 2)
    shape = (Sn, Hq, D) if layout == "thd" else (Bn, Sn, Hq, D)
    kw = dict(layout=layout)
    if layout == "thd":
        kw["cu_seqlens"] = torch.tensor([0, Sn], dtype=torch.int32, device=dev)
    if cfg.pop("offsets", False):
        kw["offsets"] = torch.randint(0, 50000, (1 if layout == "thd" else Bn,), device=dev)
    pos_kind = cfg.pop("positions", None)
    pos = None
    if pos_kind == "int32":
        pos = torch.randint(0, 1 << 20, shape[:-2], device=dev, dtype=torch.int32)
    elif pos_kind == "strided":
        pos = torch.randint(0, 1 << 20, (*shape[:-2], 2), device=dev)[..., 0]
    elif pos_kind == "huge":
        pos = torch.randint((1 << 24) - 3000, (1 << 24) + 3000, shape[:-2], device=dev)
    cache_dtype = cfg.pop("cache", None)
    if cache_dtype:  # positions are the token indices here (< 4096)
        table = ref.cos_sin_table(D, 10000.0, 4096, dev)
        kw["cos_sin_cache"] = {"float32": table, "float16": table.half(), "x": table.to(dtype)}[cache_dtype]
    if cfg.pop("inv_freq", None) == "wide":
        f = rope_ext.inv_freq(D, 10000.0)
        f[::3] *= 3.0  # up to 3 rad per position: pos * f / 2 pi past 2^22 turns near 2^24
        kw["inv_freq"] = f.to(dev)
    view = cfg.pop("view", "contiguous")
    qk, inplace = cfg.pop("qk", False), cfg.pop("inplace", False)
    backward = cfg.pop("backward", False)
    kw.update(cfg)
    q = make_view(shape, dtype, dev, view)
    k = randn(shape[:-2] + (Hk, D), dtype, dev) if qk else None
    if backward:  # the gradient: the same kernels rotating by -theta
        g = randn(shape, dtype, dev)
        grads = []
        for impl in ("auto", "fp32x4_tile"):
            ql = q.detach().requires_grad_()
            rope_ext.apply_rope(ql, pos, impl=impl, **kw).backward(g)
            grads.append(ql.grad)
        assert_close_f64(grads[0], ref.rope_float64(g, pos, inverse=True, **kw), g.abs().max().item(), "lean grad")
        assert torch.equal(grads[0], grads[1]), "lean vs tiles (grad)"
        return
    xs = (q, k) if qk else (q,)
    truths = [ref.rope_float64(x, pos, **kw) for x in xs]
    tiles = [rope_ext.apply_rope(x, pos, impl="fp32x4_tile", **kw) for x in xs]
    if inplace:
        outs = [x.clone() for x in xs]
        (rope_ext.apply_rope_qk if qk else rope_ext.apply_rope)(*outs, pos, inplace=True, **kw)
    else:
        outs = rope_ext.apply_rope_qk(q, k, pos, **kw) if qk else (rope_ext.apply_rope(q, pos, **kw),)
    for name, x, out, truth, tile in zip("qk", xs, outs, truths, tiles):
        assert_close_f64(out, truth, x.abs().max().item(), f"lean {name} vs float64")
        assert torch.equal(out, tile), f"lean vs tiles ({name})"


def cuda_kernels_of(fn):
    """Names of the CUDA kernels one call of fn launches; None under compute-sanitizer
    (scripts/sanitize.sh sets ROPE_EXT_SANITIZER=1: the sanitizer's CUPTI subscription
    leaves none for the profiler), where fn still runs for the sanitizer and the callers
    leave out their checks of which kernel ran (the plain runs make them)."""
    if os.environ.get("ROPE_EXT_SANITIZER") == "1":
        fn()
        torch.cuda.synchronize()
        return None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def is_lean(name):
    """Whether a kernel name is variant 6's (rope_lean_kernel, or rope_lean_plain1_kernel:
    its plain calls at one row a thread and one token a block)."""
    return "rope_lean_kernel<" in name or "rope_lean_plain1_kernel<" in name


def lean_instances(names):
    """The template arguments (stripped strings) of each variant 6 launch among kernel
    names, in order: T, kInterleaved, U, W, kSource, kPlain, kHint; rope_lean_plain1_kernel<T,
    kInterleaved, W, kSource> as the same list (U 1, its kSource: 0 per lane, 2 a cache in x's
    dtype, 3 an fp32 one; kPlain, no hint) + "plain1"."""
    out = []
    for n in names:
        for kern in ("rope_lean_kernel<", "rope_lean_plain1_kernel<"):
            if kern in n:
                a = [a.strip() for a in n.split(kern, 1)[1].split(">", 1)[0].split(",")]
                if kern == "rope_lean_kernel<":
                    out.append(a)
                else:
                    out.append([a[0], a[1], "1", a[2], a[3], "true", "false", "plain1"])
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("offsets", ["int", "tensor", "tensor 2^33"])
@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("start", [0, 7])
@pytest.mark.parametrize("tokens", [16, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lean_packed_position_guess(dtype, tokens, start, cu_dtype, offsets):
    """One packed sequence. With an int offset lean starts sin/cos from the position
    s + offset before cu_seqlens[0] arrives and computes them again where that was not
    0; with an offsets tensor it loads both (the offset, then cu_seqlens[0] beside it)
    and waits. cu_seqlens[0] is 0 in every valid call; a non-zero start (not checked on
    CUDA unless value checks are on) takes the guess's second pass and the subtraction,
    which must give the tiles' bits (they subtract it too). Both widths of cu_seqlens,
    an int64 offset past 2^32 (the raw high word); blocks of the default 128 threads, of
    the old rule's smaller shapes (set_lean_min_block(1)), and a two-head call in
    16-byte chunks whose blocks hold 16 threads for 64 pairs (the block's sin/cos table
    then takes several pairs per thread). Lean's knobs are pinned and its kernel is
    checked to be the one that ran."""
    dev, D = "cuda", 128
    x = randn((tokens, 32, D), dtype, dev)
    cu = torch.tensor([start, tokens], dtype=cu_dtype, device=dev)
    off = {"int": 5, "tensor": torch.tensor([5], device=dev),
           "tensor 2^33": torch.tensor([(1 << 33) + 5], dtype=torch.int64, device=dev)}[offsets]
    kw = dict(layout="thd", cu_seqlens=cu, offsets=off, inv_freq=rope_ext.inv_freq(D, device=dev))
    tile = rope_ext.apply_rope(x, impl="fp32x4_tile", **kw)
    x2 = x[:, :2].contiguous()
    tile2 = rope_ext.apply_rope(x2, impl="fp32x4_tile", **kw)
    if start == 0 and offsets != "tensor 2^33":
        assert_close_f64(tile, ref.rope_float64(x, **kw), x.abs().max().item(), "tiles vs float64")
    C = rope_ext._C
    try:
        C.set_lean_max_bytes(32 << 20)
        C.set_lean_share(True)
        names = cuda_kernels_of(lambda: rope_ext.apply_rope(x, **kw))
        assert names is None or any(is_lean(n) for n in names), \
            "auto did not take lean here: the test would not test it"
        for min_block in (0, 1):
            C.set_lean_min_block(min_block)
            out = rope_ext.apply_rope(x, **kw)
            outs = rope_ext.apply_rope_qk(x, x[:, :8].contiguous(), **kw)
            assert not torch.isnan(out).any()
            assert torch.equal(out, tile), f"lean vs tiles (start {start}, min_block {min_block})"
            assert torch.equal(outs[0], tile) and torch.equal(outs[1], tile[:, :8]), "lean q + k vs tiles"
        if dtype == torch.bfloat16:
            C.set_lean_min_block(0)
            C.set_lean_bytes(16)
            assert torch.equal(rope_ext.apply_rope(x2, **kw), tile2), "lean, 16-thread blocks (4 table pairs per thread), vs tiles"
    finally:
        C.set_lean_min_block(0)
        C.set_lean_bytes(-1)
        C.set_lean_max_bytes(-1)
        C.set_lean_share(True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("positions", [False, True])
@pytest.mark.parametrize("B,S", [(2, 8), (3, 1), (1, 5)])
@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_lean_token_strides(layout, B, S, positions):
    """Lean reads an input's token offset as one stride times (b * S + s), plus b times a
    correction from a later parameter line where the batch stride is not S token strides
    (bhsd, and sbhd with per-batch positions, with B > 1 and S > 1; sbhd without positions
    runs with the batch folded into the token, test_lean_large_and_batch_fold). Every
    layout with and without that correction,
    q + k (different head counts), positions per batch and token or none: lean must be
    the kernel that ran, bit-equal to the tiles, and within the float64 truth's bounds;
    also with 2 and 4 rows per thread, with each lane computing its own sin/cos (no shared
    table), and (bshd) with a k whose memory is head-major, so that only k needs the
    correction; calls without positions in the position-free instance (plain, checked
    to run) and in the general one. A strided inv_freq is outside lean's layout: the
    tiles take it, with the same bits."""
    dev, D, dtype = "cuda", 128, torch.bfloat16
    def shape(H):
        return {"bshd": (B, S, H, D), "sbhd": (S, B, H, D), "bhsd": (B, H, S, D)}[layout]
    q, k = randn(shape(32), dtype, dev), randn(shape(8), dtype, dev)
    pos = torch.randint(0, 1 << 20, (B, S), device=dev) if positions else None
    kw = dict(layout=layout)
    C = rope_ext._C
    try:
        C.set_lean_max_bytes(32 << 20)
        names = cuda_kernels_of(lambda: rope_ext.apply_rope_qk(q, k, pos, **kw))
        if names is not None:
            lean = lean_instances(names)
            assert lean, "auto did not take lean here: the test would not test it"
            # kPlain (the sixth template argument): true exactly without positions.
            assert any((a[5] == "true") == (pos is None) for a in lean), \
                f"plain instance {'not ' if pos is None else ''}taken: {names}"
        pairs = [(q, k)]
        if layout == "bshd":  # k [B, S, 8, D] over [B, 8, S, D] memory
            pairs.append((q, randn((B, 8, S, D), dtype, dev).transpose(1, 2)))
        # (plain: calls without position tensors in the instance without the position code;
        # off, the general instance takes them)
        # (U = 4: four rows a thread, strided by the block's row slots, with the batch
        # correction and the q / k select per row)
        for rows_per_thread, share, plain in ((0, True, True), (2, True, True), (4, True, True), (0, False, True),
                                              (0, True, False), (0, False, False)):
            C.set_lean_rows_per_thread(rows_per_thread)
            C.set_lean_share(share)
            C.set_lean_plain(plain)
            for qq, kk in pairs:
                outs = rope_ext.apply_rope_qk(qq, kk, pos, **kw)
                for x, out in zip((qq, kk), outs):
                    tile = rope_ext.apply_rope(x, pos, impl="fp32x4_tile", **kw)
                    what = f"({layout}, B {B}, S {S}, U {rows_per_thread}, share {share}, plain {plain}, k {tuple(kk.stride())})"
                    assert torch.equal(out, tile), f"lean vs tiles {what}"
                    assert_close_f64(out, ref.rope_float64(x, pos, **kw), x.abs().max().item(), f"lean vs float64 {what}")
        C.set_lean_rows_per_thread(0)
        C.set_lean_share(True)
        C.set_lean_plain(True)
        # One head a tensor at two tokens a block (S = 8; forced, no small-block limit):
        # the token offset b * S + s with S = grid y x tokens a block, the correction too.
        C.set_lean_min_threads(0, 0)
        C.set_lean_tokens_per_block(2)
        q1, k1 = randn(shape(1), dtype, dev), randn(shape(1), dtype, dev)
        outs = rope_ext.apply_rope_qk(q1, k1, pos, **kw)
        gx, gy, _, _, _, tpb = C.last_lean_launch()
        assert gx > 0 and gy * tpb == S and tpb == (2 if S % 2 == 0 else 1), f"launch {(gx, gy)}, {tpb} tokens"
        for x, out in zip((q1, k1), outs):
            what = f"(one head, {layout}, B {B}, S {S}, {tpb} tokens a block)"
            assert torch.equal(out, rope_ext.apply_rope(x, pos, impl="fp32x4_tile", **kw)), f"lean vs tiles {what}"
            assert_close_f64(out, ref.rope_float64(x, pos, **kw), x.abs().max().item(), f"lean vs float64 {what}")
        C.set_lean_tokens_per_block(0)
        C.set_lean_min_threads(-1, -1)
        f = torch.empty(D, device=dev)[::2]
        f.copy_(rope_ext.inv_freq(D, device=dev))
        names = cuda_kernels_of(lambda: rope_ext.apply_rope(q, pos, inv_freq=f, **kw))
        assert names is None or not any(is_lean(n) for n in names)
        assert torch.equal(rope_ext.apply_rope(q, pos, inv_freq=f, **kw),
                           rope_ext.apply_rope(q, pos, inv_freq=f.contiguous(), **kw)), "strided inv_freq: lean's bits"
    finally:
        C.set_lean_max_bytes(-1)
        C.set_lean_rows_per_thread(0)
        C.set_lean_share(True)
        C.set_lean_plain(True)
        C.set_lean_tokens_per_block(0)
        C.set_lean_min_threads(-1, -1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("positions", ["none", "shared", "per batch", "offset"])
@pytest.mark.parametrize("layout,shape,dtype", [
    ("sbhd", (520, 8, 32, 128), torch.bfloat16),   # q + k 42 MB: past 32 MB, folded
    ("bshd", (2, 2100, 32, 128), torch.bfloat16),  # 43 MB, token-major without a fold
    ("bshd", (2, 1100, 32, 128), torch.float32),   # 45 MB: fp32 past 32 MB too
    ("sbhd", (7, 3, 4, 128), torch.float16),
    ("sbhd", (7, 3, 4, 128), torch.bfloat16),
    ("bhsd", (3, 4, 7, 128), torch.bfloat16),      # the batch outside the sequence: not folded
    ("sbhd qkv", (7, 3, 4, 128), torch.bfloat16),  # q, k head slices of one [S, B, 4 + 2 * 8, D] buffer
])
def test_lean_large_and_batch_fold(layout, shape, dtype, positions):
    """16-bit and fp32 tensors past 32 MB in token-major memory go to lean at its defaults (two rows a
    thread there), and an sbhd call with positions shared by the batch (none, [S], or a
    scalar offset) runs as one token of B * H rows (the batch fold: lean's grid (row blocks,
    S, 1)). Per-batch positions, bhsd, and a fused QKV buffer (q's batch stride is not H x
    its head stride) are not folded (grid z = B), and unfolded sbhd past 32 MB takes the
    tiles. Each case: the kernel expected ran (lean with the grid and rows per thread
    expected, rope_ext._C.last_lean_launch), out of place and in place bit-equal to the
    tiles, within the float64 truth's bounds; outputs are poisoned before a kernel writes."""
    dev, C = "cuda", rope_ext._C
    fused = layout == "sbhd qkv"
    layout = "sbhd" if fused else layout
    S, B = {"sbhd": (shape[0], shape[1]), "bshd": (shape[1], shape[0]), "bhsd": (shape[2], shape[0])}[layout]
    if fused:
        buf = randn(shape[:2] + (shape[2] + 16, shape[3]), dtype, dev)
        q, k = buf[:, :, :shape[2]], buf[:, :, shape[2]:shape[2] + 8]
    else:
        q = randn(shape, dtype, dev)
        kshape = list(shape)
        kshape[1 if layout == "bhsd" else 2] = 8  # the heads' dimension
        k = randn(tuple(kshape), dtype, dev)
    pos = {"shared": torch.randint(0, 1 << 20, (S,), device=dev),
           "per batch": torch.randint(0, 1 << 20, (B, S), device=dev)}.get(positions)
    kw = dict(layout=layout)
    if positions == "offset":
        kw["offsets"] = 1000
    folded = layout == "sbhd" and not fused and positions != "per batch"
    big = (q.numel() + k.numel()) * q.element_size() > 32 << 20
    # Past 32 MB lean takes token-major memory only: unfolded sbhd goes to the tiles.
    lean = not (big and layout == "sbhd" and not folded)
    what = f"({layout}{' qkv' if fused else ''} {list(q.shape)} {dtype}, positions {positions})"
    names = cuda_kernels_of(lambda: rope_ext.apply_rope_qk(q, k, pos, **kw))
    if names is not None:
        assert any(is_lean(n) for n in names) == lean, f"lean {'not ' if lean else ''}taken {what}: {names}"
    outs = rope_ext.apply_rope_qk(q, k, pos, **kw)
    gx, gy, gz, rows_per_thread, _, _ = C.last_lean_launch()  # zeros when this call did not launch lean
    assert (gx > 0) == lean, f"lean {'not ' if lean else ''}launched {what}: {(gx, gy, gz)}"
    if lean:
        assert gx > 0 and gy == S, f"lean's last launch {(gx, gy, gz)} is not this call's {what}"
        assert gz == (1 if folded else B), f"batch {'not ' if folded else ''}folded {what}: grid {(gx, gy, gz)}"
        if big:
            assert rows_per_thread == 2, f"past 32 MB lean takes 2 rows a thread, took {rows_per_thread} {what}"
    ins = [q.clone(), k.clone()]
    if fused:  # in place on the fused buffer itself, as a model holding QKV in one tensor would
        buf2 = buf.clone()
        ins = [buf2[:, :, :shape[2]], buf2[:, :, shape[2]:shape[2] + 8]]
    rope_ext.apply_rope_qk(*ins, pos, inplace=True, **kw)
    gx, gy, gz, _, _, _ = C.last_lean_launch()
    assert (gx > 0) == lean and (not lean or (gy, gz) == (S, 1 if folded else B)), f"in place {what}: {(gx, gy, gz)}"
    for x, out, inp in zip((q, k), outs, ins):
        tile = rope_ext.apply_rope(x, pos, impl="fp32x4_tile", **kw)
        assert torch.equal(out, tile), f"lean vs tiles {what}"
        assert torch.equal(inp, tile), f"lean in place vs tiles {what}"
        assert_close_f64(out, ref.rope_float64(x, pos, **kw), x.abs().max().item(), f"lean vs float64 {what}")
    if fused:  # the slots no call writes (the V heads) untouched
        assert torch.equal(buf2[:, :, shape[2] + 8:], buf[:, :, shape[2] + 8:]), f"V heads written {what}"


def _hint_case(case):
    """test_lean_l2_hint's inputs: (make, kw, want_hint, inplace_only, rows_per_thread);
    make() gives fresh (x, k or None, positions or None) of the case's layout and strides."""
    dev, bf = "cuda", torch.bfloat16
    T = 5120
    if case == "bshd":  # 40 MB
        return (lambda: (randn((1, T, 32, 128), bf, dev), None, None)), {}, True, False, 0
    if case == "u1":  # the same at one row a thread (set_lean_rows_per_thread)
        return (lambda: (randn((1, T, 32, 128), bf, dev), None, None)), {}, True, False, 1
    if case == "sbhd_folded":  # 40 MB, the batch folded into the token
        return (lambda: (randn((640, 8, 32, 128), bf, dev), None, None)), dict(layout="sbhd"), True, False, 0
    if case == "fp32":  # W 16
        return (lambda: (randn((1, 2600, 32, 128), torch.float32, dev), None, None)), {}, True, False, 0
    if case == "gptj":
        return (lambda: (randn((1, T, 32, 128), bf, dev), None, None)), dict(interleaved=True), True, False, 0
    if case == "qk_thd_positions":
        pos = torch.randint(0, 1 << 20, (T,), device=dev)
        return (lambda: (randn((T, 32, 128), bf, dev), randn((T, 8, 128), bf, dev), pos)), dict(layout="thd"), \
            True, False, 0
    if case == "qk_u4":  # 4 rows a thread forced: no hinted instance there, plain loads (its hinted-vs-plain
        # equality compares two plain launches; the hint flag, the instance and U = 4 are what it checks)
        pos = torch.randint(0, 1 << 20, (T,), device=dev)
        return (lambda: (randn((T, 32, 128), bf, dev), randn((T, 8, 128), bf, dev), pos)), dict(layout="thd"), \
            False, False, 4
    if case == "one_head_fold":  # one head, B rows folded into the token (the batch stride as head stride)
        return (lambda: (randn((320, 512, 1, 128), bf, dev), None, None)), {}, True, False, 0
    if case == "two_heads":  # a few-row token: per-lane sin/cos, several tokens a block
        return (lambda: (randn((20, 4096, 2, 128), bf, dev), None, None)), {}, True, False, 0
    if case == "rotary_64_inplace":  # halves of 64 bytes (out of place the tail's copy takes the tiles)
        return (lambda: (randn((1, T, 32, 128), bf, dev), None, None)), dict(rotary_dim=64), False, True, 0
    if case == "base_offset":  # every stride aligned, the base 16 bytes off a line
        return (lambda: (randn((T * 32 * 128 + 8,), bf, dev)[8:].view(1, T, 32, 128), None, None)), {}, False, \
            False, 0
    if case == "token_stride":  # the token stride 16 bytes off a multiple of 128, the rest aligned
        return (lambda: (randn((T, 32 * 128 + 8), bf, dev)[:, :32 * 128].unflatten(1, (32, 128))[None], None, None)), \
            {}, False, False, 0
    if case == "k_head_stride":  # q aligned; k's head stride 272 bytes
        pos = torch.randint(0, 1 << 20, (T,), device=dev)
        return (lambda: (randn((T, 32, 128), bf, dev), randn((T, 8, 136), bf, dev)[..., :128], pos)), \
            dict(layout="thd"), False, False, 0
    assert case == "small"  # 32 MB: not past it
    return (lambda: (randn((1, 4096, 32, 128), bf, dev), None, None)), {}, False, False, 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", ["bshd", "u1", "sbhd_folded", "fp32", "gptj", "qk_thd_positions", "qk_u4",
                                  "one_head_fold", "two_heads", "rotary_64_inplace", "base_offset", "token_stride",
                                  "k_head_stride", "small"])
def test_lean_l2_hint(case):
    """Lean's L2 hint (on by default; set_lean_l2_hint(False): plain loads. x loaded with
    evict_last, each line demoted after use) is taken past 32 MB where every line of x
    starts at a chunk: the hinted instance ran (the kernel's seventh template argument,
    last_lean_hint), and its outputs are bit-equal to the plain loads' (out of place and in
    place; the plain ones within the float64 truth's bounds). Refused (plain loads) where a
    line would not be demoted: a rotary half of 64 bytes, a base 16 bytes off a line, a
    token stride off 128 bytes, k's head stride off them; and at 32 MB and under. Covers the
    table and per-lane instances, one and two rows a thread, fp32, GPT-J, the folds; four
    rows a thread forced take plain loads (no hinted instance there)."""
    C = rope_ext._C
    make, kw, want_hint, inplace_only, u = _hint_case(case)

    def run(inplace):
        x, k, pos = make()
        op = rope_ext.apply_rope_qk if k is not None else rope_ext.apply_rope
        ts = (x, k) if k is not None else (x,)
        out = op(*ts, pos, inplace=True, **kw) if inplace else op(*ts, pos, **kw)
        return ts if inplace else (out if k is not None else (out,)), (x, k, pos)

    def launched(inplace):
        names = cuda_kernels_of(lambda: run(inplace))
        if names is None:  # (under compute-sanitizer)
            return
        lean = lean_instances(names)
        assert len(lean) == 1, f"{case}: one lean launch expected: {names}"
        assert (lean[0][6] == "true") == want_hint, f"{case}: the instance {lean[0]}, hint expected {want_hint}"

    # A seed of the case's own: the hinted output, allocated while the plain one is alive,
    # cannot find another case's identical values in a reused block.
    seed = zlib.crc32(case.encode())
    C.set_lean_rows_per_thread(u)
    try:
        for inplace in ([True] if inplace_only else [False, True]):
            torch.manual_seed(seed)
            C.set_lean_l2_hint(False)
            plain, (x, k, pos) = run(inplace)
            C.set_lean_l2_hint(True)
            torch.manual_seed(seed)  # the same inputs
            hinted, _ = run(inplace)
            ran, launch = C.last_lean_hint(), C.last_lean_launch()
            assert launch[0] > 0 and ran == want_hint, f"{case} (in place {inplace}): hint {ran}, expected {want_hint}"
            if u:
                assert launch[3] == u, f"{case}: {launch[3]} rows a thread, {u} forced"
            for a, b in zip(plain, hinted):
                assert torch.equal(a, b), f"{case} (in place {inplace}): the hinted output differs"
            if not inplace:
                assert_close_f64(plain[0], ref.rope_float64(x, pos, **kw), x.abs().max().item(), f"{case} vs float64")
            launched(inplace)
    finally:
        C.set_lean_l2_hint(True)
        C.set_lean_rows_per_thread(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lean_rows_per_block(dtype):
    """set_lean_rows_per_block, the A/B knob of W4's launch (q [T, 32, 128] + k [T, 8, 128]
    thd, random positions, past 32 MB: the hinted table instances at the rule's 2 rows a
    thread): a block of any count of row slots, powers of 2 or not, a token's 40 rows at U
    rows a thread in ceil(ceil(40 / U) / RB) blocks, several tokens a block under 64
    threads; a count past 128 threads keeps the rule's 8. Every launch bit-equal to the
    tiles, out of place and in place (outputs poisoned), the tiles within the float64
    truth's bounds; the hint only at U <= 2."""
    C = rope_ext._C
    dev, T = "cuda", 5120
    q, k = randn((T, 32, 128), dtype, dev), randn((T, 8, 128), dtype, dev)
    pos = torch.randint(0, 1 << 20, (T,), device=dev)
    kw = dict(layout="thd")
    want = [rope_ext.apply_rope(x, pos, impl="fp32x4_tile", **kw) for x in (q, k)]
    for x, w in zip((q, k), want):
        assert_close_f64(w, ref.rope_float64(x, pos, **kw), x.abs().max().item(), "tiles vs float64")
    try:
        for u, rb in ((0, 0), (2, 5), (2, 4), (2, 7), (4, 5), (4, 3), (4, 1), (8, 5), (8, 0), (1, 6), (2, 9)):
            C.set_lean_rows_per_thread(u)
            C.set_lean_rows_per_block(rb)
            what = f"({dtype}, U {u}, RB {rb})"
            names = cuda_kernels_of(lambda: rope_ext.apply_rope_qk(q, k, pos, **kw))
            gx, gy, _, got_u, _, tpb = C.last_lean_launch()
            u_ran = u or 2  # (the rule's U here)
            rb_ran = rb if 0 < rb <= 8 else 8  # (16 threads a row: at most 8 row slots)
            slots = -(-40 // u_ran)  # a token's row slots
            want_tpb = 1  # (blocks under 64 threads take several tokens)
            while rb_ran * 16 * want_tpb < 64:
                want_tpb *= 2
            assert (got_u, gx, gy, tpb) == (u_ran, -(-slots // rb_ran), T // want_tpb, want_tpb), \
                f"launch {what}: {C.last_lean_launch()}"
            assert C.last_lean_hint() == (u_ran <= 2), f"hint {what}"
            if names is not None:
                lean = lean_instances(names)
                assert len(lean) == 1 and (lean[0][6] == "true") == (u_ran <= 2), f"instance {what}: {names}"
                # the block's sin/cos table at one token a block, per-lane sin/cos with several
                assert lean[0][4] == ("1" if tpb == 1 else "0"), f"frequency source {what}: {lean[0]}"
            for inplace in (False, True):
                if inplace:
                    ins = [q.clone(), k.clone()]
                    rope_ext.apply_rope_qk(*ins, pos, inplace=True, **kw)
                    outs = ins
                else:
                    outs = rope_ext.apply_rope_qk(q, k, pos, **kw)
                for out, w in zip(outs, want):
                    assert torch.equal(out, w), f"lean vs tiles {what}, in place {inplace}"
    finally:
        C.set_lean_rows_per_thread(0)
        C.set_lean_rows_per_block(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("heads", [1, 2, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lean_small_block_limit(dtype, heads):
    """Lean's block holds one token's rows, so few heads make small blocks (one bf16 head:
    16 threads a row; here the one-head fold puts the B = 2 rows in the token, 32).
    set_lean_min_threads(threads, from_bytes): past from_bytes of x, a call whose block's
    rows x threads a row (a token's, times its tokens a block) are fewer takes the tiles
    (defaults 64, 256 KB), rows a thread stop where a block would fall under that many,
    and blocks take consecutive tokens up to that many while the grid keeps a block per SM
    (here 100 tokens: 50 or 100 blocks at 2 a block, fewer than the H100's 132 SMs, so one
    token a block).
    Each setting: the kernel expected ran (last_lean_launch), bit-equal to the tiles,
    within the float64 truth's bounds."""
    dev, C = "cuda", rope_ext._C

    def row_threads(t):  # lean's threads a row of 128: its width rule (16 bytes for fp32 past 4 MB, else 8)
        nb = t.numel() * t.element_size()
        return 64 // ((16 if t.dtype == torch.float32 and nb > 4 << 20 else 8) // t.element_size())

    C.set_lean_bytes(-1)
    x = randn((2, 100, heads, 128), dtype, dev)  # small: one row a thread
    want = rope_ext.apply_rope(x, impl="fp32x4_tile")
    truth = ref.rope_float64(x)
    nbytes = x.numel() * x.element_size()
    rows = heads * (2 if heads == 1 else 1)  # a token's rows (one head: the fold's B rows)
    try:
        for threads, from_bytes in ((0, 0), (64, 0), (64, nbytes), (256, 0)):
            C.set_lean_min_threads(threads, from_bytes)
            out = rope_ext.apply_rope(x)
            gx, *_ = C.last_lean_launch()
            block = row_threads(x) * rows  # a token's rows x threads a row
            lean = not (block < threads and nbytes > from_bytes)
            assert (gx > 0) == lean, f"limit {(threads, from_bytes)}, {heads} heads {dtype}: lean {gx > 0}"
            assert torch.equal(out, want), f"limit {(threads, from_bytes)}: vs the tiles"
            assert_close_f64(out, truth, x.abs().max().item(), f"limit {(threads, from_bytes)}")
        # The defaults (-1: 64 threads past 256 KB) on a call past 256 KB; the width by
        # lean's rule (16 bytes for fp32 past 4 MB). A token under 64 threads: a thread
        # takes all its rows and a block 64 threads' worth of tokens (1100 divides by 4), so
        # every head count runs on lean; 1101 (odd): one token a block, so such a token
        # takes the tiles.
        C.set_lean_min_threads(-1, -1)
        for S in (1100, 1101):
            big = randn((2, S, heads, 128), dtype, dev)
            out = rope_ext.apply_rope(big)
            gx, gy, _, U, _, tpb = C.last_lean_launch()
            few = row_threads(big) * rows < 64
            # a thread takes the few rows, a block 64 // a row's threads tokens where S divides by them
            want_tpb = (64 // row_threads(big) if S % (64 // row_threads(big)) == 0 else 1) if few else 1
            lean = not few or row_threads(big) * want_tpb >= 64
            what = f"defaults, S {S}, {heads} heads {dtype}"
            assert (gx > 0) == lean, f"{what}: lean {gx > 0}"
            if lean:
                assert tpb == want_tpb and gy * tpb == S, f"{what}: {tpb} tokens a block, grid y {gy}"
                if few:  # a thread takes the token's rows (16-bit types at least 2)
                    assert U >= rows and (U >= 2 or dtype == torch.float32), f"{what}: {U} rows a thread"
                else:  # rows a thread stop where a block would fall under 64 threads
                    assert -(-rows // U) * row_threads(big) >= 64, f"{what}: {U} rows a thread"
            assert torch.equal(out, rope_ext.apply_rope(big, impl="fp32x4_tile")), f"{what}: vs the tiles"
    finally:
        C.set_lean_min_threads(-1, -1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("heads", [1, 2, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lean_table_only_when_shared(dtype, heads):
    """Lean's block computes its token's sin/cos into a shared table (kSource 1, the
    instance's fifth template argument) only where the block has more than one row slot;
    a block of one row (one head, B = 1: no fold), or a token under 64 threads (whose
    thread takes all its rows: two bf16 heads), computes them per lane (kSource 0). A call
    without positions at one row a thread and one token a block runs rope_lean_plain1_kernel
    (per lane) instead.
    Either way bit-equal to the tiles and within the float64 truth's bounds."""
    table = heads > 1 and heads * (16 if dtype == torch.bfloat16 else 32) >= 64  # a row's threads at 8 bytes
    x = randn((1, 64, heads, 128), dtype, "cuda")
    pos = torch.randint(0, 1 << 20, (64,), device="cuda")
    for p in (None, pos):
        names = cuda_kernels_of(lambda: rope_ext.apply_rope(x, p))
        if names is not None:
            args = lean_instances(names)
            assert len(args) == 1, f"one lean launch expected: {names}"
            _, _, _, u, _, tpb = rope_ext._C.last_lean_launch()
            if p is None and u == 1 and tpb == 1:  # (a plain call at one row a thread: rope_lean_plain1_kernel)
                assert args[0][7:] == ["plain1"], f"{heads} heads, no positions: {names}"
            else:
                assert args[0][4] == ("1" if table else "0"), f"{heads} heads: {names}"
        out = rope_ext.apply_rope(x, p)
        assert torch.equal(out, rope_ext.apply_rope(x, p, impl="fp32x4_tile")), f"{heads} heads vs the tiles"
        assert_close_f64(out, ref.rope_float64(x, p), x.abs().max().item(), f"{heads} heads")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", ["bshd B2", "qk", "gptj fp32", "fp16 W16 offset", "W16 two-row blocks",
                                  "cache bf16", "cache fp32 qk offset", "cache fp32 gptj", "cache strided rows"])
def test_lean_plain1_knob(case):
    """Plain calls (no position tensors) at one row a thread and one token a block run
    rope_lean_plain1_kernel, per lane, or with a contiguous cos_sin_cache reading the row
    s + offset (its kSource 2 in x's dtype, 3 in fp32; a table of strided rows keeps
    rope_lean_kernel's cache instance); with set_lean_plain1(False) rope_lean_kernel's kPlain
    instance (its cache instance) takes them (the A/B). Both are checked to be the kernel
    that ran, bit-equal to each other and to the tiles, out of place and in place, and
    within the float64 truth's bounds."""
    C, dev = rope_ext._C, "cuda"
    kw, k = {}, None
    if case == "bshd B2":
        x = randn((2, 16, 32, 128), torch.bfloat16, dev)
    elif case == "qk":
        x, k = randn((1, 16, 32, 128), torch.bfloat16, dev), randn((1, 16, 8, 128), torch.bfloat16, dev)
    elif case == "gptj fp32":
        x = randn((1, 8, 8, 64), torch.float32, dev)
        kw = dict(interleaved=True)
    elif case == "fp16 W16 offset":
        x = randn((1, 16, 8, 128), torch.float16, dev)  # (8 heads: 64 threads a token, one row each)
        kw = dict(offsets=1000)
        C.set_lean_bytes(16)
    elif case == "W16 two-row blocks":  # one token: rows halved to cover the SMs down to 16-thread blocks
        x = randn((1, 1, 32, 128), torch.bfloat16, dev)
        kw = dict(offsets=77)
        C.set_lean_bytes(16)
        C.set_lean_min_block(16)
    elif case == "cache bf16":
        x = randn((1, 16, 32, 128), torch.bfloat16, dev)
        kw = dict(cos_sin_cache=ref.cos_sin_table(128, 10000.0, 16, dev).bfloat16())
    elif case == "cache fp32 qk offset":
        x, k = randn((2, 8, 16, 128), torch.bfloat16, dev), randn((2, 8, 4, 128), torch.bfloat16, dev)
        kw = dict(offsets=500, cos_sin_cache=ref.cos_sin_table(128, 10000.0, 600, dev))
    elif case == "cache fp32 gptj":
        x = randn((1, 8, 8, 64), torch.float32, dev)
        kw = dict(interleaved=True, cos_sin_cache=ref.cos_sin_table(64, 500000.0, 8, dev))
    else:  # rows of 136 columns, the table its first 128
        x = randn((1, 16, 32, 128), torch.bfloat16, dev)
        wide = torch.zeros(16, 136, device=dev)
        wide[:, :128] = ref.cos_sin_table(128, 10000.0, 16, dev)
        kw = dict(cos_sin_cache=wide[:, :128])
    csc = kw.get("cos_sin_cache")
    src = "0" if csc is None else "3" if csc.dtype == torch.float32 else "2"  # plain1's kSource
    to_plain1 = case != "cache strided rows"

    def call(inplace=False):
        if k is None:
            if not inplace:
                return (rope_ext.apply_rope(x, **kw),)
            y = x.clone()
            rope_ext.apply_rope(y, inplace=True, **kw)
            return (y,)
        if not inplace:
            return rope_ext.apply_rope_qk(x, k, **kw)
        q2, k2 = x.clone(), k.clone()
        rope_ext.apply_rope_qk(q2, k2, inplace=True, **kw)
        return q2, k2

    try:
        got = {}
        for mode in ("on", "off"):
            C.set_lean_plain1(mode == "on")
            names = cuda_kernels_of(call)
            if names is not None:
                lean = lean_instances(names)
                assert len(lean) == 1, f"{case}: one lean launch expected: {names}"
                if mode == "on" and to_plain1:
                    assert lean[0][7:] == ["plain1"] and lean[0][4] == src, f"{case}: plain1 {src} expected: {names}"
                else:
                    plain = "false" if csc is not None else "true"
                    assert lean[0][7:] == [] and lean[0][5] == plain, f"{case}: rope_lean_kernel expected: {names}"
                    if csc is not None:
                        assert lean[0][4] == "2", f"{case} {mode}: its cache instance expected: {names}"
            if case == "W16 two-row blocks":
                grid = rope_ext._C.last_lean_launch()[:3]  # (32 rows, 2 a block)
                assert grid[0] == 16, f"{case}: 2 rows a block expected, grid {grid}"
            got[mode] = (call(), call(inplace=True))
        tiles = rope_ext.apply_rope_qk(x, k, impl="fp32x4_tile", **kw) if k is not None else \
            (rope_ext.apply_rope(x, impl="fp32x4_tile", **kw),)
        for mode, outs2 in got.items():
            for outs in outs2:
                for o, t in zip(outs, tiles):
                    assert torch.equal(o, t), f"{case} {mode}: vs the tiles"
        for o, xi in zip(got["on"][0], (x,) if k is None else (x, k)):
            assert_close_f64(o, ref.rope_float64(xi, **kw), xi.abs().max().item(), f"{case} vs float64")
    finally:
        C.set_lean_plain1(True)
        C.set_lean_bytes(-1)
        C.set_lean_min_block(0)


@pytest.mark.skipif(not rope_ext.WITH_CUDA, reason="the variable is read by the CUDA build")
@pytest.mark.parametrize("value,valid,lean", [("0", True, True), ("64,262144", True, False), ("garbage", False, False),
                                              ("64,", False, False), ("-1", False, False)])
def test_lean_min_threads_env(value, valid, lean):
    """ROPE_EXT_LEAN_MIN_THREADS="threads[,from_bytes]": a malformed value warns on stderr and
    keeps the defaults (64 threads past 256 KB), never a silent "limit off". With a GPU, a
    one-head bf16 call of 1 MB (16 threads a token; S odd, so one token a block) takes lean
    only with the limit off."""
    code = ("import torch, rope_ext\n"
            "if torch.cuda.is_available():\n"
            "    rope_ext.apply_rope(torch.randn(1, 4095, 1, 128, device='cuda').bfloat16())\n"
            "    print('lean', rope_ext._C.last_lean_launch()[0] > 0)\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ROPE_EXT_LEAN_MIN_THREADS": value},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("ROPE_EXT_LEAN_MIN_THREADS" in r.stderr) == (not valid), r.stderr[-2000:]
    if torch.cuda.is_available():
        assert f"lean {lean}" in r.stdout, (value, r.stdout)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("positions", ["none", "shared", "per batch", "offset"])
@pytest.mark.parametrize("layout,shape,dtype", [
    ("bshd", (4, 300, 1, 128), torch.bfloat16),    # 300 KB: past the small-block limit's 256 KB
    ("bshd", (8, 300, 1, 128), torch.float32),
    ("bshd qk", (4, 300, 1, 128), torch.bfloat16),  # q and k one head each
    ("sbhd", (300, 4, 1, 128), torch.float16),
    ("bshd", (140, 1000, 1, 128), torch.bfloat16),  # 34 MB: past 32 MB
    ("bshd", (4, 4096, 1, 128), torch.bfloat16),    # 4 MB: rows a thread held to 64-thread blocks
])
def test_lean_one_head_fold(layout, shape, dtype, positions):
    """With set_lean_fold_one_head(True) (the default), a call whose tensors have one head each and whose
    positions the batch shares runs on lean as one token of B rows (the batch stride as
    the head stride; grid (row blocks, S, 1)); per-batch positions are not folded (a token
    of one head: a block then takes 64 threads' worth of consecutive tokens, grid (row
    blocks, S / tokens a block, B)). Each case: the kernel expected ran (last_lean_launch),
    out of place and in place bit-equal to the tiles, within the float64 truth's bounds;
    with the knob off unfolded (but sbhd, which the batch fold takes anyway)."""
    dev, C = "cuda", rope_ext._C
    qk = layout == "bshd qk"
    layout = "bshd" if qk else layout
    S, B = (shape[0], shape[1]) if layout == "sbhd" else (shape[1], shape[0])
    xs = [randn(shape, dtype, dev) for _ in range(2 if qk else 1)]
    pos = {"shared": torch.randint(0, 1 << 20, (S,), device=dev),
           "per batch": torch.randint(0, 1 << 20, (B, S), device=dev)}.get(positions)
    kw = dict(layout=layout, offsets=1000) if positions == "offset" else dict(layout=layout)
    call = rope_ext.apply_rope_qk if qk else (lambda *a, **k: (rope_ext.apply_rope(*a, **k),))
    tiles = [rope_ext.apply_rope(x, pos, impl="fp32x4_tile", **kw) for x in xs]
    fold = positions != "per batch"
    what = f"({layout}{' qk' if qk else ''} {list(shape)} {dtype}, positions {positions})"
    try:
        for on in (False, True):
            C.set_lean_fold_one_head(on)
            outs = call(*xs, pos, **kw)
            gx, gy, gz, U, width, tpb = C.last_lean_launch()
            # (sbhd with one head: the batch fold's own case, folded with the knob off too)
            folded = fold and (on or layout == "sbhd")
            # unfolded, a one-row 16-bit call past 32 MB whose batch shares its positions: the tiles
            big = sum(x.numel() for x in xs) * xs[0].element_size() > 32 << 20
            lean = folded or not (fold and big and xs[0].element_size() == 2 and len(xs) == 1)
            assert (gx > 0) == lean, f"fold {on}: lean {'not ' if lean else ''}launched {what}"
            row_threads = 64 // (width // xs[0].element_size()) if lean else 0
            if folded:
                assert (gy, gz, tpb) == (S, 1, 1), f"not folded {what}: grid {(gx, gy, gz)}, {tpb} tokens a block"
                rows = B * len(xs)
                # rows a thread stop where the block would fall under 64 threads (16-thread blocks lost)
                assert -(-rows // U) * row_threads >= min(64, rows * row_threads), f"{U} rows a thread {what}"
            elif lean:  # a thread takes the token's rows, a block 64 threads' tokens (every S here divides by 4)
                want = 64 // row_threads
                assert (gy * tpb, gz, tpb) == (S, B, want), f"fold {on} {what}: grid {(gx, gy, gz)}, {tpb} tokens"
            ins = [x.clone() for x in xs]
            (rope_ext.apply_rope_qk if qk else rope_ext.apply_rope)(*ins, pos, inplace=True, **kw)
            assert (C.last_lean_launch()[0] > 0) == lean, f"fold {on}, in place {what}"
            for x, out, inp, tile in zip(xs, outs, ins, tiles):
                assert torch.equal(out, tile), f"fold {on} vs tiles {what}"
                assert torch.equal(inp, tile), f"fold {on} in place vs tiles {what}"
                assert_close_f64(out, ref.rope_float64(x, pos, **kw), x.abs().max().item(), f"fold {on} {what}")
    finally:
        C.set_lean_fold_one_head(True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("S,folded", [(8192, True), (8200, False)])
def test_lean_one_head_fold_size_limit(S, folded):
    """The one-head fold stops at 128 MB of x (past it the fold ran within 1% of the tiles,
    over them in two runs of three): bshd bf16 [64, S, 1, 128] at exactly 128 MB runs
    folded on lean (grid z = 1, a token of 64 rows), a little past it the tiles run it (a
    16-bit call past 32 MB whose batch shares its positions takes no several tokens a
    block); either way bit-equal to the tiles, and rows checked against the float64 truth."""
    dev, C = "cuda", rope_ext._C
    x = randn((64, S, 1, 128), torch.bfloat16, dev)
    out = rope_ext.apply_rope(x)
    gx, gy, gz, _, _, tpb = C.last_lean_launch()
    assert (gx > 0) == folded and (not folded or (gy, gz, tpb) == (S, 1, 1)), f"S {S}: launch {(gx, gy, gz)}, {tpb}"
    assert torch.equal(out, rope_ext.apply_rope(x, impl="fp32x4_tile")), f"S {S}: vs the tiles"
    part = x[:2, -300:]  # a corner, against the float64 truth (positions S - 300 ...)
    pos = torch.arange(S - 300, S, device=dev)
    assert_close_f64(out[:2, -300:], ref.rope_float64(part, pos), part.abs().max().item(), f"S {S}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_lean_few_rows_past_32mb():
    """Few rows a token (under 64 threads at one row a thread) in blocks of several tokens,
    a thread on all the token's rows, past 32 MB too: three bf16 heads (U = 4, 4 tokens a
    block) at 3 and 48 MB. Where U cannot cover the rows (12 heads of rotary dim 32: 4
    threads a row at 8-byte chunks, more than 8 rows) the block keeps one token, under 64 threads, so past
    256 KB the tiles run it. Bit-equal to the tiles, a corner against the float64 truth."""
    dev, C = "cuda", rope_ext._C
    for shape, lean in (((1, 4096, 3, 128), True), ((16, 4096, 3, 128), True), ((1, 4096, 12, 32), False)):
        x = randn(shape, torch.bfloat16, dev)
        out = rope_ext.apply_rope(x)
        gx, gy, gz, U, _, tpb = C.last_lean_launch()
        assert (gx > 0) == lean, f"{shape}: launch {(gx, gy, gz)}, U {U}, {tpb} tokens a block"
        if lean:
            assert (U, tpb, gy, gz) == (4, 4, 1024, shape[0]), f"{shape}: U {U}, {tpb} tokens a block, grid {(gx, gy, gz)}"
        assert torch.equal(out, rope_ext.apply_rope(x, impl="fp32x4_tile")), f"{shape}: vs the tiles"
        part = x[-1:, -64:]
        pos = torch.arange(4096 - 64, 4096, device=dev)
        assert_close_f64(out[-1:, -64:], ref.rope_float64(part, pos), part.abs().max().item(), f"{shape}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lean_cos_sin_cache_out_of_range(dtype):
    """Lean reads a cos_sin_cache as the tiles do: a position outside the table gives NaN
    in that token's rotated features (no read out of bounds), the rows in range match the
    float64 truth and the tiles bit for bit."""
    dev, D, rows = "cuda", 128, 1000
    table = ref.cos_sin_table(D, 10000.0, rows, dev)
    pos = torch.randint(0, rows, (64,), device=dev)
    pos[::7] = rows + 5
    pos[3] = -1
    x = randn((64, 32, D), dtype, dev)
    out = rope_ext.apply_rope(x, pos, layout="thd", cos_sin_cache=table)
    tile = rope_ext.apply_rope(x, pos, layout="thd", cos_sin_cache=table, impl="fp32x4_tile")
    bad = (pos < 0) | (pos >= rows)
    assert torch.isnan(out[bad]).all(), "out-of-range positions: NaN"
    assert torch.equal(out[~bad], tile[~bad]) and torch.isnan(tile[bad]).all(), "lean vs tiles"
    truth = ref.rope_float64(x[~bad], pos[~bad], layout="thd", cos_sin_cache=table)
    assert_close_f64(out[~bad], truth, x.abs().max().item(), "lean cache vs float64")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("offset", [-3, 0, 5, 40])
def test_lean_plain_cache_rows_past_the_table(offset):
    """A plain call (no position tensors) with a cos_sin_cache reads rows s + offset. On CUDA
    the host does not check them (value checks are opt-in), so where some row lies outside
    the table launch_lean keeps rope_lean_kernel's cache instance, whose out-of-range rows
    come out NaN (rope_lean_plain1_kernel, which does not check, takes only calls inside it:
    offset 0 here, 16 tokens, 16 rows). Rows in range are bit-equal to the tiles and within
    the float64 truth."""
    dev, S, rows = "cuda", 16, 16
    table = ref.cos_sin_table(128, 10000.0, rows, dev).bfloat16()
    x = randn((1, S, 32, 128), torch.bfloat16, dev)
    names = cuda_kernels_of(lambda: rope_ext.apply_rope(x, cos_sin_cache=table, offsets=offset))
    if names is not None:
        lean = lean_instances(names)
        assert len(lean) == 1, f"one lean launch expected: {names}"
        want = ["plain1"] if offset == 0 else []
        assert lean[0][7:] == want and lean[0][4] == "2", f"offset {offset}: {names}"
    out = rope_ext.apply_rope(x, cos_sin_cache=table, offsets=offset)
    tile = rope_ext.apply_rope(x, cos_sin_cache=table, offsets=offset, impl="fp32x4_tile")
    pos = torch.arange(S, device=dev) + offset
    bad = (pos < 0) | (pos >= rows)
    assert bool(bad.any()) == (offset != 0)
    assert torch.isnan(out[0, bad]).all() and torch.isnan(tile[0, bad]).all(), "rows past the table: NaN"
    assert torch.equal(out[0, ~bad], tile[0, ~bad]), "vs the tiles"
    if (~bad).any():
        part = x[:, ~bad]
        truth = ref.rope_float64(part, pos[~bad], cos_sin_cache=table)
        assert_close_f64(out[:, ~bad], truth, part.abs().max().item(), "vs float64")
