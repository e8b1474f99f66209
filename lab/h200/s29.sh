#!/usr/bin/env bash
# Session 29's first call picks its work by the card that came (docs/PERF.md step 63):
#   call 1, carry [".whl", ".fa3/part1"]:  bash lab/h200/s29.sh start
#       H200: the chunk row's search (issue 34), chained on by s28.sh next as PERF's next steps say
#       H100: builds the 2- and 4-head clusters at D 64 (lab/h200/variants/d64_hc_s29.txt), then
#             the 128-key window's round 7 (w128_s29.txt, three-ctas.patch applied in the
#             device's copy of the tree)
#   call 2 on an H100, carry [".fa3/part2"]:  bash lab/h200/s29.sh d64hc
#       the D 64 head clusters gated on uneven GQA shapes, then timed beside FA3 at gpt-oss's
#       full layers (1x64/8x8192:d64 with and without sinks; 1 s settle, 50 + 3 x 200)
#   call 3:  bash lab/h200/s29.sh w128
#       round 7 gated on uneven shapes and timed beside FA3 (s28.sh w128)
#   bash lab/h200/s29.sh window3 (carry [".whl"] on a fresh machine): the three-CTA d64-window
#       gated on every D 64 class it serves
#   any card, carry [".base/s29"] (and ".whl" on a fresh machine):  bash lab/h200/s29.sh chunks
#       (BASE=.base/lists with carry [".base/lists"]: step 86's lists, before = 1e2177a)
#       the static scheduler's task lists before and after chunks were dealt without pairs
#       (.base/s29/before = git archive 6808ab2, .base/s29/after = a later commit with the same lists, docs left out):
#       llama3 and static built from each tree, SASS compared (host code only changed), then
#       timed A B B A in one process (scripts/ab_libs.py) at the chunk rows and two short
#       prefills (lists 0.76-0.96 -> 0.97-0.99 balanced by the cost model; the last row's
#       lists are the same in both: a control)
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
three_ctas() {  # landed in step 63 (this session's calls ran with the patch applied)
  [ -f lab/patches/three-ctas.patch ] && patch -p1 --forward -s < lab/patches/three-ctas.patch
  return 0
}
HC=lab/h200/variants/d64_hc_s29.txt
export W128_VARIANTS=lab/h200/variants/w128_s29.txt W128_UNCHECKED=1
case "${1:?start | d64hc | w128 | chunks | window3}" in
start)
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "card: $card"
  if [[ "$card" == *H200* ]]; then
    exec bash "$LAB/gpu_session.sh" search-start h-chunk 240s --shape 1x32/8x2048:k8192
  fi
  FIRST_CALL="s29.sh start"
  source "$LAB/session_calls.sh"
  timeout 200 $E python3 scripts/kernel_lab.py --variants-file "$HC" \
    --shape 1x64/8x8192:d64:sinks --build-only --jobs "$(nproc)" > "$OUT/d64hc_build.log" 2>&1
  step "d64hc built: exit $?"; grep -E "not built|built|local" "$OUT/d64hc_build.log" | tail -6
  three_ctas
  timeout 300 $E python3 scripts/kernel_lab.py --variants-file "$W128_VARIANTS" \
    --shape 1x64/8x8192:d64:w128:sinks --build-only --jobs "$(nproc)" --unchecked \
    > "$OUT/w128_build.log" 2>&1
  step "built: exit $?"; grep -E "not built|built|local" "$OUT/w128_build.log" | tail -8
  ;;
d64hc)
  FIRST_CALL="s29.sh start"
  source "$LAB/session_calls.sh"
  fa3_once
  # Gate on GQA shapes no tile divides (group 8 as gpt-oss, group 4; S_q < S_k), then time.
  timeout 150 $E python3 scripts/kernel_lab.py --variants-file "$HC" --no-fa3 \
    --shape 2x16/2x1000:d64:sinks --shape 1x8/2x77:k300:d64:sinks --shape 1x16/2x2000:d64 \
    --warmup 1 --repeat 2 --rounds 1 --settle-s 0 > "$OUT/d64hc_gate.log" 2>&1
  step "gate: exit $?"; grep -E "FAIL|rror" "$OUT/d64hc_gate.log" | cut -c1-240 || echo "all passed"
  OUT=$OUT timeout 300 $E python3 scripts/kernel_lab.py --variants-file "$HC" \
    --shape 1x64/8x8192:d64 --shape 1x64/8x8192:d64:sinks \
    --warmup 50 --repeat 200 --rounds 3 --settle-s 1 > "$OUT/d64hc_lab.log" 2>&1
  step "lab: exit $?"; grep -v '^  [0-9a-f]\{12\}: {' "$OUT/d64hc_lab.log" | tail -n 22
  ;;
