#!/usr/bin/env bash
# Session 23's GPU work (docs/PERF.md step 56), back-to-back calls on one warm machine (30 s
# idle limit), each under the 600 s call limit:
#   1  carry [".whl"]        bash lab/h200/s24.sh start
#        step 55's unrun checks (the GPU tests of lab/h200/s23.sh verify: the rising set per
#        sequence, the op's C++ paged path), then a 6-minute search of issue 34's chunk
#        row (1x32/8x2048:k8192) in the background (lab/h200/gpu_session.sh search-start)
#   2  carry [".fi"]         bash lab/h200/s24.sh fi
#        installs FlashInfer and JIT-builds its D 128 prefill module while the search runs
#   3  carry [".fa3/part1"]  bash lab/h200/fa3_stage1.sh
#   4  carry [".fa3/part2"]  bash lab/h200/gpu_session.sh search-wait s24-chunk
#        installs FA3, waits for the search
#   5  (no carry)            bash lab/h200/s24.sh peers
#        the search's best beside FA3 (fa-tune compare --study); issue 37's mixed batch over
#        pages of 64 beside FA3
#   6  (no carry)            bash lab/h200/s24.sh fipeers
#        issue 37's table at pages of 64, 128, 256 beside FA3 and FlashInfer in one process
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL=start
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
STUDY=s24-chunk
FIXED=4x32/8x2048:k8192
MIXED="32/8x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,3072:4096,6144:14336]"
compare() {  # LOG TIMEOUT ARGS...
  local log=$1 limit=$2; shift 2
  timeout "$limit" $E python3 -m tuner.cli compare --rounds 2 --settle-s 1 \
    --results-dir "$DEV/cmp" "$@" > "$OUT/$log" 2>&1
  step "compare $log exit $?"; grep -E "x FA3|x FlashInfer|TFLOPS|rror" "$OUT/$log" | tail -5
}
case "${1:?start|fi|peers|fipeers}" in
start)
  timeout 120 $E python3 lab/h200/prebuild.py paged > "$OUT/prebuild.log" 2>&1
  step "prebuild exit $?"; grep -E "FAILED|local memory|built in" "$OUT/prebuild.log"
  gpu_tests verify.log 240 tests/gpu/test_oracle_gpu.py tests/gpu/test_varlen_gpu.py \
    tests/gpu/test_varlen_op_gpu.py tests/gpu/test_paged_op_gpu.py
  bash "$LAB/gpu_session.sh" search-start $STUDY 6m --shape 1x32/8x2048:k8192
  ;;
fi)
  FI_SMOKE=1 timeout 560 bash "$LAB/flashinfer_stage.sh" > "$OUT/fi_stage.log" 2>&1
  step "flashinfer stage exit $?"; tail -5 "$OUT/fi_stage.log"
  ;;
peers)
  compare cmp_study.log 200 --study $STUDY --backends fa3
  compare cmp_mixed_p64.log 120 --preset llama3 --shape "$MIXED:p64" --backends fa3
  ;;
fipeers)
  for p in 64 128 256; do
    compare "cmp_p$p.log" 150 --preset llama3 --shape "$FIXED:p$p" --backends fa3,flashinfer
  done
  ;;
esac
step done
