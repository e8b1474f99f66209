#!/usr/bin/env bash
# After a search on the GPU host (warm machine, FA3 installed by search-wait): the searched best
# beside FA3 through the product's compare (FA3 first and last), the multicast scheduler tests,
# and the export rebuilt from scratch and timed against the tuner's library (A B B A pairs).
#   bash lab/h200/after_search.sh STUDY      (logs under $OUT; the export in .device/exp)
set -uo pipefail
study=${1:?study}
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.device}
OUT=${OUT:-$DEV/out}
EXP=$DEV/exp
mkdir -p "$OUT"
E="bash lab/h200/gpu_session.sh env --"
timeout 330 $E python3 -m tuner.cli compare --study "$study" --backends fa3 \
  --results-dir "$OUT/results" > "$OUT/compare.log" 2>&1 || echo "compare exited $?"
tail -n 22 "$OUT/compare.log"
timeout 150 $E python3 -m pytest -q -m gpu tests/gpu/test_schedulers_gpu.py -k multicast \
  -p no:cacheprovider > "$OUT/pytest_multicast.log" 2>&1 || echo "pytest exited $?"
tail -n 3 "$OUT/pytest_multicast.log"
rm -rf "$EXP"
$E python3 -m tuner.cli export --study "$study" --out "$EXP" > "$OUT/export.log" 2>&1 \
  || { echo "export failed"; tail -5 "$OUT/export.log"; exit 1; }
CUTLASS_DIR=$($E python3 -c "from tuner import build; print(build.cutlass_include())") \
  bash "$EXP/build.sh" > "$OUT/export_build.log" 2>&1 || { echo "build.sh failed"; tail -5 "$OUT/export_build.log"; exit 1; }
timeout 200 $E python3 scripts/export_timing.py --study "$study" --export "$EXP" --pairs 4 \
  --json "$OUT/export_timing.json" > "$OUT/export_timing.log" 2>&1 || echo "export_timing exited $?"
tail -n 12 "$OUT/export_timing.log"
