#!/usr/bin/env bash
# Search throughput with compiles cached (issue 5, benchmark 2): the same random search twice,
# each into a fresh study. The sampler's sequence does not depend on the results, so the second
# run asks exactly the configs the first one compiled: every build is a cache hit, and its GPU
# busy fraction measures the pipeline itself (asks, worker round trips, gate, timing).
#   bash lab/h200/replay.sh PREFIX TRIALS      (logs and study files under $OUT)
set -uo pipefail
prefix=${1:?study prefix}; trials=${2:-30}
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.device}
OUT=${OUT:-$DEV/out}
mkdir -p "$OUT"
E="bash lab/h200/gpu_session.sh env --"
for run in cold cached; do
  study="$prefix-$run"
  timeout 280 $E python3 -m tuner.cli search --study "$study" --sampler random --seed 11 \
    --trials "$trials" --timeout 4m > "$OUT/replay_$run.log" 2>&1 || echo "$run exited $?"
  cp "studies/$study.db"* "$OUT/" 2>/dev/null || true
  echo "$run: $(grep -a -o 'study [^ ]*: [0-9]* trials in.*' "$OUT/replay_$run.log" | tail -1)"
done
