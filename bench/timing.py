"""Timing and table helpers shared by the bench suites (run.py and the suites it calls:
attn.py, variants.py; fp8_splits.py, tune_*.py): the timers, the copy reference and the
row table. No suite imports another; all import this.

Timer: CUDA events around each call, after warm-up, the L2 flushed (flush_l2: the
persisting lines reset, then a 256 MB write) before every timed call and the GPU held busy
while the host enqueues it; the median.
graph_us: ONE call captured in a CUDA graph, replayed after an L2 flush each time; the
median. graph_us_interleaved: the same for several calls at once, their replays taking
turns in a new random order each round (the latency and attn suites' timer since the
second session of 2026-11-26). eager_us: back-to-back eager calls, host included.
Without a GPU, wall clock.

The flush is a write, as triton's do_bench's (zero_), after a reset of L2's persisting lines
(FLUSH below). L2 is write-back, so the timed call
starts with ~50 MB of the flush's dirty lines in L2, and its own reads and writes evict
them: their write-back shares DRAM with the call (bench/flush_study.py measures what that
costs). CLEAN_L2 (`run.py --clean-l2`, or ROPE_EXT_BENCH_CLEAN_L2=1) adds a 256 MB read of
another buffer after the write: the dirty lines go back before the timed call, and L2
holds clean lines the call never touches (still a cold L2 for the call's data).
The reset: lines a kernel loaded with the evict_last hint (torch.compile's) otherwise
outlive the write, and a call that reads the same tensor finds them in L2.
"""
import os
import random
import statistics
import time
import traceback

import torch

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
CLEAN_L2 = os.environ.get("ROPE_EXT_BENCH_CLEAN_L2") == "1"
_CLEAN = []
# What the flush does before its write (ROPE_EXT_BENCH_FLUSH; bench/evict_last.py compares
# them): "reset" (the default) cudaCtxResetPersistingL2Cache() first; "write" nothing, the
# suites' flush until the twentieth session; "last" a read of another 256 MB with the
# evict_last hint first; "discard" that read, then every line of it discarded from L2.
# Why: lines loaded with evict_last (Inductor's loads of x's partner halves and of cos/sin)
# go to L2's persisting set-aside (9.4 MB on the H100 here) and outlive any amount of normal
# writes: under "write", every call that read x after torch.compile's column found up to
# ~9 MB of it in L2 (H100, 8 MB: a plain read of x 8.0 us against the copy's 10.6; 32 MB
# 24.7 against 27.6). "reset" and "discard" put it level (10.0 / 10.2, 27.2 / 27.4) without
# moving the copy; "last" leaves its own lines there and slowed the columns 0.1-0.7 us at
# 8 MB. bench/NOTES.md, twentieth session, runs 1-2.
FLUSH = os.environ.get("ROPE_EXT_BENCH_FLUSH", "reset")
FLUSH_MODES = ("reset", "write", "last", "discard")
_RT, _SWEEP = [], []


def _cudart():
    """The CUDA runtime torch loaded (ctypes), for the calls torch does not expose."""
    if not _RT:
        import ctypes
        paths = []
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcudart" in line and "/" in line:
                    paths.append(line[line.index("/"):].strip().removesuffix(" (deleted)"))
        for name in paths + ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]:
            try:
                _RT.append(ctypes.CDLL(name))
                break
            except OSError:
                continue
        else:
            raise RuntimeError("timing: the CUDA runtime library was not found, so the flush cannot reset L2's "
                               "persisting lines; ROPE_EXT_BENCH_FLUSH=write times without the reset")
    return _RT[0]


