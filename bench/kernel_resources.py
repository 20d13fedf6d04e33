"""Static resources of every kernel in one CUDA file, without a GPU (issue 19: "find
where the time goes"): ptxas's report (registers, spills, stack frame, barriers, shared
and constant bank bytes) and the SASS (instruction count and a few telling opcodes).

    python bench/kernel_resources.py                          # csrc/cuda/rope_dispatch.cu, sm_90
    python bench/kernel_resources.py -D ROPE_EXT_ANGLE_TURNS=1 # the same with an angle option
    python bench/kernel_resources.py --src csrc/cuda/norm_rope_dispatch.cu --markdown

Compiles with the flags setup.py + torch.utils.cpp_extension give nvcc (-O3, C++20, the
torch half/bf16 macros, -gencode sm_90), adding -Xptxas -v, into a temporary object.
Columns: regs; stack frame / spill store / spill load bytes; barriers; constant banks
(cuobjdump -res-usage; bank 0 = the driver's 528-byte area + the kernel parameters); SASS
instructions (NOPs excluded); then opcode counts: FP64 (D*), MUFU, CALL (subroutines:
the 64-bit divide, sincosf's slow path when not inlined), BAR, LDC (explicit constant
loads, ULDC their uniform form; operands read straight from c[0x0][...] are not
counted), LDL/STL (local memory).
"""
import argparse
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_BIN = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin")


def tool(*names):
    """The first of `names` found in the toolkit's bin, on PATH, or in triton's bundled
    CUDA tools (a bare toolkit may lack cuobjdump; GNU c++filt demangles CUDA names too)."""
    import shutil
    dirs = [CUDA_BIN]
    try:
        import triton
        dirs.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin"))
    except ImportError:
        pass
    for name in names:
        for d in dirs:
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
        if shutil.which(name):
            return shutil.which(name)
    sys.exit(f"none of {names} found")


