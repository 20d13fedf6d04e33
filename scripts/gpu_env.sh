# Sourced by the one-call GPU scripts that build their own trees (gpu_ab.sh, gpu_latency.sh):
# the checkout's root, $OUT for the files that come back, the build settings, the python
# to run, and `stamp` for timed progress lines.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
PY=${PYTHON:-python3}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
