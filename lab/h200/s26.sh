#!/usr/bin/env bash
# kv_walk (docs/PERF.md step 60; issue 36's 128-key window at D 64) on one warm machine:
#   carry [".whl"]  bash lab/h200/s26.sh walk
#       first the walking kernels' GPU tests under a short timeout (a ring protocol slip hangs
#       rather than fails: compute-sanitizer then, `s26.sh sanitize`), then
#       lab/h200/variants/w128_d64_walk.txt timed beside d64-window at
#       `1x64/8x8192:d64:w128`, with and without sinks (kernel_lab, 1 s settle, 50 + 2 x 200,
#       no FA3: `s26.sh peers` after fa3_stage1.sh / .fa3/part2 times the best beside FA3).
#   carry [".whl"]  bash lab/h200/s26.sh sanitize
#       compute-sanitizer (racecheck off; memcheck, then synccheck) on one walking kernel's
#       gate at 1x16/2x1000:d64:w128.
#   carry [".whl"]  bash lab/h200/s26.sh softcap
#       softcap's exact form and tanh.approx gated on seed, rising and peaky (scores spread to
#       the cap) and timed, at D 128 and D 256 (lab/h200/softcap_forms.py, about 3 min).
#   carry [".fa3/part2"] after fa3_stage1.sh: bash lab/h200/s26.sh peers VARIANT_JSON
#       FA3 installed, then d64-window and VARIANT timed beside FA3 at both shapes.
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL="walk"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
W128="--shape 1x64/8x8192:d64:w128 --shape 1x64/8x8192:d64:w128:sinks"
case "${1:?walk|sanitize|softcap|peers VARIANT}" in
walk)
  gpu_tests walk_tests.log 240 tests/gpu/test_kv_walk_gpu.py
  timeout $((570 - (SECONDS - t0))) $E python3 scripts/kernel_lab.py \
    --variants-file lab/h200/variants/w128_d64_walk.txt $W128 --no-fa3 --rounds 2 \
    --settle-s 1 > "$OUT/walk.log" 2>&1
  step "walk exit $?"; tail -20 "$OUT/walk.log" | cut -c1-200
  ;;
sanitize)
  for tool in memcheck synccheck; do
    timeout 250 $E compute-sanitizer --tool $tool python3 -m pytest -q -m gpu -p no:cacheprovider \
      "tests/gpu/test_kv_walk_gpu.py::test_walking_kernels_pass_the_gate[walk8-1x16/2x1000:d64:w128]" \
      > "$OUT/sanitize_$tool.log" 2>&1
    step "$tool exit $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitize_$tool.log" | tail -3
  done
  ;;
softcap)
  for spec in "default 1x16/8x8192" "d256 1x16/8x8192:d256"; do
    set -- $spec
    timeout 280 $E python3 lab/h200/softcap_forms.py --preset "$1" --shape "$2" \
      > "$OUT/softcap_$1.log" 2>&1
    step "softcap $1 exit $?"; tail -4 "$OUT/softcap_$1.log" | cut -c1-220
  done
  ;;
peers)
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; exit 3; }
  timeout 540 $E python3 scripts/kernel_lab.py --variant d64-window --variant "${2:?variant}" \
    $W128 --rounds 2 --settle-s 1 > "$OUT/walk_peers.log" 2>&1
  step "peers exit $?"; tail -10 "$OUT/walk_peers.log" | cut -c1-200
  ;;
esac
step done
