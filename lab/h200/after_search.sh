#!/usr/bin/env bash
# After a search on the GPU host (warm machine, FA3 installed by search-wait): the searched best
# beside FA3 and cuDNN through the product's compare (FA3 first and last; compare also states
# the search's confirmed number against its own), then the export rebuilt from scratch and
# timed against the tuner's library (A B B A pairs).
#   bash lab/h200/after_search.sh STUDY [BACKENDS]   (logs under $OUT; the export in .device/exp)
# EXPORT=0 stops after compare (about 80 s less device time, for a second search in the session).
set -uo pipefail
study=${1:?study}
backends=${2:-fa3,cudnn}
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.device}
OUT=${OUT:-$DEV/out}
EXP=$DEV/exp
mkdir -p "$OUT"
E="bash lab/h200/gpu_session.sh env --"
timeout 330 $E python3 -m tuner.cli compare --study "$study" --backends "$backends" \
  --results-dir "$DEV/results" > "$OUT/compare.log" 2>&1 || echo "compare exited $?"
tail -n 26 "$OUT/compare.log"
# $OUT returns at most 8 files: the result folder travels as one archive.
(cd "$DEV" && tar -cJf "$OUT/compare_results.tar.xz" results) 2>/dev/null || true
[ "${EXPORT:-1}" = 0 ] && exit 0
rm -rf "$EXP"
$E python3 -m tuner.cli export --study "$study" --out "$EXP" > "$OUT/export.log" 2>&1 \
  || { echo "export failed"; tail -5 "$OUT/export.log"; exit 1; }
bash "$EXP/build.sh" > "$OUT/export_build.log" 2>&1 || { echo "build.sh failed"; tail -5 "$OUT/export_build.log"; exit 1; }
timeout 200 $E python3 scripts/export_timing.py --study "$study" --export "$EXP" --pairs 4 \
  --json "$OUT/export_timing.json" > "$OUT/export_timing.log" 2>&1 || echo "export_timing exited $?"
tail -n 12 "$OUT/export_timing.log"
