#!/usr/bin/env bash
# Issue 34's last measurements on the H200 (docs/PERF.md step 46), one call, carry [".whl"]:
#   bash lab/h200/s18.sh ttft
#     installs our wheels; the op's GPU tests with the host-overhead check (strided inputs
#     within 2 us of dense); then a llama3-8b export (every bucket preset llama3) and
#     scripts/llama_prefill.py at 32 layers with --generate: time to first token of sdpa and
#     fa_tune, fa_tune with use_cache=False, and a torch.profiler kernel summary of each.
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
esac
