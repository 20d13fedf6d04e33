#!/usr/bin/env bash
# Issue 19 in one GPU call: the kernels' angle paths (setup.py's ROPE_EXT_ANGLE, rope_math.h)
# built side by side, then for each: bench/accuracy.py, the latency suite and ncu of the
# small-tensor cases. Nothing is installed; each build lives in its own tree.
#   bash scripts/gpu_latency.sh                 # double (default) + turns + fixed, ~6-7 min on an H100 box
#   ALTS=fixed bash scripts/gpu_latency.sh      # double + one alternative, ~5 min
#   NCU=0 bash scripts/gpu_latency.sh           # without ncu
#   TESTS="tests/test_attention.py" bash ...     # also pytest these on the default build (tests.log)
# Files under $OUT (5): build.log, accuracy.txt, latency.txt (first every build's rope_ext
# columns, --rope-only; then the default build's full suite with torch.compile and the
# peers), ncu.txt (sections below,
# [1,16,32,128] bshd bf16 and W5 for every build), small_double.ncu-rep (--set full with
# source, the default build's [1,16,32,128] case, for the GUI).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
ALTS=${ALTS:-turns fixed}
NCU=${NCU:-1}

nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
$PY -c "import torch, torch.utils.cpp_extension as c; print('torch', torch.__version__, 'ninja', c.is_ninja_available())"
[ -d bench/peers/wheels ] && { bash scripts/install_peers.sh > /dev/null 2>&1 || echo "peers: install failed"; }

# 1. Builds, in parallel: the checkout (double), a copy of it per alternative.
declare -A TREE=([double]=$ROOT)
BUILDS="double $ALTS"
for a in $ALTS; do
  TREE[$a]=/tmp/rope_ext_$a
  rm -rf "${TREE[$a]}" && mkdir -p "${TREE[$a]}"
  tar -C "$ROOT" --exclude=./build --exclude=./.git --exclude="./rope_ext/_C*.so" --exclude=./gpu_out -cf - . |
    tar -C "${TREE[$a]}" -xf -
done
n=$(wc -w <<< "$BUILDS")
jobs=$(( ($(nproc) + n - 1) / n ))
for a in $BUILDS; do
  (cd "${TREE[$a]}" && ROPE_EXT_ANGLE=$a MAX_JOBS=$jobs ROPE_EXT_REQUIRE_CUDA=1 \
     $PY setup.py build_ext --inplace > "$OUT/build_$a.log" 2>&1; echo "build $a: rc=$?" >> "$OUT/build_$a.log") &
done
wait
for a in $BUILDS; do cat "$OUT/build_$a.log"; done > "$OUT/build.log"; rm -f "$OUT"/build_*.log
grep "^build " "$OUT/build.log"
OK=""
for a in $BUILDS; do
  if (cd "${TREE[$a]}" && $PY -c "import rope_ext, sys; sys.exit(0 if rope_ext.WITH_CUDA else 1)") 2>/dev/null; then
    OK="$OK $a"
  else
    echo "build $a: no CUDA module (see build.log)"; grep -m5 -i "error" "$OUT/build.log"
  fi
done
stamp "built:$OK"
[ -z "$OK" ] && exit 1

# 1b. Tests on the default build, when asked (TESTS="paths").
if [[ -n ${TESTS:-} && " $OK " == *" double "* ]]; then
  xd=""; $PY -c "import xdist" 2>/dev/null && xd="-n 8"
  timeout 240 $PY -X faulthandler -m pytest -q $TESTS $xd -p no:cacheprovider > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/tests.log"
  stamp "tests done"
fi

# 2. Accuracy (long positions, against float64).
for a in $OK; do
  echo "=== ROPE_EXT_ANGLE=$a"; (cd "${TREE[$a]}" && timeout 120 $PY bench/accuracy.py 2>&1)
done > "$OUT/accuracy.txt"
cat "$OUT/accuracy.txt"
stamp "accuracy done"

# 3. Latency: rope_ext's columns for every build (100 replays a point), then the default
#    build's full suite (200 replays, torch.compile per workload: the slow part), whose
#    rope_ext columns also show how far the first pass drifted.
{
  for a in $OK; do
    echo "=== ROPE_EXT_ANGLE=$a, --rope-only"
    (cd "${TREE[$a]}" && timeout 150 $PY bench/run.py --suite latency --rope-only --graph-reps 100 2>&1 |
       grep -v "^W1\|recompile")
    stamp "latency $a"
  done
  if [[ " $OK " == *" double "* ]]; then
    echo "=== ROPE_EXT_ANGLE=double, full suite (peers)"
    timeout 300 $PY bench/run.py --suite latency 2>&1 | grep -v "^W1\|recompile"
    stamp "latency double, full"
  fi
} > "$OUT/latency.txt"
cat "$OUT/latency.txt"

# 4. ncu: one launch of the tile kernel (auto) at issue 19's small cases, caches flushed
#    before it (ncu's default --cache-control all: a cold L2, as in the latency suite).
if [[ $NCU == 1 ]] && ! command -v ncu > /dev/null; then
  ncu_bin=$(ls -d /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)
  if [[ -n $ncu_bin ]]; then PATH=$(dirname "$ncu_bin"):$PATH; else echo "ncu not found: skipped"; NCU=0; fi
fi
if [[ $NCU == 1 ]]; then
  SECTIONS="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats
            --section WarpStateStats --section InstructionStats --section ComputeWorkloadAnalysis"
  {
    for a in $OK; do
      for w in "small auto 16" "w5 auto"; do
        echo "=== ROPE_EXT_ANGLE=$a: profile_one.py $w"
        (cd "${TREE[$a]}" && timeout 90 ncu --clock-control none --kernel-name regex:rope_ --launch-skip 2 \
           --launch-count 1 $SECTIONS $PY bench/profile_one.py $w 2>&1 | grep -v "^==PROF==")
      done
      stamp "ncu $a"
    done
  } > "$OUT/ncu.txt"
  if [[ " $OK " == *" double "* ]]; then
    timeout 120 ncu --clock-control none --kernel-name regex:rope_ --launch-skip 2 --launch-count 1 --set full \
      --import-source yes -f -o "$OUT/small_double" $PY bench/profile_one.py small auto 16 > /dev/null 2>&1 ||
      echo "ncu --set full failed"
  fi
  grep -E "^=== |Duration|Registers Per|Warp Cycles Per Issued|Executed Instructions  " "$OUT/ncu.txt"
  stamp "ncu done"
fi
ls -la "$OUT"
stamp "done"
