"""The rope options are one list (csrc/rope_options.h): the schema, struct Options, the
C++ parameter lists and their forwarding are generated from it, and Python reads the
option positions by name from the registered schema (rope_ext._ops.OPT_NAMES). A build
with the list in another order (ROPE_EXT_TEST_OPTION_ORDER: scalars and tensors
interleaved, `inverse` and `impl` moved) must pass the op, gradient and option tests
unchanged. A hand-written index (the old `_INVERSE = 9`) would fail them: the backward
would flip the wrong option.

The reordered extension is built CPU-only (torch.utils.cpp_extension.load, ninja keeps
its objects in build/option_order, so a rerun compiles only what changed) and the tests
run in a subprocess that imports rope_ext over it."""
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = ["tests/test_registration.py", "tests/test_norm_rope.py", "tests/test_options.py", "tests/test_positions.py",
         "tests/test_edge_cases.py", "tests/test_validation.py"]

SCRIPT = r"""
import os, sys
from torch.utils import cpp_extension
root, build, sources = sys.argv[1], sys.argv[2], sys.argv[3:]
os.makedirs(build, exist_ok=True)
mod = cpp_extension.load(name="_C", sources=sources, extra_include_paths=[os.path.join(root, "csrc")],
                         extra_cflags=["-O1", "-DROPE_EXT_TEST_OPTION_ORDER"], build_directory=build, with_cuda=False)
sys.modules["rope_ext._C"] = mod  # `from . import _C` in rope_ext takes this build
import pytest
import rope_ext
from rope_ext._ops import OPT_NAMES
assert OPT_NAMES[0] == "impl" and OPT_NAMES.index("inverse") != 9, f"not the reordered build: {OPT_NAMES}"
print("option order:", OPT_NAMES, flush=True)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-k", "not cuda", *TESTS]))
"""


def test_reordered_option_list_passes_the_op_and_gradient_tests():
    sources = sorted(glob.glob(os.path.join(ROOT, "csrc", "*.cpp")) + glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", MAX_JOBS=os.environ.get("MAX_JOBS", "2"))
    r = subprocess.run([sys.executable, "-c", SCRIPT.replace("*TESTS", repr(TESTS)[1:-1]), ROOT,
                        os.path.join(ROOT, "build", "option_order"), *sources],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, f"the reordered build failed its tests:\n{tail}"
    assert "option order: ('impl'," in r.stdout and " passed" in r.stdout, tail
