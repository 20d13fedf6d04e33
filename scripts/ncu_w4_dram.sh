#!/usr/bin/env bash
# Issue 19's W4 in place against a copy kernel of the same bytes (torch.mul by 1: ncu cannot
# see the suite's copy_, a cudaMemcpyAsync) under ncu in the latency suite's regime
# (each call after a 256 MB write, no cache control, boost clocks): duration, DRAM bytes
# read and written during the kernel, DRAM throughput, to say whether auto's in-place
# stream already moves DRAM as the copy does (is 59 us reachable at these bytes?). Run from
# gpu_check.sh --run after its build (PY and OUT set) -> $OUT/ncu_w4_dram.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-python3}
OUT=${OUT:-$(pwd)/gpu_out}
M="gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for w in w4 w4copy; do
  echo "=== $w"
  PROFILE_DIRTY_L2=1 ncu --cache-control none --clock-control none --kernel-name-base demangled -k regex:"rope_lean|MulFunctor" \
      --launch-skip 2 --launch-count 1 --metrics "$M" $PY bench/profile_one.py "$w" auto 2>&1 |
      grep -E "rope_lean|MulFunctor|gpu__time|dram__" | head -10
done | tee "$OUT/ncu_w4_dram.txt"
