#!/usr/bin/env bash
# compute-sanitizer over the CUDA kernel tests: memcheck, racecheck, initcheck.
# The script fails unless every tool reports 0 errors (and racecheck 0 hazards).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
SAN=${SANITIZER:-compute-sanitizer}
TESTS=${SANITIZE_TESTS:-"tests/test_kernels.py tests/test_options.py tests/test_validation.py tests/test_module_graphs.py"}
# CUDA cases only (opcheck/compile are dispatcher tests, not kernel tests); every
# variant, layout, view and option; not the 2.2e9-element test (minutes under the
# sanitizer: it runs in the plain suite). Narrow it with SANITIZE_SELECT, e.g.
# "cuda and (tile or auto) and not 2_31" (test ids name the variant, not the dtype).
export ROPE_EXT_SANITIZER=1  # tests/test_kernels.py cuda_kernels_of: no profiler under the sanitizer
SEL=${SANITIZE_SELECT:-"cuda and not 2_31"}
rc=0
for tool in ${SANITIZE_TOOLS:-memcheck racecheck initcheck}; do
  extra=""
  [[ $tool == memcheck ]] && extra="--leak-check no"
  # initcheck: PyTorch's caching allocator hands out memory it never initialised for
  # empty_like outputs; only reads of uninitialised memory are reported, which is what we want.
  out=$(timeout ${SANITIZE_TIMEOUT:-170} $SAN --tool $tool $extra --error-exitcode 0 \
        $PY -m pytest -q -x -p no:cacheprovider $TESTS -k "$SEL" 2>&1)
  # memcheck/initcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: N hazards
  # displayed (E errors, W warnings)".
  summary=$(echo "$out" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tail -1)
  result=$(echo "$out" | grep -E "passed|failed" | tail -1)
  echo "$tool: ${summary:-no summary} | pytest: ${result}"
  echo "$out" | grep -E "^=+ (Invalid|Race|Uninitialized)" | head -5
  n=$(echo "$summary" | grep -oE "[0-9]+ errors?" | grep -oE "[0-9]+" | head -1)
  hz=$(echo "$summary" | grep -oE "[0-9]+ hazards" | grep -oE "[0-9]+")
  [[ -z "$n" || "$n" != "0" || ( -n "$hz" && "$hz" != "0" ) ]] && rc=1
  # A selection that ran no test proves nothing: fail it.
  [[ "$result" != *passed* || "$result" == *failed* ]] && { echo "$tool: no passing pytest run"; rc=1; }
done
exit $rc
