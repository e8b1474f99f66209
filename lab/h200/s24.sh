#!/usr/bin/env bash
# Session 23's GPU work (docs/PERF.md step 56), back-to-back calls on one warm machine (30 s
# idle limit), each under the 600 s call limit:
#   1  carry [".whl"]        bash lab/h200/s24.sh start
#        installs fa-tune's wheels; step 55's unrun GPU tests in the background (the rising set
#        per sequence, the op's C++ paged path and abi import): they need no quiet card, so
#        the next calls install the peers meanwhile
#   2  carry [".fi"]         bash lab/h200/s24.sh fi
#        installs FlashInfer and JIT-builds its D 128 prefill module
#   3  carry [".fa3/part1"]  bash lab/h200/fa3_stage1.sh
#   4  carry [".fa3/part2"]  bash lab/h200/s24.sh peers
#        installs FA3, waits for `start`'s tests if it ran; issue 37's table at pages of 64,
#        128, 256 and unpaged, then the mixed batch over pages of 64, beside FA3 (and
#        FlashInfer after `fi`); then, in the time left, issue 36's window with two CTAs per
#        SM beside FA3 (lab/h200/variants/w128_d64c.txt)
#   (issue 34's chunk row searched, on a quiet card: bash lab/h200/gpu_session.sh search-start
#    s24-chunk 6m --shape 1x32/8x2048:k8192, then search-wait s24-chunk)
#   or, with little device time left, one call carrying [".whl"]: bash lab/h200/s24.sh solo
#        (the GPU tests, then the window's two-CTA variants without FA3)
#   carry [".whl", ".base"]: bash lab/h200/s24.sh ab [PRESET...]: branch wip/operands against
#        main (.base/operands, .base/main: `git archive` of each), A B B A in one process
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL=start
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
FIXED=4x32/8x2048:k8192
MIXED="32/8x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,3072:4096,6144:14336]"
compare() {  # LOG TIMEOUT ARGS...
  local log=$1 limit=$2; shift 2
  timeout "$limit" $E python3 -m tuner.cli compare --rounds 2 --settle-s 1 \
    --results-dir "$DEV/cmp" "$@" > "$OUT/$log" 2>&1
  step "compare $log exit $?"; grep -E "x FA3|x FlashInfer|TFLOPS|rror" "$OUT/$log" | tail -6
}
case "${1:?start|solo|ab|fi|peers}" in
start)
  # Their logs go to .device/bg ($OUT is this call's alone); `peers` copies them into its own.
  rm -rf "$DEV/verify.rc" "$DEV/bg"
  setsid nohup bash -c "export OUT='$DEV/bg'; source '$LAB/session_calls.sh' > /dev/null
    timeout 120 \$E python3 lab/h200/prebuild.py paged > '$DEV/bg/prebuild.log' 2>&1
    gpu_tests verify.log 300 tests/gpu/test_oracle_gpu.py tests/gpu/test_varlen_gpu.py \
      tests/gpu/test_varlen_op_gpu.py tests/gpu/test_paged_op_gpu.py > '$DEV/verify.txt' 2>&1
    echo done > '$DEV/verify.rc'" < /dev/null > /dev/null 2>&1 &
  step "GPU tests started in the background"
  ;;
solo)
  # One call when the device time left is short: the unrun GPU tests, then the window's
  # two-CTA variants against the 192 x 64 kernel (no FA3).
  timeout 120 $E python3 lab/h200/prebuild.py paged > "$OUT/prebuild.log" 2>&1
  step "prebuild exit $?"; grep -E "FAILED|local memory|built in" "$OUT/prebuild.log"
  gpu_tests verify.log 240 tests/gpu/test_oracle_gpu.py tests/gpu/test_varlen_gpu.py \
    tests/gpu/test_varlen_op_gpu.py tests/gpu/test_paged_op_gpu.py
  left=$((570 - (SECONDS - t0)))
  timeout $left $E python3 scripts/kernel_lab.py --variants-file lab/h200/variants/w128_d64c.txt \
    --shape 1x64/8x8192:d64:w128 --shape 1x64/8x8192:d64:w128:sinks --no-fa3 --rounds 2 \
    --settle-s 1 > "$OUT/w128.log" 2>&1
  step "w128 exit $?"; tail -16 "$OUT/w128.log" | cut -c1-200
  ;;
