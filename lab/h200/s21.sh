#!/usr/bin/env bash
# Issue 37's GPU work (the paged KV cache, docs/PERF.md step 52), in back-to-back calls on one
# warm machine (30 s idle limit), each under the 600 s call limit:
#   1  carry [".whl"]        bash lab/h200/s21.sh paged
#        installs fa-tune's wheels; builds the paged kernels with all cores
#        (lab/h200/prebuild.py paged); the kernel over pages through the gate
#        (tests/gpu/test_paged_gpu.py: page sizes 8-256, fixed and packed, masks, multicast and
#        head clusters, a bad block table); paged against unpaged in one process (fa-tune run)
#   2  carry [".fa3/part1"]  bash lab/h200/s21.sh hf-masks
#        parks FA3's first half; issue 36's transformers models (Mistral, Gemma-2, gpt-oss) through
#        generate() against the FP32 model (tests/gpu/test_hf_masks_gpu.py)
#   3  carry [".fi"]         bash lab/h200/s21.sh fi
#        installs FlashInfer (lab/h200/flashinfer_stage.sh) and builds its D 128 prefill module
#   4  carry [".fa3/part2"]  bash lab/h200/s21.sh peers
#        installs FA3; issue 37's table: fa-tune compare --backends fa3,flashinfer at pages of
#        64, 128, 256 and the mixed varlen batch over pages; the paged peers' and op's GPU tests
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL=paged
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
# Issue 37's problems: 4 sequences of 2048 new queries over 8192 keys; a mixed batch of 8
# prompts (512 to 8192 new tokens over cached prefixes of 0 to 8192).
FIXED=4x32/8x2048:k8192
MIXED="32/8x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,3072:4096,6144:14336]"
case "${1:?paged|hf-masks|fi|peers}" in
paged)
  timeout 200 $E python3 lab/h200/prebuild.py paged > "$OUT/prebuild.log" 2>&1
  step "prebuild exit $?"; grep -E "FAILED|local memory|built in|builds on" "$OUT/prebuild.log"
  gpu_tests paged.log 200 tests/gpu/test_paged_gpu.py
  # Paged against unpaged, one process each preset (the fixed-length kernel for the unpaged
  # problem; the device-scheduled one over pages).
  for preset in llama3 default; do
    timeout 90 $E python3 -m tuner.cli run --preset $preset --shape $FIXED --shape $FIXED:p16 \
      --shape $FIXED:p32 --shape $FIXED:p64 --shape $FIXED:p128 --shape $FIXED:p256 \
      > "$OUT/run_$preset.log" 2>&1; step "run $preset exit $?"; tail -10 "$OUT/run_$preset.log"
  done
  timeout 60 $E python3 -m tuner.cli run --preset default --shape "$MIXED" \
    > "$OUT/run_mixed.log" 2>&1; step "run mixed exit $?"; tail -5 "$OUT/run_mixed.log"
  timeout 60 $E python3 -m tuner.cli run --preset default --shape "$MIXED:p64" \
    > "$OUT/run_mixed_paged.log" 2>&1; step "run mixed paged exit $?"; tail -5 "$OUT/run_mixed_paged.log"
  ;;
hf-masks)
  [ -d .fa3/part1 ] && bash lab/h200/fa3_stage1.sh > "$OUT/fa3_stage1.log" 2>&1
  gpu_tests hf_masks.log 540 tests/gpu/test_hf_masks_gpu.py
  grep -E "stats|per-step" "$OUT/hf_masks.log" | cut -c1-400
  ;;
fi)
  FI_SMOKE=1 timeout 560 bash lab/h200/flashinfer_stage.sh > "$OUT/fi_stage.log" 2>&1
  step "flashinfer stage exit $?"; tail -5 "$OUT/fi_stage.log"
  ;;
peers)
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; exit 3; }
  for shape in $FIXED:p64 $FIXED:p128 $FIXED:p256 $FIXED "$MIXED:p64"; do
    log="cmp_${shape//[:\/\[\],*]/_}.log"
    timeout 80 $E python3 -m tuner.cli compare --preset llama3 --shape "$shape" \
      --backends fa3,flashinfer \
      --results-dir "$DEV/cmp" > "$OUT/$log" 2>&1
    step "compare $shape exit $?"; tail -5 "$OUT/$log"
  done
  gpu_tests paged_peers.log $((570 - (SECONDS - t0))) tests/gpu/test_paged_peers_gpu.py \
    tests/gpu/test_paged_op_gpu.py
  ;;
esac
step done
