#!/usr/bin/env bash
# One call on the GPU box: build, full test suite, quick bench; logs under $OUT.
#   bash scripts/gpu_check.sh                      # build + tests + quick bench
#   bash scripts/gpu_check.sh --sanitize           # + compute-sanitizer (memcheck/racecheck/initcheck)
#   bash scripts/gpu_check.sh --no-tests --bench "--suite all --plot \$OUT/sweep.png"
#   bash scripts/gpu_check.sh --tests tests/test_attention.py --bench "--suite attn --quick" --ncu-decode
#   bash scripts/gpu_check.sh --no-tests --bench "--suite fp8" --ncu-cases "fp8_b8_8192 append_8192"
#   bash scripts/gpu_check.sh --no-tests --bench "" --run "python bench/flush_study.py" --ncu-rope
#   (--tests: what pytest runs, default the whole suite (quotes inside it are kept:
#   --tests 'tests/test_attention.py -k "lean or append"'); --ncu-decode: ncu of the decode and
#   append kernels, bench/profile_decode.py (every case, or those of --ncu-cases), into
#   $OUT/ncu_decode.txt; --ncu-rope: ncu of the small rope call, rope_ext's kernel and
#   torch.compile's, into $OUT/ncu_rope.txt; both with the warp stall reasons per issued
#   instruction; --ncu-src "REGEX SKIP SCRIPT ARGS;...": instructions executed and stall
#   samples per SASS instruction of the first kernel matching REGEX after SKIP launches,
#   into $OUT/ncu_sass_N.csv (bench/sass_profile.py reads them; env NCU_SRC_FLAGS: more ncu
#   options, e.g. "--cache-control none --clock-control none"); --run: more commands
#   after the build, into $OUT/run.txt; --bench "": no bench)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$(pwd)/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
run_tests=1; sanitize=0; bench_args="--quick"; tests="tests"; ncu_decode=0; ncu_cases=""; ncu_rope=0; extra=""; ncu_src=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --no-tests) run_tests=0 ;;
    --sanitize) sanitize=1 ;;
    --bench) bench_args=$2; shift ;;
    --tests) tests=$2; shift ;;
    --ncu-decode) ncu_decode=1 ;;
    --ncu-cases) ncu_decode=1; ncu_cases=$2; shift ;;
    --ncu-rope) ncu_rope=1 ;;
    --ncu-src) ncu_src=$2; shift ;;
    --run) extra=$2; shift ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
  shift
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t0=$(date +%s)
# The bench's optional peers (Liger, FlashInfer) from carried wheels (scripts/install_peers.sh).
[ -d bench/peers/wheels ] && { bash scripts/install_peers.sh 2>&1 | grep "install_peers" || true; }
source scripts/setup.sh > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
set +e  # setup.sh sets -e; here every step runs and reports
export PY
echo "build: $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/build.log"
test_rc=0; san_rc=0
if [[ $run_tests == 1 ]]; then
  xd=""; $PY -c "import xdist" 2>/dev/null && xd="-n 8"  # 16 cores there; CUDA tests share the GPU fine
  # eval: quotes inside --tests reach pytest whole (--tests 'tests/x.py -k "lean or append"')
  eval "$PY -X faulthandler -m pytest -q $tests $xd -p no:cacheprovider" > "$OUT/tests.log" 2>&1
  test_rc=$?
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
  $PY bench/accuracy.py > "$OUT/accuracy.txt" 2>&1; cat "$OUT/accuracy.txt"
fi
# Warp stall reasons: warps stalled per issued instruction, by reason (no_instruction: the
# instruction fetch, cold after an L2 flush; long_scoreboard: global loads; barrier; ...).
STALLS="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__cycles_elapsed.max"
if [[ $ncu_decode == 1 ]]; then
  ncu --profile-from-start off -k regex:"decode|append|merge" --section SpeedOfLight --section LaunchStats --section Occupancy \
      --section WarpStateStats --section MemoryWorkloadAnalysis --metrics "$STALLS" \
      $PY bench/profile_decode.py $ncu_cases > "$OUT/ncu_decode.txt" 2>&1
  grep -E "(decode|append|merge)[a-z_]*kernel|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Grid Size" "$OUT/ncu_decode.txt" | head -60
fi
if [[ $ncu_rope == 1 ]]; then
  for impl in auto compile; do
    ncu -k regex:"triton|rope" --launch-skip 2 --launch-count 1 --section SpeedOfLight --section LaunchStats \
        --section WarpStateStats --metrics "$STALLS" $PY bench/profile_one.py small "$impl" 16
  done > "$OUT/ncu_rope.txt" 2>&1
  grep -E "^  [a-z_].*(kernel|triton)|Duration|stalled_(no_inst|long_score|barrier|wait|short)" "$OUT/ncu_rope.txt" | head -40
fi
if [[ -n $ncu_src ]]; then  # "REGEX SKIP SCRIPT ARGS...;REGEX SKIP ..." -> ncu_sass_1.csv, ...
  i=0
  IFS=';' read -ra specs <<< "$ncu_src"
  for spec in "${specs[@]}"; do
    i=$((i + 1)); read -r kre skip cmd <<< "$spec"
    rep=$(mktemp -d)/src
    ncu -k regex:"$kre" --launch-skip "$skip" --launch-count 1 --section SourceCounters --section WarpStateStats \
        ${NCU_SRC_FLAGS:-} -o "$rep" $PY $cmd > /dev/null 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass_$i.csv" 2>&1
    echo "ncu-src $i ($spec): $(wc -l < "$OUT/ncu_sass_$i.csv") lines"
  done
fi
if [[ -n $extra ]]; then
  bash -c "$extra" > "$OUT/run.txt" 2>&1; echo "--run rc=$?"; cat "$OUT/run.txt"
fi
if [[ $sanitize == 1 ]]; then
  bash scripts/sanitize.sh > "$OUT/sanitize.txt" 2>&1; san_rc=$?; cat "$OUT/sanitize.txt" | tail -12
fi
bench_rc=0
if [[ -n $bench_args ]]; then
  $PY bench/run.py $bench_args --json "$OUT/bench.json" > "$OUT/bench.txt" 2>"$OUT/bench.err"
  bench_rc=$?
fi
echo "=== tests rc=$test_rc  sanitize rc=$san_rc  bench rc=$bench_rc ==="
[[ -n $bench_args ]] && grep -v "^W1122\|recompile" "$OUT/bench.txt"
[[ $bench_rc != 0 ]] && tail -20 "$OUT/bench.err"
find "$OUT" -empty -delete  # at most 8 files come back from the GPU box
exit $(( test_rc || bench_rc || san_rc ))