ab)
  # carry [".whl", ".base"]: branch wip/operands (.base/operands) against main (.base/main), the
  # presets whose PV wait moved (multicast, d64-sumpv) and default, fixed-length kernels,
  # built in parallel, then gated and timed A B B A in one process (scripts/ab_libs.py).
  shift; presets=${*:-multicast d64-sumpv default}
  mkdir -p "$DEV/builds"  # build logs stay on the machine: 8 files come back from $OUT
  for tree in main operands; do
    (cd .base/$tree && PYTHONPATH="$DEV/site:$PWD" timeout 200 python3 scripts/sass_snapshot.py \
       --fixed --out "$DEV/ab-$tree" --cache "$DEV/abcache-$tree" $presets \
       > "$DEV/builds/build_$tree.log" 2>&1; echo "$tree built: exit $?") &
  done
  wait; step built
  $E python3 scripts/sass_snapshot.py --compare "$DEV/ab-main" "$DEV/ab-operands" | tail -4
  timeout $((570 - (SECONDS - t0))) $E python3 scripts/ab_libs.py "$DEV/ab-main" \
    "$DEV/ab-operands" --pairs 3 --settle-s 0.5 --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
  step "ab_libs exit $?"; tail -12 "$OUT/ab.log"
  ;;
fi)
  FI_SMOKE=1 timeout 560 bash "$LAB/flashinfer_stage.sh" > "$OUT/fi_stage.log" 2>&1
  step "flashinfer stage exit $?"; tail -5 "$OUT/fi_stage.log"
  ;;
peers)
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; exit 3; }
  step "FA3 installed"
  if [ -d "$DEV/bg" ]; then  # `start`'s background tests, when it ran
    for _ in $(seq 300); do [ -f "$DEV/verify.rc" ] && break; sleep 1; done
    step "GPU tests: $(cat "$DEV/verify.rc" 2>/dev/null || echo still running)"
    cat "$DEV/verify.txt" 2>/dev/null; cp "$DEV"/bg/*.log "$OUT/" 2>/dev/null
    grep -E "FAILED|local memory|built in" "$OUT/prebuild.log"
  fi
  peers=fa3; [ -d "$DEV/fisite" ] && peers=fa3,flashinfer
  export PYTHONPATH=$DEV/fisite:${PYTHONPATH:-} FLASHINFER_WORKSPACE_BASE=$DEV
  # The first paged FlashInfer call JIT-builds its paged module (step 57: over 150 s).
  compare cmp_p64.log 300 --preset llama3 --shape "$FIXED:p64" --backends $peers
  for p in 128 256; do
    compare "cmp_p$p.log" 110 --preset llama3 --shape "$FIXED:p$p" --backends $peers
  done
  compare cmp_unpaged.log 110 --preset llama3 --shape "$FIXED" --backends $peers
  compare cmp_mixed_p64.log 110 --preset llama3 --shape "$MIXED:p64" --backends $peers
  # Issue 36's window, two CTAs per SM, beside FA3 (kernel_lab), in what the call has left.
  left=$((570 - (SECONDS - t0)))
  if [ $left -gt 90 ]; then
    timeout $left $E python3 scripts/kernel_lab.py --variants-file lab/h200/variants/w128_d64c.txt \
      --shape 1x64/8x8192:d64:w128 --rounds 2 --settle-s 1 > "$OUT/w128.log" 2>&1
    step "w128 exit $?"; tail -14 "$OUT/w128.log" | cut -c1-200
  fi
  ;;
esac
step done
