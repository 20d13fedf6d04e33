"""A few rows of the latency suite, built by run.py's own workload builders and timed the
same way (timing.graph_us_interleaved: one call in a CUDA graph, L2 flushed before each
replay, the columns in turns, median): for a run with little device time left, where the
whole suite (`run.py --suite latency --quick`) does not fit.

    python bench/latency_rows.py [--rows W4,W2a,128] [--reps 100] [--hint] [--widths 16] [--knobs lane,mb64]
                                 [--passes 1] [--pin] [--rope-only] [--captures 8]

Rows: W4 (q [8192, 32, 128] + k [8192, 8, 128] thd), W5 (the same at 16 tokens), W2a / W2b
(sbhd bf16), N (MB of bshd bf16 [1, S, 32, 128], 0.125 and 0.5 too), fN (the same in fp32),
pN (N's with an int64 positions tensor 0..S-1 given to rope_ext), tN (thd bf16 [S, 32, 128],
cu_seqlens [0, S]: the latency suite's thd rows). --hint: each
rope_ext auto column again without the lean kernel's L2 hint (set_lean_l2_hint(False),
"-hint"; its output checked bit-equal to the column's). --pin: after the rows, whether a
call leaves the kernels after it a smaller L2 (a 30 / 40 MB read after the call on 128 MB,
each flush reset first: its second read's time; bench/load_hints.py's probe), the hinted
call beside the plain one. --captures N: each column in N graphs, each
capture's median and its output's address modulo 2 MiB beside the column's (each capture
has its own memory pool: an output allocated inside it starts a fresh segment, so the
captures differ in the address, not in the placement modulo 2 MiB)."""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rope_ext  # noqa: E402
import run  # noqa: E402
import timing  # noqa: E402


def builder(name, peers):
    if name in ("W4", "W5"):
        return lambda: run.latency_qk_workload(8192 if name == "W4" else 16, peers)
    if name in ("W2a", "W2b"):
        shape = (4096, 1, 128, 128) if name == "W2a" else (512, 32, 24, 128)
        return lambda: run.latency_sbhd_workload(name, shape, peers)
    kind = name[0] if name[0] in "fpt" else ""  # (one prefix at most: "ft0.5" is refused by float())
    dtype = torch.float32 if kind == "f" else torch.bfloat16
    S = int(float(name[len(kind):]) * 2**20) // (32 * 128 * dtype.itemsize)  # (0.125: S = 16 in bf16)
    layout = "thd" if kind == "t" else "bshd"
    return lambda: run.latency_x_workload(layout, dtype, S, peers, positions=kind == "p")


def _same(a, b):
    """Two calls' outputs (a tensor, or q and k) bit for bit."""
    return all(torch.equal(x, y) for x, y in zip(a, b)) if isinstance(a, (tuple, list)) else torch.equal(a, b)


def without_hint(fns):
    """fns plus each rope_ext auto column with the L2 hint off (checked bit-equal first)."""
    C = rope_ext._C
    out = dict(fns)
    for k, f in fns.items():
        if not k.startswith("rope_ext auto") or "cos_sin_cache" in k:  # (no hint where the table is read)
            continue
        plain = timing.switched(C.set_lean_l2_hint, False, True, f)
        if "in place" not in k:
            a = f()
            torch.cuda.synchronize()
            got = C.last_lean_hint()
            b = plain()
            assert _same(a, b), f"{k}: the hinted output differs from plain loads'"
            print(f"    ({k}: the hint ran: {got}; bit-equal to plain loads)")
        out[k + " -hint"] = plain
    return out


KNOBS = {"lane": ("set_lean_share", False, True),  # (mbN and WN: knob() below)
         "general": ("set_lean_plain", False, True),
         "noplain1": ("set_lean_plain1", False, True)}
CACHE_KNOBS = ("noplain1",)  # the knobs that apply to a cos_sin_cache call too


def knob(name):
    """A lean knob's (rope_ext._C setter, value, default) by name: KNOBS, "mbN", "WN", "uN"
    (rows a thread), "tpbN" (tokens a block), "rbN" (row slots a block)."""
    if name.startswith("rb"):
        return "set_lean_rows_per_block", int(name[2:]), 0
    if name.startswith("mb"):
        return "set_lean_min_block", int(name[2:]), 0
    if name.startswith("tpb"):
        return "set_lean_tokens_per_block", int(name[3:]), 0
    if name.startswith("u"):
        return "set_lean_rows_per_thread", int(name[1:]), 0
    if name.startswith("W"):
        return "set_lean_bytes", int(name[1:]), -1
    return KNOBS[name]


