"""Summarize `bench/decode_cold.py --sweep` output (the survey of auto's split plans).

    python bench/decode_cold.py --sweep [--fp8 --pair] --points ... --splits ... > sweep.txt
    python bench/plan_survey.py sweep.txt [more.txt ...]

Per point: auto's time and plan (splits, kv heads per CTA), the plain read, every forced
row by split count (one kv head per CTA, and pairs where the file has them), the fastest
forced row and auto / fastest; then per file the mean and the worst of auto / fastest. The
forced rows are what a rule change can be checked against without a GPU: a new rule's
count at each point reads its time off the row of that count (the fifteenth session of
2026-11-27 fitted and checked the wave rule, attention_dispatch.cu, that way; bench/NOTES.md).
"""
import re
import sys


def parse(path):
    """{(B, ctx): {"auto": us, "plan": (splits, kv per CTA), "read": us,
    "one": {splits: us}, "pair": {splits: us}}} from one decode_cold.py output."""
    rows, cur = {}, None
    for line in open(path):
        m = re.match(r"B=(\d+) ctx=(\d+)", line)
        if m:
            cur = rows.setdefault((int(m.group(1)), int(m.group(2))), {"one": {}, "pair": {}})
            continue
        if cur is None:
            continue
        m = re.match(r"\s+(pair )?splits (\d+) combine\s+([\d.]+)", line)
        if m:
            cur["pair" if m.group(1) else "one"][int(m.group(2))] = float(m.group(3))
            continue
        m = re.match(r"\s+auto\s+([\d.]+)", line)
        if m:
            cur["auto"] = float(m.group(1))
            continue
        m = re.match(r"\s+same-size read \(torch.sum\)\s+([\d.]+)", line)
        if m:
            cur["read"] = float(m.group(1))
            continue
        m = re.search(r"auto \S+ \(plan (\d+), (\d) kv", line)
        if m:
            cur["plan"] = (int(m.group(1)), int(m.group(2)))
    return rows


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        rows = parse(path)
        counts = sorted({s for r in rows.values() for kind in ("one", "pair") for s in r[kind]})
        print(f"== {path}: us; forced rows by split count {counts} (- not timed)")
        ratios = []
        for (B, ctx), r in sorted(rows.items()):
            if "auto" not in r:
                continue
            forced = [(t, kind, s) for kind in ("one", "pair") for s, t in r[kind].items()]
            best = min(forced) if forced else None
            plan = r.get("plan", ("?", "?"))
            head = (f"B {B:>3} ctx {ctx:>6}: auto {r['auto']:8.2f} (splits {plan[0]}, kv/CTA {plan[1]}) "
                    f"read {r.get('read', float('nan')):8.2f}")
            if best:
                ratios.append((r["auto"] / best[0], B, ctx))
                head += f"  best {best[0]:8.2f} ({best[1]} x{best[2]})  auto/best {r['auto'] / best[0]:.3f}"
            print(head)
            for kind in ("one", "pair"):
                if r[kind]:
                    cells = " ".join(f"{r[kind][s]:8.2f}" if s in r[kind] else f"{'-':>8}" for s in counts)
                    print(f"    {kind:<4} {cells}")
        if ratios:
            mean = sum(x for x, _, _ in ratios) / len(ratios)
            worst = max(ratios)
            print(f"  auto / best over {len(ratios)} points: mean {mean:.3f}, worst {worst[0]:.3f} "
                  f"(B {worst[1]} ctx {worst[2]})\n")


if __name__ == "__main__":
    main()
