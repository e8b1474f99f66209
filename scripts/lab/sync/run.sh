#!/usr/bin/env bash
# The synccheck reproducers of docs/PERF.md, step 22, on the GPU host (a warm machine with our
# wheels installed: scripts/gpu_session.sh start/search-start did that). Builds both with nvcc
# there and runs each under synccheck (and racecheck); one summary line per run.
#   bash scripts/lab/sync/run.sh        (logs under $OUT/sync)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/sync"
INC=$(cd "$ROOT" && bash scripts/gpu_session.sh env -- \
  python3 -c "from tuner import build; print(build.cutlass_include())")
cd "$HERE"
CS=${CS:-/usr/local/cuda/bin/compute-sanitizer}
for src in remote_arrive multicast_arrive; do
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$INC" "$src.cu" -o "/tmp/$src" \
    || { echo "$src: nvcc failed"; continue; }
done
/tmp/remote_arrive
for mode in 0 1; do /tmp/multicast_arrive "$mode"; done
run() {  # tool, log name, binary and arguments
  local tool=$1 name=$2; shift 2
  "$CS" --tool "$tool" --print-limit 4 "$@" > "$OUT/sync/$name.log" 2>&1
  echo "$name: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sync/$name.log" | head -1)"
}
run synccheck remote_arrive_synccheck /tmp/remote_arrive
for mode in 0 1; do
  run synccheck "multicast_arrive_mode${mode}_synccheck" /tmp/multicast_arrive "$mode"
  run racecheck "multicast_arrive_mode${mode}_racecheck" /tmp/multicast_arrive "$mode"
done
