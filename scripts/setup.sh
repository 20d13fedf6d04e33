#!/usr/bin/env bash
# Brings a machine to a built rope_ext: installs only what is missing (a machine that
# already has torch keeps it: the GPU box has no network), then builds the extension
# in place against the installed torch, unless nothing it is built from changed since
# the last build. Sourced by test.sh, bench.sh and gpu_check.sh.
# CPU-only machine: ROPE_EXT_NO_CUDA=1 skips the CUDA kernels (a much shorter build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q "torch==2.14.1"
fi
for mod in pytest hypothesis numpy; do
  $PY -c "import $mod" 2>/dev/null || $PY -m pip install -q "$mod"
done
# The [hf] extra: the transformers integration's tests compare against the stock models.
# CI requires it (ROPE_EXT_REQUIRE_HF=1); where there is no registry (the GPU box) those
# tests skip and say so.
if ! $PY -c "import transformers" 2>/dev/null; then
  if [ "${ROPE_EXT_REQUIRE_HF:-0}" = 1 ]; then
    $PY -m pip install -q "transformers>=5.0"
  else
    $PY -m pip install -q "transformers>=5.0" || echo "transformers not installable here: its tests will skip"
  fi
fi
# No GPU to detect on CI: say which GPUs to compile for (9.0 = H100/H200).
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# Build only when something the extension is built from changed: the stamp of csrc/**,
# setup.py, pyproject.toml, the torch version and the build settings (scripts/build_stamp.py)
# against the one saved with the last build (rope_ext/_C.stamp). A clean clone (CI) has
# no stamp and builds.
STAMP=rope_ext/_C.stamp
mkdir -p build
LOG=build/setup.log
want=$($PY scripts/build_stamp.py)
# Where `import rope_ext` resolves from outside the checkout (the editable install).
installed=$(cd / && $PY -c "import os, rope_ext; print(os.path.dirname(os.path.realpath(rope_ext.__file__)))" 2>/dev/null || true)
here=$(pwd -P)/rope_ext
if compgen -G "rope_ext/_C*.so" > /dev/null && [[ -f $STAMP && "$(cat $STAMP)" == "$want" && "$installed" == "$here" ]]; then
  echo "rope_ext: extension up to date (csrc/, setup.py, torch and build settings unchanged): no rebuild"
else
  echo "rope_ext: building the extension ($($PY scripts/build_stamp.py --why $STAMP)); log: $LOG"
  if [[ "$want" == *cuda=1* ]]; then
    echo "  with the CUDA kernels (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, MAX_JOBS=$MAX_JOBS): several minutes on a"
    echo "  small machine. No GPU here? ROPE_EXT_NO_CUDA=1 bash scripts/test.sh builds the CPU path only (~1 min)."
  fi
  if [[ "$installed" == "$here" ]]; then
    # Installed from this checkout already: rebuild in place; ninja recompiles only the
    # files that changed (build/ keeps the objects).
    cmd=($PY setup.py build_ext --inplace)
  else
    cmd=($PY -m pip install -v --no-build-isolation --no-deps -e .)
  fi
  rm -f "$STAMP"
  set +e
  # Progress: one line per compiled file (ninja's [n/N]), the link; everything in $LOG.
  "${cmd[@]}" 2>&1 | tee "$LOG" | sed -u -nE \
    -e 's#^ *\[([0-9]+/[0-9]+)\] .* -c (-c )?([^ ]*/)?([^/ ]+\.(cpp|cu)) .*#  [\1] compiling \4#p' \
    -e 's#^ *(g\+\+|c\+\+|x86_64-linux-gnu-g\+\+) .*-shared .*#  linking#p'
  rc=${PIPESTATUS[0]}
  set -e
  if [[ $rc != 0 ]]; then
    echo "rope_ext: the build failed (exit $rc); the end of $LOG:"
    tail -40 "$LOG"
    return $rc 2>/dev/null || exit $rc
  fi
  echo "$want" > "$STAMP"
fi
$PY -c "import rope_ext; print('rope_ext built; CUDA kernels compiled in:', rope_ext.WITH_CUDA)"
