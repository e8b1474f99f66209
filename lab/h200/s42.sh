#!/usr/bin/env bash
# GPU calls of docs/PERF.md step 76 (pack_gqa: a GQA group's query heads in one tile's rows).
#   carry [".whl"]:  bash lab/h200/s42.sh pack    (any card, 59 s on the H200 with its builds, no FA3)
#   carry [".whl"]:  bash lab/h200/s42.sh clocks  (task clocks of the window kernels: where a
#                    task's own 0.032 ms goes; scripts/task_clocks.py reads them)
# pack: each variant of variants/pack_s42.txt gated (the FP32 oracle, every input set) on
# uneven problems of the window class (GQA groups 8, 4, 6 and 16, MHA, queries over a longer
# cache, windows of 1 to 1000 keys), then of the sinks class, then of D 128 causal and non-causal
# without a window; timed at the 128-key window beside d64-window3.
set -uo pipefail
FIRST_CALL="s42.sh pack with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?pack | clocks}" in
pack)
  V=lab/h200/variants/pack_s42.txt
  # The window class: the timed row first, then the gate's uneven problems (short: their time
  # is not the point, one round each).
  lab pack_w128.log 200 --variants-file $V --shape 1x64/8x8192:d64:w128 \
    --warmup 50 --repeat 200 --rounds 3 --settle-s 1
  lab pack_gate_window.log 150 --variants-file $V --shape 2x32/4x1000:d64:w100 \
    --shape 1x12/3x777:k1500:d64:w300 --shape 3x6/1x513:d64:w17 --shape 1x16/16x300:d64:w64 \
    --shape 1x16/1x1000:d64:w1 --shape 1x8/1x200:d64:w1000 --warmup 2 --repeat 5 --rounds 1 \
    --settle-s 0
  grep '^{.*pack_gqa' $V > "$DEV/pack_only.txt"
  lab pack_gate_sinks.log 120 --variants-file "$DEV/pack_only.txt" \
    --shape 1x64/8x1000:d64:w128:sinks --shape 2x12/3x333:k400:d64:w50:sinks --warmup 2 \
    --repeat 5 --rounds 1 --settle-s 0
  printf '%s\n' '{"block_m": 128, "block_n": 128, "scheduler": "static", "producer_regs": 24, "consumer_regs": 240, "q_release": "after_last_qk", "q_in_regs": true, "pack_gqa": true}' \
    > "$DEV/pack_d128.txt"
  lab pack_gate_d128.log 120 --variants-file "$DEV/pack_d128.txt" --shape 1x32/8x1000 \
    --shape 2x12/4x777:k2000 --shape 1x6/1x300 --warmup 2 --repeat 5 --rounds 1 --settle-s 0
  lab pack_gate_full.log 100 --variants-file "$DEV/pack_d128.txt" --shape 1x32/8x1000:full \
    --shape 2x12/3x333:k500:full --warmup 2 --repeat 5 --rounds 1 --settle-s 0
  ;;
clocks)  # a window task's timeline: task clocks at 2, 3 and 7 tiles a task (no FA3)
  for w in 64 128 384; do
    lab clocks_w$w.log 150 --variants-file lab/h200/variants/clocks_s42.txt \
      --shape 1x64/8x8192:d64:w$w --warmup 50 --repeat 200 --rounds 2 --settle-s 1
  done
  ;;
*)
  echo "s42.sh: unknown call '$1': pack | clocks" >&2; exit 2 ;;
esac
