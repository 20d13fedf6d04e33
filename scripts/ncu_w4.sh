#!/usr/bin/env bash
# Issue 19's W4 (q [8192, 32, 128] + k [8192, 8, 128] thd bf16 in place) under ncu in the
# latency suite's regime (each call after a 256 MB write, no cache control, boost clocks)
# at U = $US rows a thread: duration, DRAM throughput and the warp stall reasons, to say
# what makes one row a thread 8-9 us slower than two (thirtieth session, run 5). Run from
# gpu_check.sh --run after its build (PY and OUT set) -> $OUT/ncu_w4_uN.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-python3}
OUT=${OUT:-$(pwd)/gpu_out}
US=${US:-1 2 4}
STALLS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for u in $US; do
  PROFILE_DIRTY_L2=1 PROFILE_U=$u ncu --cache-control none --clock-control none -k regex:rope_lean \
      --launch-skip 2 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy \
      --section WarpStateStats --metrics "$STALLS,smsp__inst_executed.sum,sm__cycles_elapsed.max" \
      $PY bench/profile_one.py w4 auto > "$OUT/ncu_w4_u$u.txt" 2>&1
  echo "=== U = $u"
  grep -E "rope_lean|Duration|DRAM Throughput|Grid Size|Block Size|Achieved Occupancy|inst_executed.sum|stalled_[a-z_]+_per_issue_active.ratio +[a-z/]* +[0-9.]*[1-9]" \
      "$OUT/ncu_w4_u$u.txt" | head -40
done
