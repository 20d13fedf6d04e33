"""Issue 19: does any way of streaming W4's bytes move DRAM faster than rope_ext's lean
kernel and a copy kernel do (both 84-85% of peak under ncu, run 4 of the thirty-second
session)? bench/stream_study.cu's variants (its header says what each asks) over the same
bytes, out of place and in place, timed as the latency suite times (one call in a CUDA
graph, the L2 flushed before each replay, the columns in turns, median), beside torch's
copy_ (the suite's same-size copy, a cudaMemcpyAsync) and, at W4's size, rope_ext's W4
in place and out of place.

    python bench/stream_study.py [--reps 200] [--mib 80,128] [--passes 2]

Each variant's output is checked before it is timed (dst equal to src; in place, the
LD/ST variants with a key XORed into the first 4 bytes of each 16, so a pass that moved
nothing fails; the bulk engine's one code path is checked out of place) and again after
the passes: a variant that fails the first check is reported and not timed, the second
ends the run with an error. A crash or hang names the variant being checked (a bulk
barrier that never completes hangs: run it under `timeout`)."""
import argparse
import os
import sys

import torch
from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import rope_ext  # noqa: E402
from timing import graph_us_interleaved, same_size_copy  # noqa: E402

# (name, kind, args): ldst u; bulk chunk bytes, stages, blocks a SM
VARIANTS = [("ldst1", "ldst", (1,)), ("ldst2", "ldst", (2,)), ("ldst4", "ldst", (4,)),
            ("bulk16k x4", "bulk", (16384, 4, 3)), ("bulk32k x3", "bulk", (32768, 3, 2)),
            ("bulk8k x8", "bulk", (8192, 8, 3))]


def build():
    return load("stream_study", [os.path.join(HERE, "stream_study.cu")],
                extra_include_paths=[os.path.join(HERE, "..", "csrc")], extra_cuda_cflags=["-O3"], verbose=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--mib", default="80,128", help="comma-separated sizes in MiB (80: W4's q + k)")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    mod = build()
    print(f"device: {torch.cuda.get_device_name()}; us, median of {args.reps} replays in turns, GB/s = 2 x bytes / "
          "time", flush=True)
    for mib in (int(m) for m in args.mib.split(",")):
        n = mib << 20
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        buf = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
        fns, bad = {}, []
        keep = buf.clone()

        def check(name, kind, a):
            print(f"    (checking {name})", flush=True)
            run = getattr(mod, kind)
            dst.fill_(0)
            run(src, dst, *a)
            ok = torch.equal(dst, src)
            if kind == "ldst":  # in place with the key: each 16 bytes' first 4 flipped, once
                run(buf, buf, *a, 0xFFFFFFFF)
                want = keep.view(-1, 16).clone()
                want[:, :4] ^= 255
                ok = ok and torch.equal(buf.view(-1, 16), want)
                buf.copy_(keep)
            torch.cuda.synchronize()
            return ok

        for name, kind, a in VARIANTS:
            run = getattr(mod, kind)
            if not check(name, kind, a):
                bad.append(name)
                continue
            fns[f"{name} copy"] = lambda run=run, a=a: run(src, dst, *a)
            fns[f"{name} in place"] = lambda run=run, a=a: run(buf, buf, *a)
        fns["torch copy_ (the suite's)"] = same_size_copy(n // 2, torch.bfloat16)
        if mib == 80:  # W4: q [8192, 32, 128] + k [8192, 8, 128] bf16 thd, random positions
            q = torch.randn(8192, 32, 128, device="cuda").bfloat16()
            k = torch.randn(8192, 8, 128, device="cuda").bfloat16()
            pos = torch.randint(0, 131072, (8192,), device="cuda")
            fns["rope_ext W4 in place"] = lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd", inplace=True)
            fns["rope_ext W4"] = lambda: rope_ext.apply_rope_qk(q, k, pos, layout="thd")
        for i in range(args.passes):
            t, err = graph_us_interleaved(fns, reps=args.reps)
            print(f"--- {mib} MiB, pass {i + 1}" + (f" (failed their check, not timed: {bad})" if bad else ""))
            for name in fns:
                if name in t:
                    print(f"    {name:<28}{t[name]:9.2f} us {2 * n / t[name] / 1e3:8.0f} GB/s", flush=True)
            for name, e in err.items():
                print(f"    {name}: n/a: {e}")
        # After the timed replays: the in-place buffer unchanged (key 0), each variant right.
        assert torch.equal(buf, keep), f"{mib} MiB: an in-place variant changed the buffer"
        for name, kind, a in VARIANTS:
            if name not in bad:
                assert check(name, kind, a), f"{mib} MiB: {name} wrong after the timed replays"


if __name__ == "__main__":
    main()
