#!/usr/bin/env bash
# Issue 37's varlen gap (docs/PERF.md step 55): the device-scheduled kernel ran
# 4x32/8x2048:k8192 9-10% slower than the fixed-length one (H100, step 54). One call:
#   carry [".whl", ".base"]   bash lab/h200/s23.sh gap [BEFORE]
#     BEFORE (default .base/main): the tree before the change (`git archive HEAD tuner cuda_src
#     templates search_spaces pyproject.toml scripts | tar -x -C .base/main`, then this
#     checkout's scripts/sass_snapshot.py copied in). Builds llama3 and default from both trees
#     for a packed and a paged batch (scripts/sass_snapshot.py --shape), gates and times them
#     A B B A in one process (scripts/ab_libs.py); then this checkout's fixed-length kernel
#     beside its paged one in one process (fa-tune run), and ncu on the packed kernel.
#   carry [".fa3/part1"]      bash lab/h200/s23.sh w128 [VARIANTS]
#     parks FA3's first half; issue 36's 128-key window at D 64: the tile shapes of VARIANTS
#     (default lab/h200/variants/w128_d64.txt; round 2: w128_d64b.txt), built with all cores,
#     gated and timed in one process (scripts/kernel_lab.py, no FA3).
#   carry [".fa3/part2"]      bash lab/h200/s23.sh peers [VARIANT...]
#     installs FA3; issue 37's table (fa-tune compare --backends fa3 at pages of 64, 128, 256,
#     unpaged, and the mixed batch over pages), issue 34's chunked-prefill rows, and the given
#     w128 variants (JSON or preset names) beside FA3 (kernel_lab).
#   carry [".whl"]            bash lab/h200/s23.sh verify
#     the fixes after step 55's GPU run: the rising set per sequence (the oracle's GPU tests,
#     varlen), the op's C++ paged path and abi import (the op GPU files), then the mixed
#     8-prompt batch gated and timed, unpaged and over pages of 64 (fa-tune run).
set -uo pipefail
FIRST_CALL=gap
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
FIXED=4x32/8x2048:k8192
PACKED="32/8x[2048:8192*4]"
PAGED=$FIXED:p128
MIXED="32/8x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,3072:4096,6144:14336]"
case "${1:?gap|w128|peers|verify}" in
gap)
  BEFORE=$(cd "${2:-.base/main}" && pwd) AFTER=$PWD
  snap() {  # TREE NAME SHAPE
    (cd "$1" && PYTHONPATH="$DEV/site:$1" timeout 240 python3 scripts/sass_snapshot.py \
       --out "$DEV/snap-$2" --cache "$DEV/cache-$2" --shape "$3" llama3 default \
       > "$OUT/build_$2.log" 2>&1; echo "$2 built: exit $?")
  }
  snap "$BEFORE" before-packed "$PACKED" & snap "$AFTER" after-packed "$PACKED" &
  snap "$BEFORE" before-paged "$PAGED" & snap "$AFTER" after-paged "$PAGED" &
  wait; step "built"
  for kind in packed paged; do
    timeout 150 $E python3 scripts/ab_libs.py "$DEV/snap-before-$kind" "$DEV/snap-after-$kind" \
      --pairs 3 --settle-s 0.5 > "$OUT/ab_$kind.log" 2>&1
    step "ab $kind exit $?"; tail -4 "$OUT/ab_$kind.log"
  done
  for preset in llama3 default; do
    timeout 90 $E python3 -m tuner.cli run --preset $preset --shape $FIXED --shape $PAGED \
      --settle-s 1 --rounds 2 > "$OUT/run_$preset.log" 2>&1
    step "run $preset exit $?"; grep -E "TFLOPS" "$OUT/run_$preset.log" | tail -4
  done
  timeout 100 $E python3 -m tuner.cli profile --preset llama3 --shape "$PACKED" \
    > "$OUT/prof_packed.log" 2>&1
  step "profile exit $?"; grep -iE "duration|dram|l2 hit|throughput" "$OUT/prof_packed.log" | head -12
  ;;
w128)
  [ -d .fa3/part1 ] && bash lab/h200/fa3_stage1.sh > "$OUT/fa3_stage1.log" 2>&1
  timeout 500 $E python3 scripts/kernel_lab.py --variants-file "${2:-lab/h200/variants/w128_d64.txt}" \
    --shape 1x64/8x8192:d64:w128 --shape 1x64/8x8192:d64:w128:sinks --no-fa3 --rounds 2 \
    --settle-s 1 > "$OUT/w128.log" 2>&1
  step "lab exit $?"; tail -24 "$OUT/w128.log" | cut -c1-200
  ;;
verify)
  timeout 120 $E python3 lab/h200/prebuild.py paged > "$OUT/prebuild.log" 2>&1
  step "prebuild exit $?"; grep -E "FAILED|local memory|built in" "$OUT/prebuild.log"
  gpu_tests verify.log 200 tests/gpu/test_oracle_gpu.py tests/gpu/test_varlen_gpu.py \
    tests/gpu/test_varlen_op_gpu.py tests/gpu/test_paged_op_gpu.py
  for shape in "$MIXED" "$MIXED:p64"; do
    log="run_${shape//[:\/\[\],*]/_}.log"
    timeout 90 $E python3 -m tuner.cli run --preset llama3 --shape "$shape" --rounds 2 \
      --settle-s 1 > "$OUT/$log" 2>&1
    step "run $shape exit $?"; grep -E "TFLOPS|pass|FAIL|rror" "$OUT/$log" | tail -3
  done
  ;;
peers)
  shift
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; exit 3; }
  for shape in $FIXED:p64 $FIXED:p128 $FIXED:p256 $FIXED ${WITH_MIXED:+"$MIXED:p64"}; do
    log="cmp_${shape//[:\/\[\],*]/_}.log"
    timeout 80 $E python3 -m tuner.cli compare --preset llama3 --shape "$shape" --backends fa3 \
      --rounds 2 --settle-s 1 --results-dir "$DEV/cmp" > "$OUT/$log" 2>&1
    step "compare $shape exit $?"; grep -E "x FA3|TFLOPS|ms" "$OUT/$log" | tail -3
  done
  for shape in 1x32/8x2048:k8192 1x32/8x512:k16384 4x32/8x1024:k4096; do
    log="cmp_${shape//[:\/\[\],*]/_}.log"
    timeout 60 $E python3 -m tuner.cli compare --preset llama3 --shape "$shape" --backends fa3 \
      --rounds 2 --settle-s 1 --results-dir "$DEV/cmp" > "$OUT/$log" 2>&1
    step "compare $shape exit $?"; grep -E "x FA3|TFLOPS|ms" "$OUT/$log" | tail -3
  done
  if [ $# -gt 0 ]; then
    args=(); for v in "$@"; do args+=(--variant "$v"); done
    timeout $((580 - (SECONDS - t0))) $E python3 scripts/kernel_lab.py "${args[@]}" \
      --shape 1x64/8x8192:d64:w128 --shape 1x64/8x8192:d64:w128:sinks --rounds 2 \
      --settle-s 1 > "$OUT/w128_fa3.log" 2>&1
    step "w128 beside FA3 exit $?"; tail -12 "$OUT/w128_fa3.log" | cut -c1-200
  fi
  ;;
esac
step done
