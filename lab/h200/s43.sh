#!/usr/bin/env bash
# GPU calls of docs/PERF.md step 77 (issue 36: the 128-key window's per-task cost).
#   carry [".whl"]:  bash lab/h200/s43.sh all   (any card, no FA3): s42.sh pack's gate and
#                    timings, then the decomposition below, then s42.sh clocks, in one call
#   carry [".whl"]:  bash lab/h200/s43.sh decomp
#   carry [".whl"]:  bash lab/h200/s43.sh four    (four CTAs an SM, gated and timed; it ran with a
#                    temporary knob range, reverted since: see its variants file)
#   carry [".whl"]:  bash lab/h200/s43.sh ab      (the mask change and softmax knobs, A/B, and
#                    the GPU tests of the masks; s43.sh masks runs those tests alone)
#   carry [".whl", ".fa3/part1"]: bash lab/h200/s43.sh gates; then carry [".fa3/part2"]:
#                    bash lab/h200/s43.sh fa3rows   (the window rows beside FA3, one machine)
# decomp: lab/h200/variants/decomp_s43.txt at 1x64/8x8192:d64:w128 and :w384, the lab bounds
# (Q loaded once, O never stored, K/V one tile in 8, no softmax) beside the packed kernel.
set -uo pipefail
FIRST_CALL="s43.sh all with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
decomp() {
  for w in 128 384; do
    lab decomp_w$w.log 170 --variants-file lab/h200/variants/decomp_s43.txt \
      --shape 1x64/8x8192:d64:w$w --warmup 50 --repeat 200 --rounds 2 --settle-s 1
  done
}
# four: lab/h200/variants/four_s43.txt gated on the window and sinks gate problems of s42.sh
# pack, then timed at 1x64/8x8192:d64:w128 (and :sinks, :w64, :w384).
four() {
  local V=lab/h200/variants/four_s43.txt
  lab four_w128.log 200 --variants-file $V --shape 1x64/8x8192:d64:w128 \
    --shape 1x64/8x8192:d64:w128:sinks --warmup 50 --repeat 200 --rounds 3 --settle-s 1
  window_gate four_gate.log 150 $V
  lab four_wslope.log 150 --variants-file $V --shape 1x64/8x8192:d64:w64 \
    --shape 1x64/8x8192:d64:w384 --warmup 50 --repeat 200 --rounds 2 --settle-s 1
}
# fa3rows (after a call that carried .fa3/part1, e.g. gates): FA3 installed, then the 128-key
# window with and without sinks beside FA3 in kernel_lab (d64-window3, the new
# d64-window-packed, step 76's block_n 80 kernel), the D 256 and Mistral window rows, and the
# 128-key window through fa-tune compare.
fa3rows() {
  fa3_once
  OUT=$OUT timeout 240 $E python3 scripts/kernel_lab.py --unchecked \
    --variants-file lab/h200/variants/window_s43.txt --shape 1x64/8x8192:d64:w128 \
    --shape 1x64/8x8192:d64:w128:sinks --warmup 50 --repeat 200 --rounds 3 --settle-s 1 \
    > "$OUT/fa3_w128.log" 2>&1
  step "fa3_w128.log: exit $?"; grep -v '^  [0-9a-f]\{12\}: {' "$OUT/fa3_w128.log" | tail -n 9
  # The other window rows after the mask change: Gemma-2's local layers (d256's 80-key tiles fit
  # a window class now) and Mistral's window, each beside FA3 in kernel_lab.
  local row
  for row in "d256_window_s43.txt 1x16/8x8192:d256:w4096:cap50" "w4096_s43.txt 1x32/8x16384:w4096"; do
    set -- $row
    local v=$1 log=fa3_${1%.txt}.log left=$((570 - (SECONDS - t0))); shift
    [ $left -gt 60 ] || { step "$log: no time left"; continue; }
    local shapes=(); for x in "$@"; do shapes+=(--shape "$x"); done
    OUT=$OUT timeout $((left < 150 ? left : 150)) $E python3 scripts/kernel_lab.py \
      --variants-file lab/h200/variants/$v "${shapes[@]}" --warmup 50 --repeat 200 --rounds 3 \
      --settle-s 1 > "$OUT/$log" 2>&1
    step "$log: exit $?"; grep -v '^  [0-9a-f]\{12\}: {' "$OUT/$log" | tail -n 8
  done
  for s in 1x64/8x8192:d64:w128 1x64/8x8192:d64:w128:sinks; do
    local log=cmp_$(echo "$s" | tr ':/' '__').log
    timeout 150 $E python3 -m tuner.cli compare --rounds 3 --settle-s 1 --results-dir "$DEV/cmp" \
      --preset d64-window-packed --shape "$s" --backends fa3 > "$OUT/$log" 2>&1
    step "$log: exit $?"; grep -E "TFLOPS|x FA3|rror" "$OUT/$log" | tail -4 | cut -c1-160
  done
}
# ab: lab/h200/variants/ab_s43.txt at the 128-key window with and without sinks (no FA3), then
# the packed kernels' GPU tests and tests/gpu/test_masks_gpu.py (every mask, scheduler and
# cluster kind through the gate), its kernels prebuilt on every core; masks: the latter alone.
ab() {
  lab ab_w128.log 200 --variants-file lab/h200/variants/ab_s43.txt \
    --shape 1x64/8x8192:d64:w128 --shape 1x64/8x8192:d64:w128:sinks --warmup 50 --repeat 200 \
    --rounds 3 --settle-s 1
  # The mask kernels build on every core while the packed kernels' tests run (not timed).
  (timeout 240 $E python3 lab/h200/prebuild.py masks > "$OUT/prebuild_masks.log" 2>&1) &
  gpu_tests pack_gqa_gpu.log 200 tests/gpu/test_pack_gqa_gpu.py
  wait; step "prebuild masks done"; tail -2 "$OUT/prebuild_masks.log"
  gpu_tests masks_gpu.log $((575 - (SECONDS - t0))) tests/gpu/test_masks_gpu.py
}
case "${1:?all | decomp | four | gates | fa3rows | ab | masks}" in
all)
  OUT=$OUT bash lab/h200/s42.sh pack
  decomp
  OUT=$OUT bash lab/h200/s42.sh clocks ;;
decomp) decomp ;;
four) four ;;
gates)  # the packed kernels' GPU tests (block_n 48, 80 and 144; D 64 and 128)
  gpu_tests pack_gqa_gpu.log 400 tests/gpu/test_pack_gqa_gpu.py ;;
fa3rows) fa3rows ;;
ab) ab ;;
masks)
  timeout 300 $E python3 lab/h200/prebuild.py masks > "$OUT/prebuild_masks.log" 2>&1
  step "prebuild masks: exit $?"; tail -2 "$OUT/prebuild_masks.log"
  gpu_tests masks_gpu.log $((570 - (SECONDS - t0))) tests/gpu/test_masks_gpu.py ;;
*) echo "s43.sh: unknown call '$1': all, decomp, four, gates, fa3rows, ab or masks" >&2; exit 2 ;;
esac
