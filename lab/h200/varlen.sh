#!/usr/bin/env bash
# Issue 15's varlen session on a lent H200: three back-to-back device calls (30 s idle limit).
#
#   call 1, carry [".whl"]:        bash lab/h200/varlen.sh start
#       installs our wheels; builds the varlen variants (lab/h200/variants/varlen.txt, for the
#       packed problems below: the varlen class) with all cores in the background, and runs
#       the varlen GPU tests in the background (they need no FA3)
#   call 2, carry [".fa3/part1"]:  bash lab/h200/fa3_stage1.sh
#   call 3, carry [".fa3/part2"]:  bash lab/h200/varlen.sh run
#       installs FA3; waits for the varlen GPU tests (gate on uneven packed batches at D
#       64/128/256); then every variant gated and timed beside FA3's flash_attn_varlen_func on the two
#       benchmark batches (same process, same inputs, same protocol); logs in $OUT
#
# The batches: the anchors' (32768 tokens: 8192, 4096 x2, 2048 x4, 1024 x8) and one of many
# short sequences (32768 tokens: 1024 x8, 512 x16, 256 x32, 128 x64). Hq 32, Hkv 8, D 128.
set -euo pipefail
cmd=${1:?usage: varlen.sh start|run}
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
mkdir -p "$DEV" && DEV=$(cd "$DEV" && pwd)
export FA_TUNE_DEVICE_DIR=$DEV
export PYTHONPATH="$DEV/fa3site:$DEV/fa3site/nvidia_cutlass_dsl/dsl_packages:$DEV/site:$PWD"
export PYTHONUNBUFFERED=1
OUT=${OUT:-$DEV/out}
mkdir -p "$OUT"
MIXES=("32/8x[8192,4096*2,2048*4,1024*8]" "32/8x[1024*8,512*16,256*32,128*64]")
# EXTRA_SHAPES (space-separated): more problems for both calls, e.g. "32/8x[8192] 1x32/8x8192"
# (one sequence packed, and the fixed-length kernel on it: the cost of packing alone).
read -r -a extra <<< "${EXTRA_SHAPES:-}"
MIXES+=(${extra[@]+"${extra[@]}"})
shapes=()
for m in "${MIXES[@]}"; do shapes+=(--shape "$m"); done

case "$cmd" in
start)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" \
    .whl/*.whl
  # Both background jobs run from a snapshot of the tree (the later calls re-sync the repository
  # copy under them: lab/h200/snapshot.sh); the builds land in this copy's studies/cache.
  bash lab/h200/snapshot.sh "$DEV/tree"
  repo=$PWD
  cd "$DEV/tree"
  export PYTHONPATH="${PYTHONPATH%:"$repo"}:$PWD" FA_TUNE_STUDIES="$repo/studies"
  rm -f "$DEV/varlen_build.log"
  setsid nohup python3 scripts/kernel_lab.py --variants-file lab/h200/variants/varlen.txt \
    "${shapes[@]}" --build-only --jobs "$(nproc)" > "$DEV/varlen_build.log" 2>&1 < /dev/null &
  echo "building the varlen variants in the background"
  # The varlen GPU tests need no FA3: they run while calls 2 and 3 carry it (the build cache
  # may come carried too: carry studies/cache built here with the same nvcc).
  rm -f "$DEV/varlen_gpu.log"
  setsid nohup timeout 400 python3 -m pytest -q -s -m gpu tests/gpu/test_varlen_gpu.py \
    -p no:cacheprovider > "$DEV/varlen_gpu.log" 2>&1 < /dev/null &
  cd "$repo"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
  ;;
run)
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed: timing without it"; }
  # The GPU tests started in call 1; the timing waits for them (one process on the GPU).
  while pgrep -f "pytest -q -s -m gpu tests/gpu/test_varlen_gpu.py" > /dev/null; do sleep 2; done
  cp "$DEV/varlen_gpu.log" "$OUT/varlen_gpu.log"
  grep -E "passed|failed|FAILED|Error" "$OUT/varlen_gpu.log" | tail -12
  for _ in $(seq 150); do grep -q '^built' "$DEV/varlen_build.log" 2>/dev/null && break; sleep 2; done
  cp "$DEV/varlen_build.log" "$OUT/varlen_build.log"
  read -r warm rep rounds <<< "${LAB_PROTOCOL:-50 200 3}"
  timeout "${LAB_TIMEOUT:-300}" python3 scripts/kernel_lab.py \
    --variants-file lab/h200/variants/varlen.txt "${shapes[@]}" --warmup "$warm" \
    --repeat "$rep" --rounds "$rounds" > "$OUT/varlen_lab.log" 2>&1 || echo "lab exited $?"
  grep -v '^  [0-9a-f]\{12\}: {' "$OUT/varlen_lab.log" | tail -n 40
  ;;
*)
  echo "unknown subcommand $cmd" >&2
  exit 2
  ;;
esac
