#!/usr/bin/env bash
# Brings a machine to a built rope_ext: installs only what is missing (a machine that
# already has torch keeps it: the GPU box has no network), then builds the extension
# in place against the installed torch. Sourced by test.sh, bench.sh and gpu_check.sh.
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
$PY -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | grep -v "Running pip as the 'root'" || true
$PY -c "import rope_ext; print('rope_ext built; CUDA kernels compiled in:', rope_ext.WITH_CUDA)"
