#!/usr/bin/env bash
# Session 37's GPU calls (docs/PERF.md step 69): issue 38's final with more turns. The
# finalists of both twin searches' finals (5 configs: each twin's three, trial 8 shared) built,
# gated and played in one process, 16 interleaved turns (scripts/final_band.py): each config's
# median and spread, and the fastest one's lead and paired band after 4, 8, 12 and 16 turns.
# twin2.db is in step 69's tarball as a CSV only and did not outlive that checkout; twin1.db is
# in step 68's (2026-12-06-s36/s36/twin1.db in
# docs/measurements/2026-12-04-s18_2026-12-07-s47.tar.xz): the call plays the studies it finds.
#   carry [".whl", "studies/twin1.db"] (and "studies/twin2.db" where one exists):
#     bash lab/h200/s37.sh band        the final's protocol (1 s settle, 20 + 100 launches a
#                                      measurement; step 69 ran it: about 3.5 minutes)
#     bash lab/h200/s37.sh band-r500   no settle and 500 launches a measurement (0.45 s a turn
#                                      instead of 1.1 s): is a longer measurement as steady?
#     bash lab/h200/s37.sh ab          both on one card, band-r500 first (step 71 ran them on
#                                      two H100s; the final keeps its settle until one card
#                                      has run both): about 5 minutes
set -uo pipefail
FIRST_CALL="s37.sh band with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
# The twins carried (twin2.db lives only where step 69 ran; twin1.db is in step 68's tarball).
studies=()
for s in twin1 twin2; do [ -f "studies/$s.db" ] && studies+=(--study "$s"); done
[ ${#studies[@]} -gt 0 ] || { echo "no studies/twin1.db or twin2.db: carry one"; exit 2; }
play() {  # LOG [ARGS]: the finalists' 16 turns under one protocol, in what the call has left
  local log=$1 left=$((575 - (SECONDS - t0))); shift
  [ $left -gt 60 ] || { step "$log: no time left"; return; }
  timeout $left $E python3 scripts/final_band.py "${studies[@]}" --turns 16 "$@" \
    --json "$OUT/$log.json" > "$OUT/$log.log" 2>&1
  step "$log exit $?"; grep -A6 "first 16 turns" "$OUT/$log.log" | cut -c1-160
}
case "${1:?band | band-r500 | ab}" in
band) play final_band ;;
band-r500) play final_band_r500 --repeat 500 --settle-s 0 ;;
ab) play final_band_r500 --repeat 500 --settle-s 0; play final_band ;;
*) echo "s37.sh: unknown call '$1': band, band-r500 or ab" >&2; exit 2 ;;
esac
step done
