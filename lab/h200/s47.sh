#!/usr/bin/env bash
# GPU calls of docs/PERF.md step 81's code (issue 36): the shared K/V preset and the per-kind
# class libraries checked on a GPU, then beside FA3. Calls back-to-back on one warm machine:
#   carry [".whl", ".fa3/part1"]:  bash lab/h200/s47.sh gates
#       the GPU tests that cover the changes: tests/gpu/test_pack_gqa_gpu.py (gates
#       d64-window-shared on the window problems), test_hf_masks_gpu.py (Gemma-2 and gpt-oss
#       libraries whose full kinds are built without the window, in transformers),
#       test_workload_ops_gpu.py; FA3's first half parked
#   carry [".fa3/part2"]:  bash lab/h200/s47.sh rows
#       FA3 installed; `fa-tune compare` at the 128-key window (with and without sinks):
#       d64-window-shared, d64-window-packed and FA3 in one process, twice (1 s settle,
#       50 + 3 x 200 launches)
#   bash lab/h200/s47.sh long   (after rows) the first D 64 seed, d64-wgskip, and d64 beside FA3
#       at gpt-oss's 32k full layer, 1x64/8x32768:d64:sinks (5 + 3 x 20 launches), twice:
#       step 81's bucket measured only d64 there (0.96x)
#   bash lab/h200/s47.sh variants   (any call after gates) variants/shared_s47.txt: more
#       warpgroups sharing a packed window tile, gated on uneven window and sinks problems,
#       then timed at the 128-key window beside the two presets (kernel_lab, no FA3)
#   then `bash lab/h200/workload.sh start gemma-2-9b 60s` and its `after` / `cmp` calls.
set -uo pipefail
FIRST_CALL="s47.sh gates with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?gates | rows | long | variants}" in
gates)
  gpu_tests pack_gqa_gpu.log 260 tests/gpu/test_pack_gqa_gpu.py
  gpu_tests hf_masks_gpu.log $((420 - (SECONDS - t0))) tests/gpu/test_hf_masks_gpu.py
  gpu_tests workload_ops_gpu.log $((575 - (SECONDS - t0))) tests/gpu/test_workload_ops_gpu.py ;;
rows)
  fa3_once
  for i in 1 2; do
    for sh in 1x64/8x8192:d64:w128 1x64/8x8192:d64:w128:sinks; do
      for pre in d64-window-shared d64-window-packed; do
        left=$((570 - (SECONDS - t0)))
        [ $left -gt 40 ] || { step "no time left ($pre $sh run $i)"; continue; }
        log=$OUT/cmp_${pre}_${sh//[:\/]/_}_$i.log
        timeout $((left < 120 ? left : 120)) $E python3 -m tuner.cli compare --preset "$pre" \
          --shape "$sh" --backends fa3 --rounds 3 --settle-s 1 > "$log" 2>&1
        step "$pre $sh run $i: exit $?"; grep -A1 "^│ fa-tune" "$log" | head -2 | cut -c1-120
      done
    done
  done ;;
long)
  fa3_once
  for i in 1 2; do
    for pre in d64-wgskip d64; do
      log=$OUT/long_${pre}_$i.log
      timeout 120 $E python3 -m tuner.cli compare --preset "$pre" --shape 1x64/8x32768:d64:sinks \
        --backends fa3 --warmup 5 --repeat 20 --rounds 3 --settle-s 1 > "$log" 2>&1
      step "$pre run $i: exit $?"; grep -A1 "^│ fa-tune" "$log" | head -2 | cut -c1-120
    done
  done ;;
variants)
  V=lab/h200/variants/shared_s47.txt
  window_gate shared_gate.log 200 $V
  lab shared_w128.log 300 --variants-file $V --shape 1x64/8x8192:d64:w128 \
    --shape 1x64/8x8192:d64:w128:sinks --warmup 50 --repeat 200 --rounds 3 --settle-s 1 ;;
*) echo "s47.sh: unknown call '$1': gates, rows, long or variants" >&2; exit 2 ;;
esac
step done
