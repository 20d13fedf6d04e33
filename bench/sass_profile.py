"""Where a kernel's instructions and stalls go, from ncu's SASS source page.

    python bench/sass_profile.py ncu_sass_1.csv [--warps N] [--chunk 40] [--top 15]

Reads the CSV that `scripts/gpu_check.sh --ncu-src` writes (ncu --page source --csv
--print-source sass of one kernel launch) and prints: the instructions executed per
warp in total, then per region between barriers / pipeline waits (BAR.SYNC, the
cluster barrier, DEPBAR, EXIT) and per chunk of static instructions: executed per warp,
warp stall samples, and the memory / barrier / special opcodes in the chunk. It is how
the night of 2026-11-24 found the decode kernel's costs (bench/NOTES.md).
"""
import argparse
import csv

MARKS = ("BAR.SYNC", "UCGABAR_WAIT", "DEPBAR", "EXIT")
NOTE = ("LDG", "LDS", "STS", "STG", "MUFU", "BAR", "CALL", "SHFL", "LDGSTS", "LD.", "ST.", "LDC", "S2R", "DEPBAR",
        "MEMBAR", "UCGA", "I2F", "F2I", "HMMA", "LDSM", "ATOM", "RED")


def opcode(src):
    f = src.split()
    return (f[1] if f and f[0].startswith("@") and len(f) > 1 else (f[0] if f else "")).rstrip(";")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--warps", type=int, help="warps launched (default: the first instruction's execution count)")
    ap.add_argument("--chunk", type=int, default=40)
    ap.add_argument("--top", type=int, default=0, help="also the N instructions with the most stall samples")
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    print(rows[start - 1][1] if start else "")
    hdr = rows[start]
    i_src, i_ex = hdr.index("Source"), hdr.index("Instructions Executed")
    i_st = hdr.index("Warp Stall Sampling (All Samples)")
    ops = []
    for r in rows[start + 1:]:
        if len(r) <= max(i_src, i_ex, i_st):
            continue
        num = lambda s: int(s.replace(",", "") or 0)  # noqa: E731
        ops.append((r[i_src].strip(), num(r[i_ex]), num(r[i_st])))
    warps = args.warps or max(1, ops[0][1])
    total, samples = sum(o[1] for o in ops), sum(o[2] for o in ops)
    print(f"{total} warp instructions, {total / warps:.0f} per warp ({warps} warps), {samples} stall samples")
    print("\nregions (ending at a barrier / wait):")
    acc, first = [0, 0], 0
    for k, (src, ex, st) in enumerate(ops):
        acc[0] += ex
        acc[1] += st
        op = opcode(src)
        if any(op.startswith(m) for m in MARKS) or k == len(ops) - 1:
            if acc[0] or acc[1]:
                print(f"  {first:5d}-{k:5d} {op:<22} per warp {acc[0] / warps:7.1f}  samples {acc[1]:5d}")
            acc, first = [0, 0], k + 1
    print(f"\nchunks of {args.chunk} static instructions (executed ones only):")
    for s in range(0, len(ops), args.chunk):
        seg = ops[s:s + args.chunk]
        ex, st = sum(o[1] for o in seg) / warps, sum(o[2] for o in seg)
        if ex < 0.5 and not st:
            continue
        kinds = sorted({opcode(o[0]).split(".")[0] for o in seg if o[1] and any(n in o[0] for n in NOTE)})
        print(f"  {s:5d} per warp {ex:6.1f}  samples {st:4d}  {' '.join(kinds)}")
    if args.top:
        print(f"\nthe {args.top} instructions with the most stall samples (index, samples, executed per warp):")
        for k in sorted(range(len(ops)), key=lambda k: -ops[k][2])[:args.top]:
            print(f"  {k:5d} {ops[k][2]:5d} {ops[k][1] / warps:6.1f}  {ops[k][0][:70]}")


if __name__ == "__main__":
    main()