def nvcc_cmd(src, obj, defines, arch):
    from torch.utils import cpp_extension
    inc = cpp_extension.include_paths() + [sysconfig.get_paths()["include"], os.path.join(ROOT, "csrc")]
    return ([tool("nvcc"), "-c", src, "-o", obj, "-std=c++20", "-O3", "--expt-relaxed-constexpr",
             "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-D__CUDA_NO_HALF2_OPERATORS__", "--compiler-options", "-fPIC", "-DROPE_EXT_WITH_CUDA",
             "-DTORCH_EXTENSION_NAME=_C", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v"]
            + [f"-D{d}" for d in defines] + [f"-I{i}" for i in inc])


def demangle(names):
    out = subprocess.run([tool("cu++filt", "c++filt")], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    return dict(zip(names, out)) if len(out) >= len(names) else {n: n for n in names}


def short(name):
    """rope_ext::cuda::rope_tile_kernel<c10::BFloat16, false>(...) -> tile<bf16,neox>"""
    m = re.search(r"(\w+)_kernel<([^>]*)>", name)
    if not m:
        return re.sub(r"\(.*", "", name).split("::")[-1]
    kind = m.group(1).replace("rope_", "")
    args = [a.strip() for a in m.group(2).split(",")]
    ty = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64"}.get(args[0], args[0])
    # (the first bool is the pairing; later ones, e.g. lean's kPlain / kHint, stay true / false)
    rest = [("gptj" if a == "true" else "neox") if i == 0 and a in ("true", "false") else a
            for i, a in enumerate(args[1:])]
    return f"{kind}<{','.join([ty] + rest)}>"


def parse_ptxas(text):
    res = defaultdict(dict)
    cur = None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            res[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            r = res[cur]
            r["regs"] = int(m.group(1))
            b = re.search(r"used (\d+) barriers", line)
            r["bar"] = int(b.group(1)) if b else 0
    return res


def parse_res_usage(text):
    """cuobjdump -res-usage: per function REG, STACK, SHARED, LOCAL, CONSTANT[n] (ptxas
    13 no longer prints the constant banks with -v); 'Common' holds module-wide banks."""
    res, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            cur = m.group(1)
            continue
        if re.match(r"\s*Common:", line):
            cur = "__common__"
            continue
        if cur and ":" in line:
            res[cur] = {k: int(v) for k, v in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line)}
            cur = None
    return res


OPS = {"FP64": r"^D(FMA|MUL|ADD|SETP|MNMX)|^F2F\.F64|^F2F\.F32\.F64|^I2F\.F64|^F2I.*F64", "MUFU": r"^MUFU",
       "CALL": r"^CALL", "BAR": r"^BAR", "LDC": r"^LDC", "ULDC": r"^ULDC", "LDL/STL": r"^(LDL|STL)"}


def parse_sass(text):
    res = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            cur = m.group(1)
            res[cur] = defaultdict(int)
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and cur:
            op = m.group(1)
            if op.startswith("NOP"):
                continue
            res[cur]["instr"] += 1
            for k, pat in OPS.items():
                if re.match(pat, op):
                    res[cur][k] += 1
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default="csrc/cuda/rope_dispatch.cu")
    ap.add_argument("-D", dest="defines", action="append", default=[], help="extra macro, e.g. ROPE_EXT_ANGLE_TURNS=1")
    ap.add_argument("--arch", default="90")
    ap.add_argument("--obj", help="keep the object here (default: a temporary file)")
    ap.add_argument("--reuse", action="store_true", help="read --obj and its .ptxas log instead of compiling")
    ap.add_argument("--markdown", action="store_true", help="a markdown table (for bench/NOTES.md)")
    a = ap.parse_args()
    os.chdir(ROOT)
    obj = a.obj or os.path.join(tempfile.mkdtemp(), "k.o")
    if a.reuse:  # an object (and its ptxas log, obj + ".ptxas") from an earlier run
        log = open(obj + ".ptxas").read()
    else:
        cmd = nvcc_cmd(a.src, obj, a.defines, a.arch)
        print("#", " ".join(cmd), file=sys.stderr)
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            sys.exit(p.stdout + p.stderr)
        log = p.stdout + p.stderr
        with open(obj + ".ptxas", "w") as fh:
            fh.write(log)
    ptx = parse_ptxas(log)
    cuobjdump = tool("cuobjdump")
    sass = parse_sass(subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout)
    usage = parse_res_usage(subprocess.run([cuobjdump, "-res-usage", obj], capture_output=True, text=True,
                                           check=True).stdout)
    common = usage.pop("__common__", {})
    names = sorted(set(ptx) | set(sass))
    dm = demangle(names)
    rows = []
    for n in names:
        r, s, u = ptx.get(n, {}), sass.get(n, {}), usage.get(n, {})
        label = short(dm[n]) + ("" if "regs" in r else " (device fn)")
        banks = " ".join(f"{k[9:-1]}:{v}" for k, v in sorted(u.items()) if k.startswith("CONSTANT") and v)
        rows.append([label, r.get("regs", ""), r.get("stack", ""), r.get("spill_st", ""), r.get("spill_ld", ""),
                     r.get("bar", ""), banks, s.get("instr", 0)] + [s.get(k, 0) for k in OPS])
    rows.sort(key=lambda x: x[0])
    head = ["kernel", "regs", "stack", "spill st", "spill ld", "bar", "cmem bank:bytes", "SASS"] + list(OPS)
    tag = " ".join(a.defines) or "default"
    if a.markdown:
        print(f"`{a.src}`, sm_{a.arch}, {tag}; module-wide: {common}\n")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(str(v) for v in r) + " |")
    else:
        print(f"{a.src}, sm_{a.arch}, {tag}; module-wide: {common}")
        w = [9] * len(head)
        w[6] = 16
        print(f"{head[0]:<26}" + "".join(f"{h:>{x}}" for h, x in zip(head[1:], w[1:])))
        for r in rows:
            print(f"{r[0]:<26}" + "".join(f"{str(v):>{x}}" for v, x in zip(r[1:], w[1:])))


if __name__ == "__main__":
    main()
