#!/usr/bin/env bash
# Issue 19: the small out-of-place rope call under ncu in the latency suite's regime (run
# from gpu_check.sh --run after its build: PY and OUT set). The suite replays each call
# after a 256 MB write, so the call meets an L2 full of dirty lines, at boost clocks;
# ncu's default (--cache-control all, base clocks) invalidates L2 instead, and there
# rope_ext's ordering against torch.compile was not the suite's (bench/NOTES.md, the
# twenty-eighth session). Here: --cache-control none --clock-control none.
#   1. durations: bench/small_rope_study.py's variants, rope_ext's calls, torch.compile
#      and the copy, each replay after the study's flush (timing.flush_l2), at S = $SIZES;
#      bench/ncu_durations.py groups them -> $OUT/ncu_dur.txt
#   2. stall samples per SASS instruction: bench/profile_one.py small (PROFILE_DIRTY_L2=1,
#      a 256 MB write before each call) for each of $IMPLS at S = $SRC_S, the last of three
#      calls -> $OUT/ncu_src.txt (bench/sass_profile.py of each; the CSVs in ncu_src.tgz)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-python3}
OUT=${OUT:-$(pwd)/gpu_out}
SIZES=${SIZES:-16,64}
ONLY=${ONLY:-lean_global,lean_nopos,plain1,plain_k0,plain_k1,lean_table,copy_lean}
IMPLS=${IMPLS:-auto compile study:lean_global study:plain_k1}
SRC_S=${SRC_S:-16}   # S of step 2
STEPS=${STEPS:-12}   # which steps run
REGIME="--cache-control none --clock-control none"
$PY -c "import sys; sys.path.insert(0, 'bench'); import small_rope_study as s; s.build()" || exit 1  # (built outside ncu)
if [[ $STEPS == *1* ]]; then
ncu $REGIME --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_dur.csv" \
    $PY bench/small_rope_study.py --reps 7 --sizes "$SIZES" --only "$ONLY" > "$OUT/ncu_study.txt" 2>&1
echo "study under ncu rc=$?"
$PY bench/ncu_durations.py "$OUT/ncu_dur.csv" > "$OUT/ncu_dur.txt" 2>&1; cat "$OUT/ncu_dur.txt"
rm -f "$OUT/ncu_dur.csv"
fi
[[ $STEPS == *2* ]] || exit 0
tmp=$(mktemp -d)
i=0
for impl in $IMPLS; do
  i=$((i + 1))
  case $impl in compile) kre="triton" ;; study:*) kre="study|lean_nopos|rope_lean" ;; *) kre="rope_lean" ;; esac
  PROFILE_DIRTY_L2=1 ncu $REGIME -k regex:"$kre" --launch-skip 2 --launch-count 1 --section SourceCounters \
      --section WarpStateStats --warp-sampling-interval 0 -o "$tmp/src$i" $PY bench/profile_one.py small "$impl" "$SRC_S" \
      > "$tmp/log$i.txt" 2>&1 || tail -5 "$tmp/log$i.txt"
  [ -f "$tmp/src$i.ncu-rep" ] || { echo "=== $i: $impl: no ncu report" >> "$OUT/ncu_src.txt"; continue; }
  ncu -i "$tmp/src$i.ncu-rep" --page source --csv --print-source sass > "$tmp/sass_$i.csv" 2>&1
  ncu -i "$tmp/src$i.ncu-rep" --page details > "$tmp/details_$i.txt" 2>&1
  {
    echo "=== $i: $impl"
    grep -E "Duration|Warp Cycles Per Issued|Avg. Active Threads" "$tmp/details_$i.txt" | head -6
    $PY bench/sass_profile.py "$tmp/sass_$i.csv" --top 15
  } >> "$OUT/ncu_src.txt" 2>&1
done
tar czf "$OUT/ncu_src.tgz" -C "$tmp" . && cat "$OUT/ncu_src.txt"
rm -rf "$tmp"
