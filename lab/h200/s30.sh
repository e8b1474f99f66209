#!/usr/bin/env bash
# Session 30's first call picks its work by the card that came (docs/PERF.md step 64):
#   call 1, carry [".whl", ".base/main", ".base/operands"]:  bash lab/h200/s30.sh start
#     H200: issue 35's preset A/B: every preset of 2b1b09c (.base/main, `git archive 2b1b09c`)
#           against HEAD (.base/operands, `git archive HEAD`, docs left out), built from each
#           tree, SASS compared, gated and timed A B B A in one process (s24.sh ab); then the
#           GPU suite in its own calls (lab/h200/suite.sh kernel|bugs|oracle|varlen|ops)
#     H100: d64-window3 gated on its packed, paged and softcap kernels (s29.sh window3); then
#           the chunk rows beside FA3 (fa3_stage1.sh with .fa3/part1; s30.sh chunks with
#           .fa3/part2)
#   bash lab/h200/s30.sh chunks (carry [".fa3/part2"], after fa3_stage1.sh): the three chunk
#     rows of issue 34 with llama3 beside FA3 (fa-tune compare, 1 s settle, 50 + 3 x 200)
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PRESETS_2B1B09C="baseline d256-multicast d256 d64-sumpv d64-static128 d64-static d64-wgskip
  d64-window d64 default dynamic fa3 full-multicast full-pair192 full-qregs gqa-cluster llama3
  multicast static"
case "${1:?start | chunks}" in
start)
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "card: $card"
  if [[ "$card" == *H200* ]]; then
    # shellcheck disable=SC2086
    exec bash "$LAB/s24.sh" ab $PRESETS_2B1B09C
  fi
  exec bash "$LAB/s29.sh" window3
  ;;
chunks)
  FIRST_CALL="s30.sh start"
  source "$LAB/session_calls.sh"
  if [ ! -f "$DEV/fa3.ok" ]; then
    FA3_SMOKE=0 bash "$LAB/fa3_stage2.sh" > "$OUT/fa3_install.log" 2>&1 \
      || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed (carry .fa3/part2)"; exit 1; }
    touch "$DEV/fa3.ok"; step "FA3 installed"
  fi
  timeout 500 $E python3 -m tuner.cli compare --preset llama3 --backends fa3 --rounds 3 \
    --settle-s 1 --results-dir "$DEV/cmp" -s 1x32/8x2048:k8192 -s 1x32/8x512:k16384 \
    -s 4x32/8x1024:k4096 > "$OUT/chunks_compare.log" 2>&1
  step "compare exit $?"; grep -E "x FA3|TFLOPS|rror|gate" "$OUT/chunks_compare.log" | tail -12
  ;;
esac
