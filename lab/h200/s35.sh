#!/usr/bin/env bash
# Session 35's GPU calls (docs/PERF.md step 67), back-to-back on one warm machine (30 s idle).
# The first call picks its work by the card that came:
#   call 1, carry [".whl", ".fi", "studies/twin1.db"]:
#           bash lab/h200/s35.sh start [GROUPS]
#     H200: FlashInfer installed and its D 128 prefill module built (issue 37), the GPU suite's
#           GROUPS (default "kernel": suite.sh's groups; "none") meanwhile in the background (logs in
#           .device/bgsuite); the call ends with them
#     H100: s42.sh pack (step 76's packed GQA tile, gated and timed beside d64-window3)
# H200, then:
#   call 2, carry [".fa3/part1"]: bash lab/h200/fa3_stage1.sh
#   call 3, carry [".fa3/part2"]: bash lab/h200/s35.sh peers   (issue 37's table on a quiet card:
#                                 FA3 installed; pages of 64, 128, 256, unpaged, the mixed batch,
#                                 pages of 16;
#                                 again in a call of its own for the rows the first left)
# A short window (under 15 device minutes), issue 34:
#   call 1, carry [".whl", ".fa3/part1", "studies/twin1.db"]: bash lab/h200/s35.sh start34
#           (the malformed-metadata GPU tests; on an H100 s40.sh hostopt instead)
#   call 2, carry [".fa3/part2"]: bash lab/h200/s35.sh rows34   (the rows beside FA3: chunked
#                                 prefill 2048:k8192, 512:k16384, 4x 1024:k4096; fused QKV views)
#   then suite.sh bugs, oracle, varlen, ops, peers; issue 35's A/B: s30.sh start (carry .whl, .base/main, .base/operands)
# H100 (step 67), then: s32.sh dealtests varlen-pair-swaps; fa3_stage1.sh; the paged rows
# beside FA3 (fa-tune compare, one inline call); s32.sh w128hc; suite.sh bugs, ops.
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
case "${1:?start | peers | suitewait}" in
start)
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "card: $card"
  # On an H100 nothing runs (an H200 is what this table needs; step 78): give the machine back
  # and ask again later. (Steps 76-77 ran s42.sh pack here, step 70 s37.sh ab.)
  if [[ "$card" != *H200* ]]; then echo "not an H200: nothing run"; exit 3; fi
  FIRST_CALL="s35.sh start with .whl"
  source "$LAB/session_calls.sh"
  mkdir -p "$DEV/bgsuite"; rm -f "$DEV/bgsuite.rc"
  # The suite's groups in $2 (default: kernel, about as long as FlashInfer's install) in the
  # background, one after another so their prebuilds don't fight; this call waits for them, so
  # the peers' timing that follows has a quiet card.
  groups=${2:-kernel}; [ "$groups" = none ] && groups=""
  setsid nohup bash -c "for g in $groups; do
      OUT='$DEV/bgsuite' bash '$LAB/suite.sh' \$g > '$DEV/bgsuite/call_'\$g.txt 2>&1
    done; echo done > '$DEV/bgsuite.rc'" < /dev/null > /dev/null 2>&1 &
  step "suite ($groups) started in the background"
  FI_SMOKE=1 timeout 400 bash "$LAB/flashinfer_stage.sh" > "$OUT/fi_stage.log" 2>&1
  step "flashinfer stage exit $?"; tail -4 "$OUT/fi_stage.log"
  bash "$LAB/s35.sh" suitewait $((560 - (SECONDS - t0)))
  ;;
start34)  # carry [".whl", ".fa3/part1", "studies/twin1.db"]: a short session's first call
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "card: $card"
  if [[ "$card" != *H200* ]]; then exec bash "$LAB/s40.sh" hostopt; fi
  FIRST_CALL="s35.sh start34 with .whl"
  source "$LAB/session_calls.sh"   # wheels installed, FA3's first half parked
  # Issue 34's malformed-metadata tests (cu_seqlens, cache_seqlens, block tables), each
  # followed by a call on the same CUDA context; then s35.sh rows34 with carry .fa3/part2.
  gpu_tests i34_malformed.log 300 tests/gpu/test_inference_op_gpu.py \
    tests/gpu/test_varlen_op_gpu.py tests/gpu/test_paged_gpu.py \
    -k "malformed or bad_metadata or bad_block_table"
  ;;
peers | rows34)
  FIRST_CALL="s35.sh start with .whl"
  source "$LAB/session_calls.sh"
  fa3_once
  export PYTHONPATH=$DEV/fisite:${PYTHONPATH:-} FLASHINFER_WORKSPACE_BASE=$DEV
  cmp() {  # LOG SHAPE [BACKENDS]: llama3 beside FA3 and FlashInfer, in what the call has left;
    # a row that an earlier call finished is not run again (its log is kept in .device/peers)
    if [ -f "$DEV/peers/$1.ok" ]; then step "$2: done before"; return; fi
    local left=$((575 - (SECONDS - t0)))
    [ $left -gt 60 ] || { step "$2: no time left"; return; }
    timeout $left $E python3 -m tuner.cli compare --rounds 2 --settle-s 1 --results-dir \
      "$DEV/cmp" --preset llama3 --shape "$2" --backends "${3:-fa3,flashinfer}" \
      > "$DEV/peers/$1" 2>&1
    local rc=$?; step "$2 exit $rc"; cp "$DEV/peers/$1" "$OUT/"
    [ $rc = 0 ] && touch "$DEV/peers/$1.ok"
    grep -E "TFLOPS|rror" "$OUT/$1" | tail -6 | cut -c1-160
  }
  mkdir -p "$DEV/peers"
  if [ "$1" = rows34 ]; then  # issue 34's rows: chunked prefill and the fused QKV views
    cmp i34_chunk.log 1x32/8x2048:k8192 fa3; cmp i34_long.log 1x32/8x512:k16384 fa3
    cmp i34_batch.log 4x32/8x1024:k4096 fa3; cmp i34_qkv.log 1x32/8x8192:qkv fa3
    exit 0
  fi
  FIXED=4x32/8x2048:k8192
  MIXED="32/8x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,3072:4096,6144:14336]"
  # The first paged FlashInfer call JIT-builds its paged module (step 57: over 150 s).
  cmp cmp_p64.log "$FIXED:p64"; cmp cmp_p128.log "$FIXED:p128"; cmp cmp_p256.log "$FIXED:p256"
  cmp cmp_unpaged.log "$FIXED"; cmp cmp_mixed_p64.log "$MIXED:p64"
  cmp cmp_p16.log "$FIXED:p16"  # vLLM's default page size, after step 85's page lookup
  ;;
suitewait)
  for _ in $(seq "${2:-570}"); do [ -f "$DEV/bgsuite.rc" ] && break; sleep 1; done
  echo "suite: $(cat "$DEV/bgsuite.rc" 2>/dev/null || echo still running)"
  for f in "$DEV"/bgsuite/call_*.txt; do
    echo "== $f"; grep -E "passed|failed|FAILED|exit" "$f" | tail -4
  done
  tar -cJf "${OUT:-$DEV/out}/bgsuite.tar.xz" -C "$DEV" bgsuite 2>/dev/null
  ;;
*)
  echo "s35.sh: unknown call '$1': start, start34, peers, rows34 or suitewait" >&2; exit 2 ;;
esac
