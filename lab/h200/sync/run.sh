#!/usr/bin/env bash
# The synccheck reproducers of docs/PERF.md, step 22, on the GPU host (a warm machine with our
# wheels installed: lab/h200/gpu_session.sh start/search-start did that). Builds both with nvcc
# there and runs each under synccheck (and racecheck); one summary line per run.
#   bash lab/h200/sync/run.sh        (logs under $OUT/sync; binaries in .device/sync)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$ROOT/.device}
OUT=${OUT:-$DEV/out}
BIN=$DEV/sync
mkdir -p "$OUT/sync" "$BIN"
OUT=$(cd "$OUT" && pwd); BIN=$(cd "$BIN" && pwd)  # absolute: the builds run from $HERE
INC=$(cd "$ROOT" && bash lab/h200/gpu_session.sh env -- \
  python3 -c "import sys; sys.path.insert(0, 'tests'); from cutlass_headers import cutlass_include; print(cutlass_include())")
cd "$HERE"
CS=${CS:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
for src in remote_arrive multicast_arrive; do
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$INC" "$src.cu" -o "$BIN/$src" \
    || { echo "$src: nvcc failed"; continue; }
done
"$BIN/remote_arrive"
for mode in 0 1; do "$BIN/multicast_arrive" "$mode"; done
run() {  # tool, log name, binary and arguments
  local tool=$1 name=$2; shift 2
  "$CS" --tool "$tool" --print-limit 4 "$@" > "$OUT/sync/$name.log" 2>&1
  echo "$name: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sync/$name.log" | head -1)"
}
run synccheck remote_arrive_synccheck "$BIN/remote_arrive"
for mode in 0 1; do
  run synccheck "multicast_arrive_mode${mode}_synccheck" "$BIN/multicast_arrive" "$mode"
  run racecheck "multicast_arrive_mode${mode}_racecheck" "$BIN/multicast_arrive" "$mode"
done
