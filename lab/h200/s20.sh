#!/usr/bin/env bash
# Session 20's GPU work: what session 19 (CPU only) left ready, in three back-to-back calls on
# one warm machine (30 s idle limit), each under the 600 s call limit.
#   1  carry [".whl"]        bash lab/h200/s20.sh build-accuracy
#        installs fa-tune's wheels; builds every kernel the GPU tests below need with all cores
#        (lab/h200/prebuild.py plain masks); issue 35: `fa-tune run`, the oracle's GPU tests and
#        the planted bugs (after which accuracy.FA_RULE_GATES can gate)
#   2  carry [".fa3/part1"]  bash lab/h200/s20.sh masks
#        parks FA3's first half; issue 36: the oracle's mask references, the kernel's masks
#        through the gate (every scheduler and cluster kind, planted bugs 9 and 10), softcap's
#        two tanh forms
#   masks-again, carry [".whl"], on a fresh machine: the kernel's masks through the gate and
#        softcap's two forms at D 128 and D 256, after the fixes the first round asked for
#   3  carry [".fa3/part2"]  bash lab/h200/s20.sh fa3
#        installs FA3; issue 36's table (compare, same inputs, gated); FA3 through the mask gate;
#        compare's GPU tests; issue 34's chunked-prefill rows
# Logs land in $OUT; a call on a fresh machine (the last one was taken back) says what is missing.
set -uo pipefail
FIRST_CALL=build-accuracy
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?build-accuracy|masks|fa3}" in
build-accuracy)
  timeout 240 $E python3 lab/h200/prebuild.py plain masks > "$OUT/prebuild.log" 2>&1
  step "prebuild exit $?"; grep -E "FAILED|local memory|built in|builds on" "$OUT/prebuild.log"
  timeout 60 $E python3 -m tuner.cli run --preset llama3 --shape 2x8/2x1000 --shape 1x32/8x4096 \
    > "$OUT/run.log" 2>&1; step "fa-tune run exit $?"; tail -8 "$OUT/run.log"
  gpu_tests accuracy.log $((570 - (SECONDS - t0))) tests/gpu/test_oracle_gpu.py \
    tests/gpu/test_planted_bugs_gpu.py
  ;;
masks)
  [ -d .fa3/part1 ] && bash lab/h200/fa3_stage1.sh > "$OUT/fa3_stage1.log" 2>&1
  gpu_tests masks.log 380 tests/gpu/test_masks_gpu.py tests/gpu/test_oracle_masks_gpu.py
  grep -E "^bug " "$OUT/masks.log"
  timeout 120 $E python3 lab/h200/softcap_forms.py --preset default --shape 1x16/8x8192 \
    > "$OUT/softcap_forms.log" 2>&1; step "softcap forms exit $?"; tail -4 "$OUT/softcap_forms.log"
  ;;
masks-again)  # a fresh machine after the fixes, carry [".whl"]: the kernel's masks only
  timeout 100 $E python3 lab/h200/prebuild.py masks > "$OUT/prebuild.log" 2>&1
  step "prebuild exit $?"; grep -E "FAILED|local memory|built in|builds on" "$OUT/prebuild.log"
  gpu_tests masks.log 140 tests/gpu/test_masks_gpu.py
  grep -E "^bug |FAIL" "$OUT/masks.log" | head -20
  for a in "default 1x16/8x8192" "d256 1x16/8x8192:d256"; do
    set -- $a
    timeout 40 $E python3 lab/h200/softcap_forms.py --preset "$1" \
      --shape "$2" > "$OUT/softcap_$1.log" 2>&1; step "softcap forms $1 exit $?"; tail -3 "$OUT/softcap_$1.log"
  done
  ;;
fa3)
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; exit 3; }
  for spec in "default 1x32/8x16384:w4096" "d64 1x64/8x8192:d64:w128" "d64 1x64/8x8192:d64:w128:sinks" \
              "d64 1x64/8x8192:d64:sinks" "d64 1x64/8x8192:d64" "d256 1x16/8x8192:d256:cap50" \
              "d256 1x16/8x8192:d256"; do
    set -- $spec
    log="cmp_$1_${2//[:\/]/_}.log"
    timeout 70 $E python3 -m tuner.cli compare --preset "$1" --shape "$2" --backends fa3 \
      --results-dir "$DEV/cmp" > "$OUT/$log" 2>&1
    step "compare $1 $2 exit $?"; tail -5 "$OUT/$log"
  done
  gpu_tests fa3_tests.log $((560 - (SECONDS - t0))) tests/gpu/test_oracle_masks_gpu.py \
    tests/gpu/test_compare_gpu.py
  ;;
esac
step done
