#!/usr/bin/env bash
# Session 38's GPU call (docs/PERF.md step 70): issue 38's benchmark search on the card that
# comes, one call. `2x32/1x8192` from an empty study and compile cache, 16 cores, 480 s: GPU
# busy, trials per hour, and when the first config within 1 % of the best confirmed one came.
#   carry [".whl"]: bash lab/h200/s38.sh search [STUDY] [SECONDS]
#                   (SECONDS of search, default 480: about 9.5 minutes in all)
#   carry [".whl"]: bash lab/h200/s38.sh jobs "16 14" [SECONDS]   (docs/PERF.md step 71)
#                   `1x32/8x8192` searched once per --jobs value (default 200 s each), each from
#                   its own empty study and compile cache, through lab/search_timed.py: trials
#                   per hour, GPU busy, the loop's own time per ask and per tell, and where the
#                   GPU worker's idle time went (step 72)
set -uo pipefail
FIRST_CALL="s38.sh search with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?search [STUDY] [SECONDS] | jobs LIST [SECONDS]}" in
search)
  study=${2:-i38} secs=${3:-480}
  rm -f "studies/$study.db"
  timeout $((secs + 105)) $E python3 -m tuner.cli search --study "$study" --shape 2x32/1x8192 \
    --timeout "${secs}s" > "$OUT/search_$study.log" 2>&1
  step "search exit $?"
  cp "studies/$study.db" "$OUT/" 2>/dev/null
  grep -E "^study |^best|^final|trials|GPU busy|within" "$OUT/search_$study.log" | tail -12 | cut -c1-200
  ;;
jobs)
  secs=${3:-200}
  for j in ${2:-16 14}; do
    home=$DEV/jobs$j; rm -rf "$home"; mkdir -p "$home"
    FA_TUNE_STUDIES=$home timeout $((secs + 105)) $E python3 lab/search_timed.py search \
      --study j$j --shape 1x32/8x8192 --timeout "${secs}s" --jobs "$j" \
      > "$OUT/search_jobs$j.log" 2>&1
    step "jobs $j: exit $?"
    cp "$home/j$j.db" "$OUT/" 2>/dev/null  # the trials' build and GPU records
    grep -E "trials|GPU busy|loop time|time to its last" "$OUT/search_jobs$j.log" | tail -5 | cut -c1-260
  done
  ;;
*) echo "s38.sh: unknown call '$1': search, jobs" >&2; exit 2 ;;
esac
