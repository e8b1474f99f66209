#!/usr/bin/env bash
# The kernel with less of CuTe's layout algebra (issue 38's compile time, docs/PERF.md step 53),
# before against after on the H200, in back-to-back calls on one warm machine. Two changes to
# check, each against the tree before it:
#   main          the epilogue's stmatrix by hand (o_stage.cuh); .base = ae90c71
#   wip/operands  also the operands and fragments by hand (operands.cuh); .base = main
# (`git archive REV tuner cuda_src templates search_spaces pyproject.toml
#  scripts/sass_snapshot.py | tar -x -C .base`, with the other one checked out):
#   1  carry [".whl", ".base"]   bash lab/h200/s22.sh ab
#        installs our wheels; builds every preset from both trees with all cores
#        (scripts/sass_snapshot.py), compares their SASS, gates both kernels of each preset and
#        times them A B B A in one process (scripts/ab_libs.py)
#   2  (no carry)                bash lab/h200/s22.sh tests
#        the GPU tests of the kernel's pieces: the oracle and planted bugs, every scheduler and
#        cluster kind, q_in_regs and sum_in_pv among them, varlen, the models' masks, the op
# Then issue 37's calls (lab/h200/s21.sh) on the same warm machine. Logs land in $OUT.
set -uo pipefail
FIRST_CALL=ab
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?ab|tests}" in
ab)
  [ -d .base/cuda_src ] || { echo ".base is missing: carry [\".whl\", \".base\"]"; exit 2; }
  (cd .base && PYTHONPATH="$DEV/site:$PWD" timeout 200 python3 scripts/sass_snapshot.py \
     --out "$DEV/sass-before" --cache "$DEV/cache-before" > "$OUT/ab_before.log" 2>&1)
  step "before built: exit $?"; tail -2 "$OUT/ab_before.log"
  PYTHONPATH="$DEV/site:$PWD" timeout 120 python3 scripts/sass_snapshot.py --out "$DEV/sass-after" \
    --cache "$DEV/cache-after" > "$OUT/ab_after.log" 2>&1
  step "after built: exit $?"; tail -2 "$OUT/ab_after.log"
  $E python3 scripts/sass_snapshot.py --compare "$DEV/sass-before" "$DEV/sass-after" \
    > "$OUT/sass_compare.txt" 2>&1
  cp "$DEV/sass-before/index.json" "$OUT/sass_before_index.json"
  cp "$DEV/sass-after/index.json" "$OUT/sass_after_index.json"
  timeout $((580 - (SECONDS - t0))) $E python3 scripts/ab_libs.py "$DEV/sass-before" \
    "$DEV/sass-after" --pairs 3 --settle-s 0.5 --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
  step "ab_libs exit $?"
  tail -22 "$OUT/ab.log"
  ;;
tests)
  timeout 150 $E python3 lab/h200/prebuild.py plain masks > "$OUT/prebuild.log" 2>&1
  step "prebuild exit $?"; grep -E "FAILED|local memory|built in|builds on" "$OUT/prebuild.log"
  gpu_tests kernel.log $((580 - (SECONDS - t0))) tests/gpu/test_planted_bugs_gpu.py \
    tests/gpu/test_oracle_gpu.py tests/gpu/test_schedulers_gpu.py tests/gpu/test_masks_gpu.py \
    tests/gpu/test_varlen_gpu.py tests/gpu/test_inference_op_gpu.py
  ;;
esac
step done