chunks)
  FIRST_CALL="s29.sh chunks with .whl"
  source "$LAB/session_calls.sh"
  BASE=${BASE:-.base/s29}  # another pair of trees: BASE=.base/lists (docs/PERF.md step 86)
  mkdir -p "$DEV/chunks"
  rows=(1x32/8x2048:k8192 4x32/8x1024:k4096 1x32/8x2048 2x32/8x1024 1x32/8x512:k16384)
  for tree in before after; do
    (cd "$BASE/$tree" && for i in "${!rows[@]}"; do
       PYTHONPATH="$DEV/site:$PWD" timeout 240 python3 scripts/sass_snapshot.py --fixed \
         --shape "${rows[$i]}" --out "$DEV/ch-$tree-$i" --cache "$DEV/chcache-$tree" llama3 static \
         > "$DEV/chunks/build_${tree}_$i.log" 2>&1 || echo "$tree ${rows[$i]}: build exit $?"
     done; echo "$tree built") &
  done
  wait; step built
  $E python3 scripts/sass_snapshot.py --compare "$DEV/ch-before-0" "$DEV/ch-after-0" | tail -3
  for i in "${!rows[@]}"; do
    timeout 100 $E python3 scripts/ab_libs.py "$DEV/ch-before-$i" "$DEV/ch-after-$i" --pairs 3 \
      --settle-s 0.5 --json "$DEV/chunks/ab_$i.json" > "$DEV/chunks/ab_$i.log" 2>&1
    step "${rows[$i]}: ab exit $?"; tail -4 "$DEV/chunks/ab_$i.log"
  done
  (cd "$DEV" && tar -cJf "$OUT/chunks.tar.xz" chunks)
  ;;
window3)
  # carry [".whl"] on a fresh machine: d64-window at three CTAs (step 63) gated on every D 64
  # class it serves: paged, packed, fixed, uneven, S_q < S_k, MQA; softcap (exact and approx)
  FIRST_CALL="s29.sh window3 with .whl"
  source "$LAB/session_calls.sh"
  A=(--shape "4x8/2x1000:k3000:d64:w128:sinks:p16" --shape "2x8/2x1500:k2000:d64:w128:p64"
     --shape "64/8x[2048,1000,77:300]:d64:w128:sinks:p64" --shape 2x16/2x1000:d64:w128:sinks
     --shape 1x3x1152:d64:w128 --shape 1x2/1x77:k300:d64:w128:sinks --shape 2x8/1x1111:d64)
  B=(--shape "2x8/2x1500:d64:cap50:w128:sinks" --shape "8/2x[1500,700:900]:d64:cap50:w128:sinks"
     --shape 2x8/1x1111:d64:cap50)
  approx='{"block_m": 64, "block_n": 64, "pingpong": false, "k_stages": 3, "v_stages": 3, "scheduler": "dynamic", "producer_regs": 24, "consumer_regs": 136, "ctas_per_sm": 3, "q_release": "after_last_qk", "early_next_qk": true, "q_in_regs": true, "softcap_tanh": "approx"}'
  quick=(--no-fa3 --warmup 1 --repeat 2 --rounds 1 --settle-s 0 --jobs "$(nproc)")
  timeout 250 $E python3 scripts/kernel_lab.py --variant d64-window3 "${quick[@]}" "${A[@]}" \
    > "$OUT/window3_a.log" 2>&1
  step "paged/packed/fixed: exit $?"; grep -cE "'gate': 'ok'" "$OUT/window3_a.log"
  grep -E "FAIL|rror" "$OUT/window3_a.log" | cut -c1-240 || echo "all passed"
  timeout 250 $E python3 scripts/kernel_lab.py --variant d64-window3 --variant "$approx" \
    "${quick[@]}" "${B[@]}" > "$OUT/window3_b.log" 2>&1
  step "softcap: exit $?"; grep -cE "'gate': 'ok'" "$OUT/window3_b.log"
  grep -E "FAIL|rror" "$OUT/window3_b.log" | cut -c1-240 || echo "all passed"
  ;;
w128)
  three_ctas
  bash "$LAB/s28.sh" w128
  ;;
esac