def with_knobs(fns, names):
    """fns plus each rope_ext auto column under each of the lean knobs `names` ("lane": each
    lane its own sin/cos, no block table; "general": the instance with the position code
    where kPlain would run; "noplain1": rope_lean_kernel's kPlain instances where
    rope_lean_plain1_kernel would run, the cos_sin_cache column's too; "uN": N rows a thread;
    "tpbN": N tokens a block (the row slots make room); "rbN": N row slots a block; "mbN":
    blocks halved down to N threads to cover the SMs; "WN": the access width forced to N
    bytes; "a+b": a and b together), each checked bit-equal to the column first."""
    C = rope_ext._C
    out = dict(fns)
    for k, f in fns.items():
        if not k.startswith("rope_ext auto"):
            continue
        for n in names:
            if "cos_sin_cache" in k and n not in CACHE_KNOBS:
                continue
            parts = [knob(part) for part in n.split("+")]  # (several at once: "u4+rb5")
            g = timing.switched_many([(getattr(C, st), on, off) for st, on, off in parts], f)
            if "in place" not in k:
                assert _same(f(), g()), f"{k} under {n}: the output differs"
            out[f"{k} {n}"] = g
    return out


def pin_probe(reps):
    x = torch.randn(1, 16384, 32, 128, device="cuda").bfloat16()
    C = rope_ext._C
    preps = {"nothing": lambda: None,
             "rope_ext -hint": timing.switched(C.set_lean_l2_hint, False, True, lambda: rope_ext.apply_rope(x)),
             "rope_ext (hint)": lambda: rope_ext.apply_rope(x)}
    flush = timing._flush_buffer()
    out = torch.empty((), device="cuda")
    sizes = (30, 40)
    zs = {mb: torch.randn(mb * 2**20 // 4, device="cuda") for mb in sizes}
    print(f"pin probe: us of the second read of z (fp32 sum) after the call on 128 MB, median of {reps}")
    for name, prep in preps.items():
        row = []
        for mb in sizes:
            ts = []
            for _ in range(reps):
                timing.flush_l2(flush, mode="reset")
                prep()
                torch.sum(zs[mb], dim=0, out=out)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                torch.sum(zs[mb], dim=0, out=out)
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1e3)
            row.append(statistics.median(ts))
        print(f"  {name:<20}" + "".join(f"  z {mb} MB {t:8.2f}" for mb, t in zip(sizes, row)), flush=True)


def per_capture(fns, reps, captures):
    """Each column in `captures` CUDA graphs, timed in turns: its median over all replays,
    then each capture's median with its output's address modulo 2 MiB (does the time follow
    where the graph's pool put the output? the thirty-second session's run 2 saw the op's
    launch 0.13 us over the study's in one capture of six under ncu, 0.64 in the others)."""
    samples, errs, ptrs = timing.graph_samples_interleaved(fns, reps, captures=captures)
    for k, per in samples.items():
        med = statistics.median(x for p in per for x in p)
        caps = "  ".join(f"{statistics.median(p):.2f}@" + ("n/a" if a is None else f"{a % 2**21:06x}")
                         for p, a in zip(per, ptrs[k]))
        print(f"    {k:<34}{med:>9.2f}   per capture (us@out mod 2 MiB): {caps}", flush=True)
    for k, e in errs.items():
        print("   ", k, "failed:", str(e)[:80])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="W4,W2a,128")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--hint", action="store_true", help="each rope_ext auto column also without the L2 hint")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--widths", default="", help="each rope_ext auto column also at these lean access widths (bytes)")
    ap.add_argument("--pin", action="store_true", help="the pin probe after the rows")
    ap.add_argument("--rope-only", action="store_true", help="rope_ext's columns and the copy only (no torch.compile, "
                    "no peers: nothing to compile, for a run with little device time)")
    ap.add_argument("--captures", type=int, default=0, help="N > 0: each column captured in N CUDA graphs "
                    "(each its own memory pool; the default timing uses 2) and each capture's median printed, with "
                    "its output's address modulo 2 MiB")
    ap.add_argument("--knobs", default="", help="each rope_ext auto column also under these lean knobs: lane, "
                    "general, noplain1, mbN, WN, uN, tpbN, rbN; a+b both")
    args = ap.parse_args()
    if args.captures > args.reps:
        ap.error("--captures must not exceed --reps (each capture needs replays of its own)")
    run.ROPE_ONLY = args.rope_only
    peers = run.Peers(load=not args.rope_only)
    print(f"device: {torch.cuda.get_device_name()}; flush {timing.FLUSH}; us, median of {args.reps} replays, in turns")
    for ps in range(args.passes):
        if args.passes > 1:
            print(f"--- pass {ps + 1}")
        for name in args.rows.split(","):
            title, _, fns = builder(name, peers)()
            print(title, flush=True)
            if args.hint:
                fns = without_hint(fns)
            if args.widths:
                fns = with_knobs(fns, [f"W{w}" for w in args.widths.split(",")])
            if args.knobs:
                fns = with_knobs(fns, args.knobs.split(","))
            if args.captures:
                per_capture(fns, args.reps, args.captures)
                continue
            got, errs = timing.graph_us_interleaved(fns, args.reps)
            for k, v in got.items():
                print(f"    {k:<34}{v:>9.2f}", flush=True)
            for k, e in errs.items():
                print("   ", k, "failed:", str(e)[:80])
    if args.pin:
        pin_probe(args.reps)
    peers.report()


if __name__ == "__main__":
    main()
