"""Which 64-byte constant line of a kernel's parameters each instruction first reads
(issue 18: a cold line first read after a DRAM round trip puts its miss on the chain).

    cuobjdump -sass kernel.cubin > k.sass
    python bench/sass_lines.py k.sass                        # per function: first read of each line
    python bench/sass_lines.py k.sass --trace NAME [--upto 0x1000]   # the loads, constant reads and waits

Per function: the address of its first global load and of the first instruction that
reads each line of bank 0 from 0x200 (the parameters start at 0x210; 0x200-0x20f hold the
load descriptor every kernel reads). A register-indexed read (c[0x0][R4+0x210], an array
of the parameters indexed at run time) counts for the line of its base offset and is
marked "+R". Addresses are the code's layout, not the order the warps run it in: check
the branches between a load and a line's first read.

--trace: the instructions of the first function whose name contains NAME, up to --upto,
that load (LDG, LDC, ULDC, LDS), read a parameter, branch or wait, with their control bits
(sm_90: bits 41-61 of each instruction's second word: stall 4, yield 1, write scoreboard 3,
read scoreboard 3, wait mask 6; 7 = none). LDC sets a write scoreboard (its miss runs while
the warp goes on); ULDC and a constant operand do not (a miss holds the warp there).

Needs no GPU: cuobjdump comes with the CUDA toolkit (and with triton's wheel,
triton/backends/nvidia/bin).
"""
import argparse
import re

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
INSTR_HI = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);\s*/\*\s*0x[0-9a-f]+\s*\*/\s*\n\s*/\*\s*(0x[0-9a-f]+)\s*\*/")
CONST = re.compile(r"c\[0x0\]\[(?:(U?R\d+|U?RZ)\+)?(0x[0-9a-f]+)\]")
GLOBAL_LOAD = re.compile(r"\bLDG\.")  # not LDGSTS / LDGDEPBAR
SHOWN = re.compile(r"\b(LDG|LDC|ULDC|LDS|LDGSTS|BRA|EXIT|BAR)\b|c\[0x0\]\[0x[2-9a-f]")


def lines_first_read(sass):
    """{line: (address of its first read, indexed)}, address of the first LDG (None if none)."""
    first, first_ldg = {}, None
    for m in INSTR.finditer(sass):
        addr, ins = int(m.group(1), 16), m.group(2)
        for reg, c in CONST.findall(ins):
            off = int(c, 16)
            indexed = bool(reg) and not reg.endswith("RZ")
            if off >= 0x200:
                first.setdefault(off // 64 * 64, (addr, indexed))
        if GLOBAL_LOAD.search(ins) and first_ldg is None:
            first_ldg = addr
    return first, first_ldg


def trace(sass, upto):
    for m in INSTR_HI.finditer(sass):
        addr, ins, hi = int(m.group(1), 16), m.group(2).strip(), int(m.group(3), 16)
        if addr > upto:
            break
        ctrl = hi >> 41
        wb, rb, wait = (ctrl >> 5) & 7, (ctrl >> 8) & 7, (ctrl >> 11) & 0x3F
        tag = ""
        if wait:
            tag += " wait " + ",".join(f"SB{i}" for i in range(6) if wait >> i & 1)
        if wb != 7:
            tag += f" sets SB{wb} (write)"
        if rb != 7:
            tag += f" sets SB{rb} (read)"
        if SHOWN.search(ins) or wait:
            print(f"  {addr:04x}  {ins[:72]:<72}{tag}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass", help="cuobjdump -sass output")
    ap.add_argument("--trace", metavar="NAME", help="trace the first function whose name contains NAME")
    ap.add_argument("--upto", default="0x1000", help="with --trace: the last address shown (hex)")
    args = ap.parse_args()
    text = open(args.sass).read()
    for func in re.split(r"\n\s*Function : ", text)[1:]:
        name = func.split("\n")[0].strip()
        if args.trace:
            if args.trace in name:
                print(name)
                trace(func, int(args.upto, 16))
                return
            continue
        first, ldg = lines_first_read(func)
        print(name)
        lines = ", ".join(f"{ln:#x}{'+R' if ix else ''} at {a:#06x}" for ln, (a, ix) in sorted(first.items()))
        print(f"  first LDG at {ldg:#06x}" if ldg is not None else "  no LDG", f"; lines first read: {lines}")
    if args.trace:
        raise SystemExit(f"no function whose name contains {args.trace!r}")


if __name__ == "__main__":
    main()
