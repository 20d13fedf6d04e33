"""The attn suite's decode plot from its printed tables (a saved stdout of
`bench/run.py --suite attn`, e.g. docs/h100_attn_turns.txt), for runs that kept no --json:

    python bench/plot_attn_text.py docs/h100_attn_turns.txt docs/h100_attn_turns.png

Parses every "decode contiguous|paged(16) B=.. ctx=.." table into the rows attn.plot_attn
draws (needs matplotlib)."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn import plot_attn  # noqa: E402

HEAD = re.compile(r"^decode (contiguous|paged\(\d+\)) B=(\d+) ctx=(\d+) ")
ROW = re.compile(r"^  (\S.*?)\s{2,}(\d+\.\d+)\s")


def parse(path):
    results, cur = [], None
    for line in open(path):
        m = HEAD.match(line)
        if m:
            cur = dict(kind="decode", paged=m.group(1) != "contiguous", B=int(m.group(2)), ctx=int(m.group(3)), rows=[])
            results.append(cur)
            continue
        m = ROW.match(line)
        if cur is not None and m:
            cur["rows"].append(dict(impl=m.group(1), us=float(m.group(2))))
        elif not line.strip():
            cur = cur if cur is None or not cur["rows"] else None
    return results


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    res = parse(sys.argv[1])
    print(f"{len(res)} decode tables from {sys.argv[1]}")
    plot_attn(res, sys.argv[2])
