#!/usr/bin/env bash
# Issue 34's last measurements on the H200 (docs/PERF.md step 46), one call, carry [".whl"]:
#   bash lab/h200/s18.sh ttft
#     installs our wheels; the op's GPU tests with the host-overhead check (strided inputs
#     within 2 us of dense); then a llama3-8b export (every bucket preset llama3) and
#     scripts/llama_prefill.py at 32 layers with --generate: time to first token of sdpa and
#     fa_tune, fa_tune with use_cache=False, and a torch.profiler kernel summary of each.
#
# Issue 35's kernel refactor, before against after (docs/PERF.md step 47), carry [".whl", ".base"]
# (.base: the source tree before, e.g. `git archive BASE tuner cuda_src templates search_spaces
# pyproject.toml | tar -x -C .base`, plus scripts/sass_snapshot.py):
#   bash lab/h200/s18.sh ab-build     every preset built from both trees (scripts/sass_snapshot.py),
#                                     in the background; waits up to 500 s
#   bash lab/h200/s18.sh ab-time      waits for the builds, compares the SASS, then
#                                     scripts/ab_libs.py: each preset's two kernels A B B A
#   bash lab/h200/s18.sh ab-tests     the snapshots again (cached builds on a warm machine) and
#                                     their SASS compared; then the GPU tests of the kernel's
#                                     pieces (planted bugs, schedulers, varlen, the op)
#   bash lab/h200/s18.sh final        the re-laid-out package and the gate's new accuracy
#                                     fields on the GPU: `fa-tune run`, then the oracle and
#                                     planted-bug GPU tests (as many as the budget allows)
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
mkdir -p "$DEV"
OUT=${OUT:-$DEV/out}
E="bash $LAB/gpu_session.sh env --"
case "${1:?ttft}" in
ttft)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
  timeout 240 $E python3 -m pytest -q -s -m gpu -p no:cacheprovider \
    tests/gpu/test_workload_ops_gpu.py > "$OUT/workload_ops.log" 2>&1
  echo "workload ops tests exit $?"
  grep -E "host|overhead|passed|failed|FAILED|Error" "$OUT/workload_ops.log" | tail -12
  rm -rf "$DEV/l8b"
  timeout 200 $E python3 -m tuner.cli export --workload llama3-8b --default preset:llama3 \
    --out "$DEV/l8b" > "$OUT/export.log" 2>&1 || { echo "export failed"; tail -5 "$OUT/export.log"; }
  timeout 300 $E python3 scripts/llama_prefill.py --export "$DEV/l8b" --layers 32 --generate \
    --warmup 2 --iters 9 --profile "$OUT/profile" --json "$OUT/ttft.json" > "$OUT/ttft.log" 2>&1
  echo "llama_prefill exit $?"
  tail -40 "$OUT/ttft.log"
  ;;
ttft2)
  # Again with the use_cache=False generate() of both backends and their profiles.
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
  [ -f "$DEV/l8b/lib/libfa_tune_fwd.so" ] || timeout 200 $E python3 -m tuner.cli export \
    --workload llama3-8b --default preset:llama3 --out "$DEV/l8b" > "$OUT/export.log" 2>&1
  timeout 400 $E python3 scripts/llama_prefill.py --export "$DEV/l8b" --layers 32 --generate \
    --warmup 2 --iters 15 --profile "$OUT/profile" --json "$OUT/ttft.json" > "$OUT/ttft.log" 2>&1
  echo "llama_prefill exit $?"
  tail -30 "$OUT/ttft.log"
  ;;
ab-build)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
  bash "$LAB/snapshot.sh" "$DEV/tree"
  rm -f "$DEV/ab_build.rc"
  (cd "$DEV/tree" && setsid nohup bash -c "cd '$PWD/.base' && PYTHONPATH='$DEV/site:$PWD/.base' \
     python3 scripts/sass_snapshot.py --out '$DEV/sass-before' --cache '$DEV/cache-before' \
     > '$DEV/ab_before.log' 2>&1; cd '$DEV/tree' && PYTHONPATH='$DEV/site:$DEV/tree' \
     python3 scripts/sass_snapshot.py --out '$DEV/sass-after' --cache '$DEV/cache-after' \
     > '$DEV/ab_after.log' 2>&1; echo \$? > '$DEV/ab_build.rc'" < /dev/null > /dev/null 2>&1 &)
  for _ in $(seq 500); do [ -f "$DEV/ab_build.rc" ] && break; sleep 1; done
  tail -3 "$DEV/ab_before.log" "$DEV/ab_after.log" 2>/dev/null
  echo "builds: $(cat "$DEV/ab_build.rc" 2>/dev/null || echo still running)"
  ;;
ab-time)
  for _ in $(seq 400); do [ -f "$DEV/ab_build.rc" ] && break; sleep 1; done
  cp "$DEV/ab_before.log" "$DEV/ab_after.log" "$OUT/" 2>/dev/null
  $E python3 scripts/sass_snapshot.py --compare "$DEV/sass-before" "$DEV/sass-after" \
    > "$OUT/sass_compare.txt" 2>&1
  cat "$OUT/sass_compare.txt"
  cp "$DEV/sass-before/index.json" "$OUT/sass_before_index.json"
  cp "$DEV/sass-after/index.json" "$OUT/sass_after_index.json"
  timeout 420 $E python3 scripts/ab_libs.py "$DEV/sass-before" "$DEV/sass-after" --pairs 4 \
    --settle-s 0.5 --json "$OUT/ab.json" > "$OUT/ab.log" 2>&1
  echo "ab_libs exit $?"
  tail -25 "$OUT/ab.log"
  ;;
ab-tests)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
  (cd .base && PYTHONPATH="$DEV/site:$PWD" timeout 200 python3 scripts/sass_snapshot.py \
     --out "$DEV/sass-before" --cache "$DEV/cache-before" > "$OUT/ab_before.log" 2>&1)
  PYTHONPATH="$DEV/site:$PWD" timeout 200 python3 scripts/sass_snapshot.py --out "$DEV/sass-after" \
    --cache "$DEV/cache-after" > "$OUT/ab_after.log" 2>&1
  $E python3 scripts/sass_snapshot.py --compare "$DEV/sass-before" "$DEV/sass-after" \
    > "$OUT/sass_compare.txt" 2>&1
  grep -c "constant-bank" "$OUT/sass_compare.txt"; grep -v "constant-bank" "$OUT/sass_compare.txt" | head -20
  timeout 330 $E python3 -m pytest -q -m gpu -p no:cacheprovider --durations=8 \
    tests/gpu/test_planted_bugs_gpu.py tests/gpu/test_schedulers_gpu.py \
    tests/gpu/test_varlen_gpu.py tests/gpu/test_inference_op_gpu.py > "$OUT/tests.log" 2>&1
  echo "GPU tests exit $?"
  grep -E "passed|failed|FAILED|Error|s call" "$OUT/tests.log" | tail -16
  ;;
final)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
  timeout 100 $E python3 -m tuner.cli run --preset llama3 --shape 2x8/2x1000 --shape 1x32/8x4096 \
    > "$OUT/run.log" 2>&1; echo "fa-tune run exit $?"; tail -14 "$OUT/run.log"
  timeout 110 $E python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_oracle_gpu.py \
    > "$OUT/tests.log" 2>&1
  echo "GPU tests exit $?"; tail -c 1200 "$OUT/tests.log"
  ;;
esac
