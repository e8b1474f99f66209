#!/usr/bin/env bash
# Session 30's first call picks its work by the card that came (docs/PERF.md step 64):
#   call 1, carry [".whl", ".base/main", ".base/operands", ".fa3/part1"] (63 MiB):
#                                                         bash lab/h200/s30.sh start
#     H200: issue 35's preset A/B: every preset of 2b1b09c (.base/main, `git archive 2b1b09c`)
#           against HEAD (.base/operands, `git archive HEAD`, docs left out), built from each
#           tree, SASS compared, gated and timed A B B A in one process (s24.sh ab); then the
#           GPU suite in its own calls (lab/h200/suite.sh kernel|bugs|oracle|varlen|ops|peers)
#     H100: suite.sh kernel (the stream-K gates below ran in session 31: docs/PERF.md step 65)
#     (session 30's first call ran s29.sh window3 here, then the chunk rows: s30.sh chunks)
#   bash lab/h200/s30.sh chunks (carry [".fa3/part2"], after fa3_stage1.sh): the three chunk
#     rows of issue 34 with llama3 beside FA3 (fa-tune compare, 1 s settle, 50 + 3 x 200)
#   tiles cut along their keys (knob kv_split_cost: lab/patches/kv-split.patch, applied in the
#   device's copy of the tree by these calls; docs/PERF.md step 64: the first form measured
#   slower; the patch now holds the second, stream-K, not yet timed), two calls:
#   call 1, carry [".whl", ".fa3/part1"]:  bash lab/h200/s30.sh split
#     llama3 and the static preset with kv_split_cost gated on shapes whose lists cut tiles
#     (chunks, one wave, sinks + softcap, non-causal, uneven lengths, MHA), then the GPU tests
#     this session changed (the knob sample's head-clustered config)
#   carry [".whl"]:  bash lab/h200/s30.sh softcap64
#     d64-window against d64-window3 at D 64 softcap classes, with and without a 128-key window
#     (no FA3; 1 s settle, 50 + 3 x 200): which becomes D 64's softcap default
#   call 2, carry [".fa3/part2"]:  bash lab/h200/s30.sh split2
#     llama3 against kv_split_cost 4 (cuts at 2048:k8192 and 512:k16384) and 8 (no cut there by
#     the model: a control) beside FA3 at the three chunk rows (kernel_lab, 1 s settle, 50 + 3 x
#     200, FA3 first and last); then generate()'s time to first token
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PRESETS_2B1B09C="baseline d256-multicast d256 d64-sumpv d64-static128 d64-static d64-wgskip
  d64-window d64 default dynamic fa3 full-multicast full-pair192 full-qregs gqa-cluster llama3
  multicast static"
V=lab/h200/variants
kv_split() { patch -p1 --forward -s < lab/patches/kv-split.patch; return 0; }
case "${1:?start | chunks | split | split2 | softcap64}" in
start)
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "card: $card"
  if [[ "$card" == *H200* ]]; then
    # shellcheck disable=SC2086
    exec bash "$LAB/s24.sh" ab $PRESETS_2B1B09C
  fi
  # An H100: the stream-K gates ran in step 65 (s30.sh split); the suite's first group instead.
  exec bash "$LAB/suite.sh" kernel
  ;;
chunks)
  FIRST_CALL="s30.sh start"
  source "$LAB/session_calls.sh"
  fa3_once
  timeout 500 $E python3 -m tuner.cli compare --preset llama3 --backends fa3 --rounds 3 \
    --settle-s 1 --results-dir "$DEV/cmp" -s 1x32/8x2048:k8192 -s 1x32/8x512:k16384 \
    -s 4x32/8x1024:k4096 > "$OUT/chunks_compare.log" 2>&1
  step "compare exit $?"; grep -E "x FA3|TFLOPS|rror|gate" "$OUT/chunks_compare.log" | tail -12
  ;;
split)
  FIRST_CALL="s30.sh split with .whl"
  source "$LAB/session_calls.sh"
  kv_split
  quick=(--no-fa3 --warmup 1 --repeat 2 --rounds 1 --settle-s 0 --jobs "$(nproc)")
  timeout 240 $E python3 scripts/kernel_lab.py --variants-file $V/split_s30.txt "${quick[@]}" \
    --shape 1x32/8x2048:k8192 --shape 1x32/8x512:k16384 --shape 4x32/8x1024:k4096 \
    --shape 1x32/8x1000:k7001 > "$OUT/split_gate.log" 2>&1
  step "gate llama3 +split: exit $?"; grep -cE "'gate': 'ok'" "$OUT/split_gate.log"
  grep -E "FAIL|rror" "$OUT/split_gate.log" | cut -c1-300 || echo "all passed"
  # One problem class per kernel_lab run (a library serves one): plain, sinks + softcap,
  # non-causal.
  for shapes in "2x16x1500:k6000 1x16x512:k16384" "1x32x512:k4096:sinks:cap50 1x16x300:k4096:sinks:cap50" \
                "1x32/8x512:k16384:full"; do
    args=(); for sh in $shapes; do args+=(--shape "$sh"); done
    timeout 100 $E python3 scripts/kernel_lab.py --variants-file $V/split_gate_s30.txt \
      "${quick[@]}" "${args[@]}" >> "$OUT/split_gate2.log" 2>&1
  done
  step "gate sinks, softcap, MHA: exit $?"; grep -cE "'gate': 'ok'" "$OUT/split_gate2.log"
  grep -E "FAIL|rror" "$OUT/split_gate2.log" | cut -c1-300 || echo "all passed"
  gpu_tests knob_sample.log 120 tests/gpu/test_knob_sample_gpu.py
  ;;
softcap64)
  FIRST_CALL="s30.sh softcap64 with .whl"
  source "$LAB/session_calls.sh"
  for shape in 1x64/8x8192:d64:cap50 1x64/8x8192:d64:w128:cap50; do
    timeout 200 $E python3 scripts/kernel_lab.py --variant d64-window --variant d64-window3 \
      --no-fa3 --shape "$shape" --warmup 50 --repeat 200 --rounds 3 --settle-s 1 \
      --jobs "$(nproc)" > "$OUT/softcap64_${shape//[:\/]/_}.log" 2>&1
    step "$shape: exit $?"; tail -n 3 "$OUT/softcap64_${shape//[:\/]/_}.log"
  done
  ;;
split2)
  FIRST_CALL="s30.sh split"
  source "$LAB/session_calls.sh"
  kv_split
  fa3_once
  OUT=$OUT timeout 300 $E python3 scripts/kernel_lab.py --variants-file $V/split_s30.txt \
    --shape 1x32/8x2048:k8192 --shape 1x32/8x512:k16384 --shape 4x32/8x1024:k4096 \
    --warmup 50 --repeat 200 --rounds 3 --settle-s 1 > "$OUT/split_lab.log" 2>&1
  step "lab: exit $?"; grep -v '^  [0-9a-f]\{12\}: {' "$OUT/split_lab.log" | tail -n 24
  gpu_tests hf_generate.log $((560 - (SECONDS - t0))) tests/gpu/test_hf_generate_gpu.py \
    -k generate_matches
  grep -E "time to first token" "$OUT/hf_generate.log"
  ;;
  *)
  echo "s30.sh: unknown call '$1': start, chunks, split, split2 or softcap64" >&2; exit 2 ;;
esac