def _sweep_state():
    """The evict_last read's buffer and its Triton kernels, made once."""
    if not _SWEEP:
        import triton
        import triton.language as tl

        @triton.jit
        def read_last(src, out, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            x = tl.load(src + pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK), eviction_policy="evict_last")
            tl.store(out + pid, tl.sum(x, axis=0))

        @triton.jit
        def discard(src, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            lines = src + pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK // 32) * 32  # one int32 per 128 B line
            tl.inline_asm_elementwise("discard.global.L2 [$1], 128;\n\tmov.u32 $0, 0;", "=r,l", [lines],
                                      dtype=tl.int32, is_pure=False, pack=1)

        block = 4096
        src = torch.ones(64 * 2**20, dtype=torch.int32, device=DEV)
        out = torch.empty(src.numel() // block, dtype=torch.int32, device=DEV)
        _SWEEP.append((read_last, discard, src, out, block))
    return _SWEEP[0]


def flush_l2(buf, clean=None, mode=None):
    """Evicts the timed call's data from L2: a write of `buf` (256 MB), then, with
    clean (default CLEAN_L2), a read of another 256 MB so that no dirty line is left.
    mode (default FLUSH): what comes before the write (FLUSH's note)."""
    mode = FLUSH if mode is None else mode
    if mode == "reset":
        torch.cuda.synchronize()
        err = _cudart().cudaCtxResetPersistingL2Cache()
        if err:
            raise RuntimeError(f"timing: cudaCtxResetPersistingL2Cache returned error {err} (a GPU without L2 "
                               "persistence?); ROPE_EXT_BENCH_FLUSH=write times without the reset")
    elif mode in ("last", "discard"):
        read_last, discard, src, out, block = _sweep_state()
        read_last[(out.numel(),)](src, out, BLOCK=block)
        if mode == "discard":
            discard[(out.numel(),)](src, BLOCK=block)
    elif mode != "write":
        raise ValueError(f"flush mode {mode!r} (timing.FLUSH, ROPE_EXT_BENCH_FLUSH): one of {FLUSH_MODES}")
    buf.fill_(1)
    if CLEAN_L2 if clean is None else clean:
        if not _CLEAN:
            _CLEAN.append((torch.zeros(64 * 2**20, device=buf.device), torch.empty((), device=buf.device)))
        x, out = _CLEAN[0]
        torch.sum(x, dim=0, out=out)


class Timer:
    def __init__(self, reps, warmup=3):
        self.reps, self.warmup = reps, warmup
        self.flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=DEV) if CUDA else None

    def __call__(self, fn):
        for _ in range(self.warmup):
            fn()
        if not CUDA:
            ts = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1e6
        ts = []
        for _ in range(self.reps):
            flush_l2(self.flush)  # evict x from L2: time the DRAM traffic, not the cache
            # Keep the GPU busy while the host enqueues the call: the events then time
            # the kernel(s), not the Python/dispatcher overhead before the launch.
            torch.cuda._sleep(1_000_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        return statistics.median(ts)


def copy_bandwidth(timer, nbytes=2**30):
    x = torch.randn(nbytes // 4, device=DEV)
    y = torch.empty_like(x)
    us = timer(lambda: y.copy_(x))
    return 2 * nbytes / us / 1e3  # GB/s, read + write


def same_size_copy(numel, dtype):
    """y.copy_(x) of `numel` elements of `dtype`: the copy of a workload's own bytes."""
    x = torch.randn(numel, device=DEV).to(dtype)
    y = torch.empty_like(x)
    return lambda: y.copy_(x)


def time_rows(fns, nbytes, timer, bw, base, outs=None, want=None, ss_us=None, eager=False):
    """Times each (name, fn): µs, GB/s, % of copy, speedup over the row named `base`
    (and max |out - want| where `outs` gives the output; % of the same-size copy where
    its time ss_us is given; with eager, the µs of back-to-back eager calls, host
    included, as `eager_us`). A timer with `many` ({name: fn} -> ({name: µs}, {name:
    error}), e.g. graph_us_interleaved) times the rows together, in turns. A variant that
    refuses the input gets a row saying why; the sweep goes on."""
    rows = []
    many = getattr(timer, "many", None)
    try:
        got, errs = many(dict(fns)) if many else ({}, {})
    except Exception as e:  # the whole table failed: a row each saying why
        got, errs = {}, {name: e for name, _ in fns}
    for name, fn in fns:
        try:
            if name in errs:
                raise errs[name]
            us = got[name] if many else timer(fn)
        except Exception as e:
            rows.append(dict(impl=name, error=(str(e).splitlines() or [type(e).__name__])[0][:80]))
            continue
        gbs = nbytes / us / 1e3
        row = dict(impl=name, us=us, gbs=gbs, pct_copy=100 * gbs / bw)
        if eager:
            try:
                row["eager_us"] = eager_us(fn, n=200)
            except Exception:  # noqa: BLE001 (the graph time stands; the eager cell stays empty)
                pass
        if ss_us:
            row["pct_ss"] = 100 * ss_us / us
        if outs is not None and name in outs:
            row["err"] = max_err(outs[name](), want)
        rows.append(row)
    base_us = next((r["us"] for r in rows if "us" in r and r["impl"].startswith(base)), None)
    for r in rows:
        if "us" in r:
            r["speedup"] = base_us / r["us"] if base_us else float("nan")
    return rows


def max_err(out, want):
    return (out.double() - want).abs().max().item()


def print_table(title, rows, ratio="x naive", err=False, ss_us=None):
    """ss_us: the same-size copy's time, printed first and as each row's "% ss copy"."""
    print(f"\n{title}")
    ss = ss_us is not None
    eg = any("eager_us" in r for r in rows)
    print(f"  {'impl':<36}{'time us':>10}{'GB/s':>8}{'% copy':>8}" + (f"{'% ss copy':>10}" if ss else "") +
          f"{ratio:>10}" + (f"{'eager us':>10}" if eg else "") + ("  max err vs f64" if err else ""))
    if ss:
        print(f"  {'same-size copy (y.copy_(x))':<36}{ss_us:>10.1f}")
    for r in rows:
        if "error" in r:
            print(f"  {r['impl']:<36}  n/a: {r['error']}")
        else:
            e = f"  {r['err']:.3g}" if "err" in r else ""
            pss = f"{r['pct_ss']:>9.1f}%" if ss and "pct_ss" in r else (" " * 10 if ss else "")
            eu = (f"{r['eager_us']:>10.1f}" if "eager_us" in r else " " * 10) if eg else ""
            print(f"  {r['impl']:<36}{r['us']:>10.1f}{r['gbs']:>8.0f}{r['pct_copy']:>7.1f}%{pss}{r['speedup']:>9.2f}x{eu}{e}")


def graph_us(fn, reps=200, flush=None, clean=None):
    """µs of ONE call of fn captured in a CUDA graph, replayed `reps` times, each replay
    after an L2 flush (flush_l2: the persisting lines reset, a 256 MB write; clean: then a
    256 MB read) with the GPU held busy while the host enqueues it; the median. Device time of one call, launch
    included, host overhead excluded."""
    return statistics.median(graph_samples(fn, reps, flush, clean))


def _first_ptr(out):
    """The data pointer of a call's output (its first tensor), or None."""
    while isinstance(out, (tuple, list)) and out:
        out = out[0]
    return out.data_ptr() if isinstance(out, torch.Tensor) else None


def _captured(fn, captures=1, ptrs=None):
    """fn warmed (3 calls, then one on a side stream, as capture needs; a torch.compile'd
    one compiled), then captured in `captures` CUDA graphs (ptrs, if a list: each capture's
    output address appended, _first_ptr)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    gs = []
    for _ in range(captures):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
            ptr = _first_ptr(out)
            del out  # (freed inside the capture, as before the addresses were kept)
        if ptrs is not None:
            ptrs.append(ptr)
        gs.append(g)
    return gs


def _replay_us(g, flush, clean):
    """µs of one replay of graph g after an L2 flush, the GPU held busy while the host
    enqueues it."""
    flush_l2(flush, clean)
    torch.cuda._sleep(500_000)  # ~250 us: longer than the host takes to enqueue the replay
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); g.replay(); b.record(); b.synchronize()  # noqa: E702
    return a.elapsed_time(b) * 1e3


def graph_samples(fn, reps=200, flush=None, clean=None):
    """graph_us's samples (µs), one per replay, in order."""
    flush = flush if flush is not None else _flush_buffer()
    g, = _captured(fn)
    ts = [_replay_us(g, flush, clean) for _ in range(reps)]
    del g
    return ts


def graph_us_interleaved(fns, reps=200, flush=None, clean=None, captures=2):
    """graph_us of several calls at once, {name: fn} -> ({name: µs}, {name: error}): every
    fn is warmed (a torch.compile'd one compiled) and captured first, `captures` CUDA
    graphs each (each with its own memory pool, whose first segment its output starts), then the replays take turns
    in a new random order each round (seeded), each after its own L2 flush, and each
    column's time is the median of its `reps` replays. So every column is timed over the
    same stretch of time, after every other column as often: timed one column after
    another (graph_us), a column right after a torch.compile'd call's compile and timing
    ran up to ~2 us faster at 2-32 MB, and a kernel replayed back to back keeps its code
    in the SM's instruction caches past the L2 flush (decode B = 1 ctx 512: 9.6 us back to
    back, 14.9 after other kernels; bench/NOTES.md, evening of 2026-11-25 run 5 and
    2026-11-26 (second) runs 3 and 9); in a fixed cyclic order each column would always
    follow the same one. A fn that fails to run or to be captured is reported in the
    errors and left out."""
    samples, errors, _ = graph_samples_interleaved(fns, reps, flush, clean, captures)
    return {n: statistics.median(x for per in v for x in per) for n, v in samples.items()}, errors


def graph_samples_interleaved(fns, reps=200, flush=None, clean=None, captures=2):
    """graph_us_interleaved's samples: ({name: one list of µs per capture}, {name: error},
    {name: each capture's output address (_first_ptr)}). Capture i % captures is replayed
    in round i, so each capture gets reps / captures of the samples."""
    flush = flush if flush is not None else _flush_buffer()
    graphs, errors, ptrs = {}, {}, {}
    for name, fn in fns.items():
        try:
            ptrs[name] = []
            graphs[name] = _captured(fn, captures, ptrs[name])
        except Exception as e:  # noqa: BLE001 (an optional peer that cannot run here)
            torch.cuda.synchronize()
            # Kept without its traceback: its frames (and the failing fn's tensors, a KV
            # cache in the attn suite) would stay alive in a reference cycle until the
            # garbage collector ran.
            traceback.clear_frames(e.__traceback__)
            errors[name] = e.with_traceback(None)
            ptrs.pop(name, None)
    names = list(graphs)
    ts = {n: [[] for _ in range(captures)] for n in names}
    rng = random.Random(0)
    for i in range(reps):
        order = names[:]
        rng.shuffle(order)  # a new order each round: no column always follows the same one
        for n in order:
            ts[n][i % captures].append(_replay_us(graphs[n][i % captures], flush, clean))
    del graphs
    return ts, errors, ptrs


def graph_us_under(fns, reps, flush_label):
    """graph_us_interleaved under one flush, named "MODE" or "MODE+clean" (MODE one of
    FLUSH_MODES; +clean: CLEAN_L2's read after the write), FLUSH restored after."""
    global FLUSH
    mode, clean = flush_label.split("+")[0], flush_label.endswith("+clean")
    before, FLUSH = FLUSH, mode
    try:
        return graph_us_interleaved(fns, reps, clean=clean)
    finally:
        FLUSH = before


def switched_many(knobs, fn):
    """fn with several rope_ext._C switches set, ((setter, value, default), ...), each back
    to its default after (switched's note)."""
    if not CUDA:
        return fn

    def run():
        for setter, value, _ in knobs:
            setter(value)
        try:
            return fn()
        finally:
            for setter, _, default in knobs:
                setter(default)
    return run


def switched(set_switch, value, default, fn):
    """fn with a rope_ext._C test switch at `value`, back to `default` after (the switch is
    read when a call launches, so a CUDA graph captures the switched road). Without a GPU
    (the switches are CUDA-only) fn as it is."""
    return switched_many(((set_switch, value, default),), fn)


def profile_once(fns):
    """{name: fn}: each fn once to warm it, then once more each inside the profiler range
    (for `ncu --profile-from-start off`), under an NVTX range named after it."""
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, f in fns.items():
        torch.cuda.nvtx.range_push(name)
        f()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


_FLUSH = []


def _flush_buffer():
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 * 2**20, dtype=torch.uint8, device=DEV))
    return _FLUSH[0]


def eager_us(fn, n=2000, runs=5):
    """µs per call of back-to-back eager calls (host + launch + device, whichever is
    longest), the median of `runs` runs of n calls."""
    for _ in range(200):
        fn()
    out = []
    for _ in range(runs):
        if CUDA:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if CUDA:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)
