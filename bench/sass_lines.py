"""Which 64-byte constant line of a kernel's parameters each instruction first reads
(issue 18: a cold line first read after a DRAM round trip puts its miss on the chain).

    cuobjdump -sass kernel.cubin > k.sass; python bench/sass_lines.py k.sass

Per function: the address of its first global load and of the first instruction that
reads each line of bank 0 from 0x200 (the parameters start at 0x210; 0x200-0x20f hold the
load descriptor every kernel reads).
"""
import re,sys
txt=open(sys.argv[1]).read()
funcs=re.split(r'\n\s*Function : ',txt)[1:]
for f in funcs:  # one function's SASS
    name=f.split('\n')[0]
    first={}; firstldg=None
    for m in re.finditer(r'/\*([0-9a-f]{4})\*/\s+([^;]*);',f):
        addr=int(m.group(1),16); ins=m.group(2)
        for c in re.findall(r'c\[0x0\]\[(0x[0-9a-f]+)\]',ins):
            off=int(c,16)
            if off>=0x200: first.setdefault(off//64*64,addr)
        if 'LDG' in ins and firstldg is None: firstldg=addr
    print(name.strip()[:100]); print('  first LDG at',hex(firstldg),' lines first read:',{hex(k):hex(v) for k,v in sorted(first.items())})
