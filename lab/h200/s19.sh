#!/usr/bin/env bash
# The GPU work session 19 (CPU only) left ready (docs/PERF.md step 50 and "Next GPU sessions").
# Each mode is one device call; carry [".whl"] (and the FA3 wheels for the fa3 modes: .fa3/part1
# through lab/h200/fa3_stage1.sh in the call before, .fa3/part2 with this one).
#   bash lab/h200/s19.sh accuracy   issue 35: `fa-tune run` with the gate's accuracy fields, the
#                                   oracle's GPU tests (its BF16-math reference against the NumPy
#                                   twin) and the planted-bug tests; then FA_RULE_GATES can be True
#   bash lab/h200/s19.sh masks      issue 36: the oracle's mask references against the NumPy twin,
#                                   the kernel's masks through the gate (every scheduler and
#                                   cluster kind), planted bugs 9 and 10, softcap's two tanh forms
#   bash lab/h200/s19.sh masks-fa3  issue 36's table: fa-tune's default preset per head dim beside
#                                   FA3 on the issue's problems (compare: same inputs, gated)
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
mkdir -p "$DEV"
OUT=${OUT:-$DEV/out}
mkdir -p "$OUT"
E="bash $LAB/gpu_session.sh env --"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
case "${1:?accuracy|masks|masks-fa3}" in
accuracy)
  timeout 100 $E python3 -m tuner.cli run --preset llama3 --shape 2x8/2x1000 --shape 1x32/8x4096 \
    > "$OUT/run.log" 2>&1; echo "fa-tune run exit $?"; tail -14 "$OUT/run.log"
  timeout 400 $E python3 -m pytest -q -m gpu -p no:cacheprovider --durations=6 \
    tests/gpu/test_oracle_gpu.py tests/gpu/test_planted_bugs_gpu.py > "$OUT/accuracy.log" 2>&1
  echo "GPU tests exit $?"; grep -E "passed|failed|FAILED|Error|s call" "$OUT/accuracy.log" | tail -14
  ;;
masks)
  timeout 500 $E python3 -m pytest -q -s -m gpu -p no:cacheprovider --durations=8 \
    tests/gpu/test_oracle_masks_gpu.py tests/gpu/test_masks_gpu.py > "$OUT/masks.log" 2>&1
  echo "GPU tests exit $?"; grep -E "passed|failed|FAILED|Error|s call|bug " "$OUT/masks.log" | tail -24
  # The softcap's two forms (EX2 + RCP, the product's; tanh.approx, a lab build), gated and timed.
  timeout 150 $E python3 lab/h200/softcap_forms.py --preset default --shape 1x16/8x8192 \
    > "$OUT/softcap_forms.log" 2>&1; echo "softcap forms exit $?"; tail -4 "$OUT/softcap_forms.log"
  ;;
masks-fa3)
  for spec in "default 1x32/8x16384:w4096" "d64 1x64/8x8192:d64:w128" "d64 1x64/8x8192:d64:w128:sinks" \
              "d64 1x64/8x8192:d64:sinks" "d256 1x16/8x8192:d256:cap50"; do
    set -- $spec
    timeout 110 $E python3 -m tuner.cli compare --preset "$1" --shape "$2" --backends fa3 \
      --results-dir "$OUT/cmp" > "$OUT/cmp_$1_${2//[:\/]/_}.log" 2>&1
    echo "compare $1 $2 exit $?"; tail -6 "$OUT/cmp_$1_${2//[:\/]/_}.log"
  done
  ;;
esac
