"""Prints the stamp of what the extension would be built from: a hash of csrc/**,
setup.py and pyproject.toml, the torch and Python versions, and the build settings
(CUDA or not, TORCH_CUDA_ARCH_LIST). scripts/setup.sh rebuilds only when it differs
from the stamp saved next to the last built rope_ext/_C*.so (rope_ext/_C.stamp).

    python scripts/build_stamp.py            # the stamp of the sources as they are now
    python scripts/build_stamp.py --why OLD  # which part differs from the stamp file OLD
"""
import hashlib
import os
import shutil
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def with_cuda():
    """setup.py's decision: nvcc found (CUDA_HOME, CUDA_PATH, /usr/local/cuda or PATH) and
    ROPE_EXT_NO_CUDA != 1."""
    if os.environ.get("ROPE_EXT_NO_CUDA", "0") == "1":
        return False
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return True
    return shutil.which("nvcc") is not None


def parts():
    h = hashlib.sha256()
    files = [os.path.join(ROOT, "setup.py"), os.path.join(ROOT, "pyproject.toml")]
    for d, _, names in os.walk(os.path.join(ROOT, "csrc")):
        files += [os.path.join(d, n) for n in names]
    for f in sorted(files):
        h.update(os.path.relpath(f, ROOT).encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(fh.read())
        h.update(b"\0")
    cuda = with_cuda()
    return [
        ("sources", h.hexdigest()[:16]),
        ("torch", torch.__version__),
        ("python", "%d.%d" % sys.version_info[:2]),
        ("cuda", "1" if cuda else "0"),
        ("arch", os.environ.get("TORCH_CUDA_ARCH_LIST", "") if cuda else ""),
    ]


def main():
    now = parts()
    if len(sys.argv) == 3 and sys.argv[1] == "--why":
        try:
            with open(sys.argv[2]) as f:
                old = dict(kv.split("=", 1) for kv in f.read().split())
        except OSError:
            print("no previous build")
            return
        diff = [k for k, v in now if old.get(k) != v]
        print("changed: " + ", ".join(f"{k} ({old.get(k, '?')} -> {v})" if k != "sources" else "csrc/ or setup.py"
                                      for k, v in now if k in diff) if diff else "nothing changed")
        return
    print(" ".join(f"{k}={v}" for k, v in now))


if __name__ == "__main__":
    main()
