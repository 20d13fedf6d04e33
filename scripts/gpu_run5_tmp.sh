mkdir -p $OUT; source scripts/setup.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; set +e; echo "built $(date +%T)"
$PY -m pytest -q -n 8 tests/test_attention.py tests/test_fp8_mla.py tests/test_edge_cases.py tests/test_module_graphs.py -p no:cacheprovider > $OUT/tests.log 2>&1
grep -E "^(FAILED|ERROR)" $OUT/tests.log | head; tail -1 $OUT/tests.log; date +%T
$PY bench/profile_decode.py --turns append_16 append_16q append_16b append_16bp append_16bp@8 append_16f append_16f@8 append_64b append_256b 2>&1 | tee $OUT/auto.txt
M="gpu__time_duration.sum,smsp__inst_executed.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,regex:smsp__average_warps_issue_stalled_(long_scoreboard|no_instruction|imc_miss|wait|short_scoreboard|math_pipe_throttle|dispatch_stall|drain|lg_throttle|barrier|branch_resolving|selected|not_selected)_per_issue_active\.ratio"
timeout 150 ncu --profile-from-start off --cache-control all --clock-control base --metrics "$M" $PY bench/latency_floor.py --refs --ncu > $OUT/ncu_refs.txt 2>&1
grep -E "^\s+(_append|append_kv|void|rope_ext::)|gpu__time_duration|smsp__inst_executed.sum|launch__grid|launch__block_size|long_scoreboard|no_instruction|imc_miss|profiled" $OUT/ncu_refs.txt | head -120
