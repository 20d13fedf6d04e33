#!/usr/bin/env bash
# A kernel change against its base in one GPU call: the checkout and a base revision
# built side by side, the tests on the checkout, then each bench command on both trees,
# alternating (new, base, new, base) so drift between the passes shows.
#   git archive -o build/base.tar HEAD        # here, before the call (build/ is ignored:
#                                             # carry ["build/base.tar"])
#   TESTS="tests/test_kernels.py" BENCH="bench/run.py --suite latency --rope-only --graph-reps 100" \
#     bash scripts/gpu_ab.sh
# BENCH: commands run with python from each tree's root, separated by ';'. TESTS: pytest
# paths for the checkout (none if empty). Files under $OUT: build.log, tests.log, ab.txt.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
BASE_TAR=${BASE_TAR:-build/base.tar}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
[ -f "$BASE_TAR" ] || { echo "no $BASE_TAR: git archive -o $BASE_TAR <rev> first"; exit 2; }
[ -d bench/peers/wheels ] && { bash scripts/install_peers.sh > /dev/null 2>&1 || echo "peers: install failed"; }

BASE=/tmp/rope_ext_base
rm -rf "$BASE" && mkdir -p "$BASE" && tar -C "$BASE" -xf "$BASE_TAR"
jobs=$(( ($(nproc) + 1) / 2 ))
mkdir -p "$ROOT/build" "$BASE/build"
for t in "$ROOT" "$BASE"; do
  (cd "$t" && MAX_JOBS=$jobs ROPE_EXT_REQUIRE_CUDA=1 $PY setup.py build_ext --inplace > "$t/build/ab_build.log" 2>&1
   echo "build $t: rc=$?" >> "$t/build/ab_build.log") &
done
wait
cat "$ROOT/build/ab_build.log" "$BASE/build/ab_build.log" > "$OUT/build.log"
grep "^build " "$OUT/build.log"
for t in "$ROOT" "$BASE"; do
  (cd "$t" && $PY -c "import rope_ext, sys; sys.exit(0 if rope_ext.WITH_CUDA else 1)") ||
    { echo "build $t: no CUDA module"; grep -m5 -i "error" "$OUT/build.log"; exit 1; }
done
stamp "built"

if [[ -n ${TESTS:-} ]]; then
  xd=""; $PY -c "import xdist" 2>/dev/null && xd="-n 8"
  # eval: quotes inside TESTS reach pytest whole (TESTS='tests/x.py -k "lean or append"')
  eval "timeout ${TEST_TIMEOUT:-300} $PY -X faulthandler -m pytest -q $TESTS $xd -p no:cacheprovider" > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"
  stamp "tests"
fi

IFS=';' read -ra cmds <<< "${BENCH:-}"
{
  for c in "${cmds[@]}"; do
    for pass in 1 2; do
      for side in new base; do
        t=$ROOT; [[ $side == base ]] && t=$BASE
        echo "=== $side (pass $pass): $c"
        (cd "$t" && timeout ${BENCH_TIMEOUT:-240} $PY $c 2>&1 | grep -v "^W1\|recompile")
      done
    done
  done
} > "$OUT/ab.txt"
cat "$OUT/ab.txt"
stamp "done"
