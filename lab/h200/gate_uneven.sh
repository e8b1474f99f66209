#!/usr/bin/env bash
# The correctness gate of a variants file on uneven problems of its class (no timing worth
# keeping): S that no tile divides, GQA and MQA head groups, B > 1, a short and a one-tile
# sequence. Usage: gate_uneven.sh VARIANTS_FILE CLASS_SUFFIX (":d64", ":full", "" for causal
# D 128) [kernel_lab.py args]. Writes $OUT/gate_<file>.log; prints the failures (or none).
set -euo pipefail
f=${1:?variants file}; sfx=${2-}; shift 2 || true
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-${FA_TUNE_DEVICE_DIR:-$LAB/../../.device}/out}
log="$OUT/gate_$(basename "$f" .txt).log"
timeout "${GATE_TIMEOUT:-240}" bash "$LAB/gpu_session.sh" env -- python3 scripts/kernel_lab.py \
  --no-fa3 --variants-file "$f" --shape "2x5x1000$sfx" --shape "2x8/2x1000$sfx" \
  --shape "3x4/1x777$sfx" --shape "1x3x77$sfx" --shape "2x16x2000$sfx" \
  --warmup 1 --repeat 2 --rounds 1 --settle-s 0 "$@" > "$log" 2>&1 || echo "gate exited $?"
grep -E "FAIL|Error|error" "$log" | cut -c1-240 | head -20 || echo "gate $(basename "$f"): no failures"
# Gate verdicts: ok (passed), exp (a lab variant wrong on purpose, timed anyway).
grep -oE "'gate': '[a-z]+'" "$log" | sort | uniq -c | sed 's/^/gate results: /' || true
