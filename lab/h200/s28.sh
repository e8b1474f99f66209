#!/usr/bin/env bash
# Session 28's lab calls (docs/PERF.md step 62): searches chained on one warm machine, each
# pick compared beside FA3 while the next search is started.
#   call 1, carry [".whl", ".fa3/part1"]:
#       bash lab/h200/gpu_session.sh search-start STUDY BUDGET --shape PROBLEM
#   call 2, carry [".fa3/part2"]:  bash lab/h200/s28.sh next STUDY [SHAPE...] [-- NEXT BUDGET PROBLEM]
#       installs FA3 (once), waits for STUDY's search, compares its pick beside FA3 on its own
#       problem and each SHAPE (1 s settle, 50 + 3 x 200), then starts search NEXT in the background
#   later calls: the same `next`, carrying nothing
#   bash lab/h200/s28.sh w128    the 128-key window variants (lab/h200/variants/w128_s28.txt;
#       W128_VARIANTS=FILE another, W128_NOFA3=1 without FA3, W128_UNCHECKED=1 past the static
#       check), three CTAs an SM (landed in step 63; the patch was applied then)
#       built, gated on uneven shapes and timed beside FA3 at the 128-key window rows
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL="gpu_session.sh search-start"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
cmp() {  # LOG ARGS...
  local log=$1; shift
  timeout 240 $E python3 -m tuner.cli compare --backends fa3 --warmup 50 --repeat 200 \
    --rounds 3 --settle-s 1 --results-dir "$DEV/results" "$@" > "$OUT/$log.log" 2>&1
  step "$log exit $?"; grep -E "fa-tune|fa3|FAIL|rror|x FA3" "$OUT/$log.log" | tail -10 | cut -c1-200
}
case "${1:?next STUDY [SHAPE...] [-- NEXT BUDGET PROBLEM] | w128}" in
next)
  study=${2:?study}; shift 2
  shapes=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do shapes+=(-s "$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  fa3_once
  wait_search "$study" || exit 1
  cmp "pick_$study" --study "$study"
  if [ ${#shapes[@]} -gt 0 ]; then cmp "pick_${study}_more" --study "$study" "${shapes[@]}"; fi
  (cd "$DEV" && tar -cJf "$OUT/results_$study.tar.xz" results) 2>/dev/null
  if [ $# -ge 3 ]; then
    next=$1 budget=$2; shift 2
    bash "$LAB/gpu_session.sh" search-start "$next" "$budget" --shape "$@" | head -1
  fi
  ;;
w128)
  # The 3-CTA variants needed lab/patches/three-ctas.patch then (landed in step 63).
  # W128_NOFA3=1: a fresh machine without FA3 (variants against d64-window only).
  # W128_UNCHECKED=1: past the static check (lab/h200/variants/w128_s29.txt says why).
  peer=(); if [ -n "${W128_NOFA3:-}" ]; then peer=(--no-fa3); else fa3_once; fi
  [ -n "${W128_UNCHECKED:-}" ] && peer+=(--unchecked)
  V=${W128_VARIANTS:-lab/h200/variants/w128_s28.txt}
  timeout 200 $E python3 scripts/kernel_lab.py --variants-file $V --shape 1x64/8x8192:d64:w128:sinks \
    --build-only --jobs "$(nproc)" ${W128_UNCHECKED:+--unchecked} > "$OUT/w128_build.log" 2>&1
  step "built: exit $?"; grep -E "not built|built" "$OUT/w128_build.log" | tail -4
  # Gate first on shapes no tile divides (with and without sinks, S_q < S_k), then time.
  timeout 150 $E python3 scripts/kernel_lab.py --variants-file $V --no-fa3 ${W128_UNCHECKED:+--unchecked} \
    --shape 1x3x1152:d64:w128:sinks --shape 2x5x1000:d64:w128 --shape 1x2/1x77:k300:d64:w128:sinks \
    --shape 2x16x2000:d64:w128 --warmup 1 --repeat 2 --rounds 1 --settle-s 0 > "$OUT/w128_gate.log" 2>&1
  step "gate: exit $?"; grep -E "FAIL|rror" "$OUT/w128_gate.log" | cut -c1-240 || echo "all passed"
  OUT=$OUT timeout 300 $E python3 scripts/kernel_lab.py --variants-file $V "${peer[@]}" \
    --shape 1x64/8x8192:d64:w128 --shape 1x64/8x8192:d64:w128:sinks \
    --warmup 50 --repeat 200 --rounds 3 --settle-s 1 > "$OUT/w128_lab.log" 2>&1
  step "lab: exit $?"; grep -v '^  [0-9a-f]\{12\}: {' "$OUT/w128_lab.log" | tail -n 26
  ;;
esac
step done
