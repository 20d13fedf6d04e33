#!/usr/bin/env bash
# Surveys of the decode's automatic split plans on the GPU box (bench/decode_cold.py --sweep),
# one file per set under $OUT; bench/plan_survey.py tabulates them.
#   bash scripts/plan_survey.sh shapes      # the shapes the fifteenth session's survey left out
#   bash scripts/plan_survey.sh fp8mid      # fp8 kv-head pairs at B 3-7, 3072-8192 keys
#   bash scripts/plan_survey.sh narrow      # D 64 (bf16, fp8 pairs) and fp8 pairs at B 3-7
#   bash scripts/plan_survey.sh serving     # GQA 8, 4 query tokens, fp8 GQA 8, fp8 paged(16)
#   bash scripts/plan_survey.sh edges       # fp8 B 3 and 48 after the sixteenth session's run 3
#   bash scripts/plan_survey.sh edges2      # fp8 pairs' 512-key splits at D 64 and at 2560 keys
#   bash scripts/plan_survey.sh fp8shapes   # fp8 caches at GQA 16, MQA, D 256 and four query tokens
#   bash scripts/plan_survey.sh edges3      # fp8 pairs at B 3-4 below 4096 keys, 5-11 splits
#   bash scripts/plan_survey.sh fp8b1       # fp8 Hq 32 Hk 8 at B 1-2: clusters against the combine kernel
#   bash scripts/plan_survey.sh fp8d64one   # fp8 D 64 with one kv head per CTA (odd Hk: no pairs)
#   bash scripts/plan_survey.sh fp8few      # fp8 GQA 16 / MQA / Hk 4 at B 1-4: clusters of 16 against 32-64 splits
#   bash scripts/plan_survey.sh fp8gap      # fp8 one-head grids of 80-104 CTAs (four query tokens, GQA 16)
#   bash scripts/plan_survey.sh fp8few8     # fp8 kv-head pairs at G 8 (Hk 4; Hq 64 Hk 8) and G 4 at B 1-2
#   bash scripts/plan_survey.sh pairfit     # fp8 kv-head pairs' clusters at B 1-8 (the cluster fit rule)
#   bash scripts/plan_survey.sh reach       # where the seventeenth session's fp8 rules reach unmeasured (D 64 pairs, D 64 / 256 few CTAs)
#   bash scripts/plan_survey.sh fp8hnd      # fp8 at G 4 where pairs are not allowed: head-major caches, the one-call step
#   bash scripts/plan_survey.sh d64g4       # fp8 D 64 G 4 at B 1-2: pairs / one head, clusters / combine (run 2's misses)
#   bash scripts/plan_survey.sh fp8hnd2     # the wave rule at G 4 (head-major, the step) and past one wave of the slots (B 64)
#   bash scripts/plan_survey.sh fp8slots    # grids whose count the slots' waves (one to three) moved, head-major G 4
# (PY: the python that has rope_ext built; scripts/gpu_check.sh exports it.)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../bench"
PY=${PY:-python}
OUT=${OUT:-.}
sweep() {  # name, then decode_cold.py's arguments
  local name=$1; shift
  local t0=$(date +%s)
  $PY decode_cold.py --sweep --reps 50 "$@" > "$OUT/survey_$name.txt" 2>&1
  echo "survey $name: rc $? in $(( $(date +%s) - t0 )) s"
  grep SWEEP "$OUT/survey_$name.txt" | sed "s/^ */$name /"
}
rows() {  # file name, then decode_cold.py's arguments: rows in turns, cluster and combine (not a sweep);
  local name=$1; shift  # appends to $OUT/NAME.txt, so one file can hold several shapes
  $PY decode_cold.py --reps 50 "$@" >> "$OUT/$name.txt" 2>&1
  echo "$name: rc $? ($*)"
}
pts() {  # batch sizes, then contexts: "BxC,..."
  local out=""
  for c in $2; do for b in $1; do out+="${b}x${c},"; done; done
  echo "${out%,}"
}
S16="1,2,3,4,6,8,12,16"
S32="1,2,3,4,6,8,12,16,24,32"
for set in "$@"; do
  case $set in
    shapes)
      sweep paged16 --paged 16 --points "$(pts "3 4 5 6 8 10 12 16 20 24 32 48 64" "4096 16384")" --splits $S16
      sweep d64 --D 64 --points "$(pts "2 3 4 5 6 8 10 12 16 20 24 32 48 64" "4096 16384")" --splits $S32
      sweep gqa16 --Hk 2 --points "$(pts "4 8 12 16 24 32 48 64" "4096 16384")" --splits $S32
      sweep mqa --Hq 8 --Hk 1 --points "$(pts "8 16 24 32 48 64" "4096 16384")" --splits $S32
      sweep d256 --D 256 --Hq 16 --points "$(pts "2 4 6 8 12 16 24 32" "4096 16384")" --splits $S16
      sweep fp8d64 --fp8 --pair --D 64 --points "$(pts "3 4 6 8 12 16 24 32 48" "4096 16384")" --splits $S16 ;;
    fp8mid)
      sweep fp8mid --fp8 --pair --points "$(pts "3 4 5 6 7" "3072 4096 6144 8192")" --splits $S16 ;;
    narrow)  # the sixteenth session's rules at D 64 and fp8 pairs from B 3, with their counts
      sweep d64n --D 64 --points "$(pts "3 4 5 6 8 10 12 20 24 32 48" "4096 16384")" --splits 1,2,3,4,5,6,8,12,16
      sweep fp8d64n --fp8 --pair --D 64 --points "$(pts "3 4 6 8 12 16 24 32 48" "4096 16384")" --splits 1,2,4,5,8,11,16
      sweep fp8midn --fp8 --pair --points "$(pts "3 4 5 6 7" "3072 4096 8192")" --splits 2,4,5,6,8,10,11 ;;
    serving)  # GQA 8 (Llama 3 70B, Qwen 2.5 72B: Hq 64 Hk 8), 4 query tokens, fp8 GQA 8 and paged
      sweep gqa8 --Hq 64 --points "$(pts "2 3 4 6 8 12 16 24 32 48 64" "4096 16384")" --splits $S32
      sweep qlen4 --q-len 4 --points "$(pts "2 3 4 6 8 12 16 24 32 48 64" "4096 16384")" --splits $S32
      sweep fp8gqa8 --fp8 --pair --Hq 64 --points "$(pts "2 3 4 6 8 12 16 24 32 48" "4096 16384")" --splits $S16
      sweep fp8paged --fp8 --pair --paged 16 --points "$(pts "3 4 6 8 12 16 24 32 48 64" "4096 16384")" --splits $S16 ;;
    edges)  # fp8 B 3 (the pairs' 512-key splits) and B 48 (one wave of CTA slots) at Hq 32 / 64, paged
      sweep edges32 --fp8 --pair --points "3x3072,3x4096,3x8192,4x3072,46x4096,48x2560,48x4096,48x8192" --splits 1,2,4,6,8,11
      sweep edges64 --fp8 --pair --Hq 64 --points "3x4096,48x4096" --splits 1,2,4,6,8,11
      sweep edgesp --fp8 --pair --paged 16 --points "3x4096,48x4096" --splits 1,2,4,6,8,11 ;;
    edges2)  # the 512-key pair splits at D 64 and at 2560 keys, cluster and combine rows (not a sweep)
      rows edges2_d64 --fp8 --pair --D 64 --points 3x3072,3x4096,4x4096,6x4096 --splits 4,5,6,8,11
      rows edges2_2560 --fp8 --pair --points 3x2560,4x2560 --splits 4,5,6,8 ;;
    fp8shapes)  # fp8 shapes no survey had reached (seventeenth session); pairs need an even Hk
      sweep fp8gqa16 --fp8 --pair --Hk 2 --points "$(pts "1 2 4 8 16 32 64" "4096 16384")" --splits $S32
      sweep fp8mqa --fp8 --Hq 8 --Hk 1 --points "$(pts "1 2 8 16 32 64" "4096 16384")" --splits $S32
      sweep fp8d256 --fp8 --D 256 --Hq 16 --points "$(pts "1 2 4 8 16 32" "4096 16384")" --splits $S16
      sweep fp8qlen4 --fp8 --q-len 4 --points "$(pts "1 2 4 8 16 32 64" "4096 16384")" --splits $S32 ;;
    edges3)  # fp8 pairs at B 3-4 below 4096 keys (the 512-key floor's misses, run 6 of the sixteenth session)
      rows edges3_d64 --fp8 --pair --D 64 --points 3x2560,3x3072,4x2560,4x3072 --splits 5,6,7,8,11
      rows edges3_d128 --fp8 --pair --points 3x2560,3x3072,4x2560,4x3072 --splits 5,6,7,8,11 ;;
    fp8b1)  # one kv head per CTA at B 1-2 below 8192 keys: 8 / 16 splits in clusters and through the combine kernel
      rows fp8b1 --fp8 --points 1x2048,1x4096,1x6144,2x2048,2x4096 --splits 8,12,16 ;;
    fp8d64one)
      sweep fp8d64one --fp8 --D 64 --Hq 28 --Hk 7 --points "$(pts "4 8 16 32 64" "4096 16384")" --splits $S16 ;;
    fp8few)  # few CTAs per split over fp8 (one kv head per CTA), cluster and combine rows (not a sweep)
      for shape in "--Hk 2" "--Hq 8 --Hk 1" "--Hk 4"; do
        rows fp8few --fp8 $shape --points 1x2048,1x4096,1x8192,2x4096,2x8192,4x4096 --splits 16,24,32,64
      done ;;
    fp8gap)  # one kv head per CTA, grids between the surveyed 64 and 128 CTAs
      sweep fp8gapq4 --fp8 --q-len 4 --points "$(pts "10 13" "4096 16384")" --splits 1,2,3,4,6,7,8,12
      sweep fp8gapg16 --fp8 --Hk 2 --points "$(pts "40 52" "4096 16384")" --splits 1,2,3,4,6,7,8,12 ;;
    fp8few8)  # few pair CTAs per split at G 8 (and G 4, unchanged), cluster and combine rows (not a sweep)
      for shape in "--Hk 4" "--Hq 64" "--Hq 32"; do
        rows fp8few8 --fp8 $shape --points 1x4096,1x8192,1x16384,2x8192 --splits 16,32,64
      done ;;
    pairfit)  # kv-head pairs' clusters that do not fit one CTA per SM (B 2 ctx 8192) and the suites' B 8 ctx 2048
      rows pairfit --fp8 --pair --points 2x8192,8x2048,1x8192 --splits 4,8,16
      rows pairfit --fp8 --pair --Hq 64 --points 2x8192,4x8192 --splits 8,16 ;;
    reach)  # the cluster fit (pairs hold 8 query rows at G 4) at D 64, B 1-4; the few-CTA rule at D 64 and D 256
      rows reach_d64pair --fp8 --pair --D 64 --points 1x4096,1x8192,2x4096,2x8192,3x2560,3x3072,4x2560,4x4096 --splits 8,16,32
      rows reach_few --fp8 --pair --D 64 --Hk 4 --points 1x4096,1x8192,2x8192 --splits 16,32,64
      rows reach_few --fp8 --D 256 --Hq 16 --Hk 2 --points 1x4096,1x8192,2x8192 --splits 16,32,64
      rows reach_few --fp8 --D 64 --Hq 8 --Hk 1 --points 1x4096,1x8192,2x8192 --splits 16,32,64 ;;
    fp8hnd)  # one kv head per CTA at G 4 with one token (run 3 of the eighteenth session: the fp8 rule then)
      sweep fp8hnd --fp8 --head-major --points "$(pts "1 2 4 8 16 32 64" "4096 16384")" --splits $S16
      sweep fp8step --fp8 --step --points "$(pts "1 2 4 8 16 32 64" "4096 16384")" --splits $S16 ;;
    fp8hnd2)  # G 4 one head by the wave rule (run 4 of the eighteenth session: the slots' waves counted past one wave)
      sweep fp8hnd2 --fp8 --head-major --points "$(pts "8 16 24 32 48 64" "8192"),8x32768,64x32768" --splits 1,2,3,4,6,8
      sweep fp8hnd3 --fp8 --head-major --points "$(pts "8 16 32 64" "4096 16384")" --splits 1,2,3,4,6
      sweep fp8step2 --fp8 --step --points "$(pts "8 16 32 64" "4096 8192")" --splits 1,2,3,4,6
      sweep fp8q4b64 --fp8 --q-len 4 --points 64x4096,64x16384 --splits 2,3,4,6 ;;
    fp8slots)  # counts the slots' term moved (160 CTAs 6 -> 7, 320-352 3 -> 4, 416 2 -> 3, 832-1024 1 -> 2)
      sweep fp8slots --fp8 --head-major --points "$(pts "20 40 44 52 104 128" "4096"),20x16384,44x16384" --splits 1,2,3,4,5,6,7,8 ;;
    d64g4)
      rows d64g4 --fp8 --pair --D 64 --points 1x8192,1x16384,2x4096,2x8192 --splits 16,32 ;;
    *) echo "plan_survey.sh: unknown set $set"; exit 2 ;;
  esac
done
