#!/usr/bin/env bash
# One call on the GPU box: build, full test suite, quick bench; logs under $OUT.
#   bash scripts/gpu_check.sh [--full-bench] [--sanitize]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$(pwd)/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
source scripts/setup.sh > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
set +e  # setup.sh sets -e; here every step runs and reports
echo "build: $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/build.log"
$PY -X faulthandler -m pytest -q tests -p no:cacheprovider > "$OUT/tests.log" 2>&1
test_rc=$?
tail -15 "$OUT/tests.log"
bench_args="--quick"
[[ " $* " == *" --full-bench "* ]] && bench_args=""
$PY bench/run.py $bench_args --json "$OUT/bench.json" --csv "$OUT/bench.csv" > "$OUT/bench.txt" 2>&1
bench_rc=$?
if [[ " $* " == *" --sanitize "* ]]; then
  bash scripts/sanitize.sh > "$OUT/sanitize.txt" 2>&1; tail -12 "$OUT/sanitize.txt"
fi
echo "=== tests rc=$test_rc  bench rc=$bench_rc ==="
cat "$OUT/bench.txt"
exit $(( test_rc || bench_rc ))
