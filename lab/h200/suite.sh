#!/usr/bin/env bash
# The whole GPU suite (issue 35: "the GPU suite passes on the H200") in six calls of under ten
# minutes, each a group of test files that stands alone: any call may run on a fresh machine
# (each carries .whl, or finds the wheels installed by an earlier call on the same machine).
#   carry [".whl"]:  bash lab/h200/suite.sh kernel    every preset's family (prebuild plain)
#   carry [".whl"]:  bash lab/h200/suite.sh bugs      planted bugs, schedulers, layouts (plain)
#   carry [".whl"]:  bash lab/h200/suite.sh oracle    oracle, masks, timing, run, knob sample
#                                                     (prebuild masks)
#   carry [".whl"]:  bash lab/h200/suite.sh varlen    varlen, paged, search (prebuild paged)
#   carry [".whl"]:  bash lab/h200/suite.sh ops       the torch op, exports, transformers
#   after fa3_stage1.sh / fa3_stage2.sh (and flashinfer_stage.sh):
#                    bash lab/h200/suite.sh peers     compare and the paged peers
# Each prints pytest's last lines and its slowest tests; the log lands in $OUT/suite_GROUP.log.
set -uo pipefail
FIRST_CALL="suite.sh GROUP"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
prebuild() {  # SETS...: the group's kernels built with all cores first (the tests only load)
  timeout 300 $E python3 lab/h200/prebuild.py "$@" > "$OUT/prebuild_$group.log" 2>&1
  step "prebuild $* exit $?"; grep -E "FAILED|local memory|built in|builds on" "$OUT/prebuild_$group.log"
}
group=${1:?kernel|bugs|oracle|varlen|ops|peers}
left() { echo $((575 - (SECONDS - t0))); }
G=tests/gpu
case "$group" in
kernel)
  prebuild plain
  gpu_tests "suite_$group.log" "$(left)" $G/test_family_gpu.py ;;
bugs)
  prebuild plain
  gpu_tests "suite_$group.log" "$(left)" $G/test_planted_bugs_gpu.py $G/test_schedulers_gpu.py \
    $G/test_layout_gpu.py ;;
oracle)
  prebuild masks
  gpu_tests "suite_$group.log" "$(left)" $G/test_oracle_gpu.py $G/test_oracle_masks_gpu.py \
    $G/test_masks_gpu.py $G/test_timing_gpu.py $G/test_run_gpu.py $G/test_knob_sample_gpu.py ;;
varlen)
  prebuild paged
  gpu_tests "suite_$group.log" "$(left)" $G/test_varlen_gpu.py $G/test_paged_gpu.py \
    $G/test_search_gpu.py ;;
ops)
  gpu_tests "suite_$group.log" "$(left)" $G/test_inference_op_gpu.py $G/test_varlen_op_gpu.py \
    $G/test_paged_op_gpu.py $G/test_workload_ops_gpu.py $G/test_hf_generate_gpu.py \
    $G/test_hf_masks_gpu.py ;;
peers)
  gpu_tests "suite_$group.log" "$(left)" $G/test_compare_gpu.py $G/test_paged_peers_gpu.py ;;
*)
  echo "unknown group $group: kernel, bugs, oracle, varlen, ops or peers"; exit 2 ;;
esac
step done
