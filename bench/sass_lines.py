"""Which 64-byte constant line of a kernel's parameters each instruction first reads
(issue 18: a cold line first read after a DRAM round trip puts its miss on the chain).

    cuobjdump -sass kernel.cubin > k.sass; python bench/sass_lines.py k.sass

Per function: the address of its first global load and of the first instruction that
reads each line of bank 0 from 0x200 (the parameters start at 0x210; 0x200-0x20f hold the
load descriptor every kernel reads). A register-indexed read (c[0x0][R4+0x210], an array
of the parameters indexed at run time) counts for the line of its base offset and is
marked "+R". Addresses are the code's layout, not the order the warps run it in: check
the branches between a load and a line's first read. Needs no GPU: cuobjdump comes with
the CUDA toolkit (and with triton's wheel, triton/backends/nvidia/bin).
"""
import re
import sys

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
CONST = re.compile(r"c\[0x0\]\[(?:(U?R\d+|U?RZ)\+)?(0x[0-9a-f]+)\]")
GLOBAL_LOAD = re.compile(r"\bLDG\.")  # not LDGSTS / LDGDEPBAR


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


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    text = open(sys.argv[1]).read()
    for func in re.split(r"\n\s*Function : ", text)[1:]:
        first, ldg = lines_first_read(func)
        print(func.split("\n")[0].strip())
        lines = ", ".join(f"{ln:#x}{'+R' if ix else ''} at {a:#06x}" for ln, (a, ix) in sorted(first.items()))
        print(f"  first LDG at {ldg:#06x}" if ldg is not None else "  no LDG", f"; lines first read: {lines}")


if __name__ == "__main__":
    main()
