#!/usr/bin/env bash
# Issue 34 on the H200, kernel side (docs/PERF.md step 45), three back-to-back calls:
#   1, carry [".whl"]:        bash lab/h200/s17.sh tests-start
#        installs our wheels; from a snapshot, in the background: the GPU tests of queries over
#        a longer KV (family S_q < S_k cases, varlen with key lengths)
#   2, carry [".fa3/part1"]:  bash lab/h200/fa3_stage1.sh
#   3, carry [".fa3/part2"]:  bash lab/h200/s17.sh finish
#        installs FA3, waits for the tests, runs the layout GPU tests (FA3 on the same views),
#        then kernel_lab run12 on the chunked-prefill rows and the fused-QKV views beside FA3
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
mkdir -p "$DEV"
OUT=${OUT:-$DEV/out}
E="bash $LAB/gpu_session.sh env --"
case "${1:?tests-start|finish}" in
tests-start)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
  bash "$LAB/snapshot.sh" "$DEV/tree"
  rm -f "$DEV/tests.rc"
  (cd "$DEV/tree" && setsid nohup bash -c "$E python3 -m pytest -q -s -m gpu -p no:cacheprovider \
     tests/gpu/test_family_gpu.py -k 'k1000 or k2777 or k1500 or k778 or k300' \
     tests/gpu/test_varlen_gpu.py > '$DEV/tests.log' 2>&1; echo \$? > '$DEV/tests.rc'" \
     < /dev/null > /dev/null 2>&1 &)
  echo "GPU tests started"
  ;;
finish)
  FA3_SMOKE=0 bash "$LAB/fa3_stage2.sh" > "$OUT/fa3_install.log" 2>&1 || tail -3 "$OUT/fa3_install.log"
  for _ in $(seq 400); do [ -f "$DEV/tests.rc" ] && break; sleep 1; done
  echo "family/varlen tests exit: $(cat "$DEV/tests.rc" 2>/dev/null || echo still running)"
  cp "$DEV/tests.log" "$OUT/tests.log"
  grep -E "passed|failed|FAILED|Error" "$DEV/tests.log" | tail -8
  timeout 150 $E python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/gpu/test_layout_gpu.py \
    > "$OUT/layout_gpu.log" 2>&1; echo "layout tests exit $?"
  grep -E "passed|failed|FAILED|Error" "$OUT/layout_gpu.log" | tail -5
  timeout 200 $E python3 scripts/kernel_lab.py --variants-file lab/h200/run12.txt \
    --shape 1x32/8x2048:k8192 --shape 1x32/8x512:k16384 --shape 1x32/8x8192:qkv \
    --shape 1x32/8x8192 --warmup 50 --repeat 200 --rounds 2 --jobs 16 > "$OUT/lab12.log" 2>&1 \
    || echo "lab exited $?"
  grep -v "^   {" "$OUT/lab12.log" | tail -30
  ;;
esac
