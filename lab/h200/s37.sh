#!/usr/bin/env bash
# Session 37's GPU call (docs/PERF.md step 70): issue 38's final with more turns.
#   carry [".whl", "studies/twin1.db", "studies/twin2.db"]:  bash lab/h200/s37.sh band
#     the finalists of both twin searches' finals (5 configs: each twin's three, trial 8 shared)
#     built, gated and played in one process, 16 interleaved turns (scripts/final_band.py):
#     each config's median and the final's band after 4, 8, 12 and 16 turns, and the band of
#     the per-turn ratios (about 3 minutes). twin2.db is in step 69's tarball as a CSV only:
#     the database stays in studies/ of the checkout that ran it. BAND_ONLY_FINAL=1: (a) only.
set -uo pipefail
FIRST_CALL="s37.sh band with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?band}" in
band)
  for s in twin1 twin2; do
    [ -f "studies/$s.db" ] || { echo "studies/$s.db missing: carry it"; exit 2; }
  done
  # (a) the final's protocol (1 s settle, 100 launches a measurement); (b) no settle after the
  # first and 500 launches: fewer seconds a turn, and is a longer measurement less noisy?
  timeout 300 $E python3 scripts/final_band.py --study twin1 --study twin2 --turns 16 \
    --json "$OUT/final_band.json" > "$OUT/final_band.log" 2>&1
  step "final_band exit $?"; grep -A6 "first 16 turns" "$OUT/final_band.log" | cut -c1-160
  [ -n "${BAND_ONLY_FINAL:-}" ] && { step done; exit 0; }  # (a) only, in a short call
  timeout $((570 - (SECONDS - t0))) $E python3 scripts/final_band.py --study twin1 \
    --study twin2 --turns 16 --repeat 500 --settle-s 0 --json "$OUT/final_band_r500.json" \
    > "$OUT/final_band_r500.log" 2>&1
  step "final_band r500 exit $?"; grep -A6 "first 16 turns" "$OUT/final_band_r500.log" | cut -c1-160
  ;;
*)
  echo "s37.sh: unknown call '$1': band" >&2; exit 2 ;;
esac
step done
