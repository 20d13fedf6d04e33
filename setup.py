"""Build of the rope_ext C++/CUDA extension.

CUDA code is compiled when nvcc is found (CUDA_HOME or PATH), whether or not a GPU is
present: CI has nvcc but no GPU, and compiling the kernels there is a real check.
Set TORCH_CUDA_ARCH_LIST (e.g. "9.0" for H100, "8.0;9.0") to choose the GPUs; the
build never hard-codes -arch. ROPE_EXT_REQUIRE_CUDA=1 turns a missing nvcc into an error.
ROPE_EXT_ANGLE picks the kernels' angle reduction (csrc/rope_math.h, angle_sincos):
turns (default since issue 19: no FP64, as accurate or more, 2-4% faster on small
tensors on the H100), double, sincospif or fixed; one build each
(scripts/gpu_latency.sh builds them side by side to compare them on one GPU).
"""
import glob
import os
import shutil

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def find_cuda_home():
    """The toolkit folder (bin/nvcc, include, lib64). nvcc on PATH may be a wrapper
    script outside it (here /usr/local/bin/nvcc), so prefer a folder with lib64."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return home
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None


cuda_home = find_cuda_home()
if cuda_home:
    os.environ["CUDA_HOME"] = cuda_home  # read by torch.utils.cpp_extension at import

from torch.utils import cpp_extension  # noqa: E402


def find_nvcc():
    return cuda_home is not None


# GPU angle paths (rope_math.h): the default is the one measured on the H100 so far.
ANGLE_FLAGS = {"double": [], "sincospif": ["-DROPE_EXT_SINCOSPIF=1"], "turns": ["-DROPE_EXT_ANGLE_TURNS=1"],
               "fixed": ["-DROPE_EXT_ANGLE_FIXED=1"]}
angle = os.environ.get("ROPE_EXT_ANGLE", "") or "turns"
if angle not in ANGLE_FLAGS:
    raise SystemExit(f"ROPE_EXT_ANGLE={angle!r}: expected one of {', '.join(ANGLE_FLAGS)}")

with_cuda = find_nvcc() and os.environ.get("ROPE_EXT_NO_CUDA", "0") != "1"
if os.environ.get("ROPE_EXT_REQUIRE_CUDA", "0") == "1" and not with_cuda:
    raise SystemExit("ROPE_EXT_REQUIRE_CUDA=1 but nvcc was not found (set CUDA_HOME)")

sources = ["csrc/registration.cpp", "csrc/rope_ops.cpp", "csrc/cpu/rope_cpu.cpp",
           "csrc/norm_rope_ops.cpp", "csrc/cpu/norm_rope_cpu.cpp", "csrc/attention_ops.cpp", "csrc/cpu/attention_cpu.cpp"]
cxx_flags = ["-O3"]  # the C++ standard comes from torch (C++17 or C++20 by version)
define_macros = []
if with_cuda:
    # First: the longest compiles start first under ninja's parallel jobs. One decode
    # kernel instance per file (dtype x head dim), so that they compile in parallel.
    sources = (["csrc/cuda/attention_dispatch.cu", "csrc/cuda/rope_dispatch.cu", "csrc/cuda/norm_rope_dispatch.cu"]
               + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc/cuda/instances/*.cu")))
               + sources)
    define_macros.append(("ROPE_EXT_WITH_CUDA", None))
    # No --use_fast_math: it would turn sincosf into __sinf/__cosf (wrong at long positions).
    nvcc_flags = ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-DROPE_EXT_WITH_CUDA"] + ANGLE_FLAGS[angle]
    Ext = cpp_extension.CUDAExtension
    extra = {"cxx": cxx_flags, "nvcc": nvcc_flags}
else:
    Ext = cpp_extension.CppExtension
    extra = {"cxx": cxx_flags}

setup(
    name="rope_ext",
    version="0.1.0",
    packages=["rope_ext", "rope_ext.integrations"],
    ext_modules=[
        Ext(
            name="rope_ext._C",
            sources=sources,
            include_dirs=[os.path.join(ROOT, "csrc")],
            define_macros=define_macros,
            extra_compile_args=extra,
        )
    ],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
