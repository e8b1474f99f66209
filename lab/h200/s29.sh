#!/usr/bin/env bash
# Session 29's first call picks its work by the card that came (docs/PERF.md step 63):
#   call 1, carry [".whl", ".fa3/part1"]:  bash lab/h200/s29.sh start
#       H200: the chunk row's search (issue 34), chained on by s28.sh next as PERF's next steps say
#       H100: the 128-key window's round 7 built (lab/h200/variants/w128_s29.txt, three-ctas.patch
#             applied in the device's copy of the tree)
#   call 2 on an H100, carry [".fa3/part2"]:  bash lab/h200/s29.sh w128
#       round 7 gated on uneven shapes and timed beside FA3 (s28.sh w128)
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
three_ctas() {  # each call re-copies the tree, so the patch goes on again (idempotent)
  patch -p1 --forward -s < lab/patches/three-ctas.patch > /dev/null 2>&1 \
    || patch -p1 -R --dry-run -s < lab/patches/three-ctas.patch > /dev/null 2>&1 \
    || { echo "three-ctas.patch does not apply"; exit 1; }
}
export W128_VARIANTS=lab/h200/variants/w128_s29.txt W128_UNCHECKED=1
case "${1:?start | w128}" in
start)
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "card: $card"
  if [[ "$card" == *H200* ]]; then
    exec bash "$LAB/gpu_session.sh" search-start h-chunk 300s --shape 1x32/8x2048:k8192
  fi
  FIRST_CALL="s29.sh start"
  source "$LAB/session_calls.sh"
  three_ctas
  timeout 400 $E python3 scripts/kernel_lab.py --variants-file "$W128_VARIANTS" \
    --shape 1x64/8x8192:d64:w128:sinks --build-only --jobs "$(nproc)" --unchecked \
    > "$OUT/w128_build.log" 2>&1
  step "built: exit $?"; grep -E "not built|built|local" "$OUT/w128_build.log" | tail -8
  ;;
w128)
  three_ctas
  bash "$LAB/s28.sh" w128
  ;;
esac
