#!/usr/bin/env bash
# Issue 36's last benchmark: a model's workload library as `fa-tune tune` builds it, measured per
# bucket beside FA3 (docs/PERF.md step 61's next steps). Three calls on one warm machine, each
# sent the moment the one before answers (the machine is given back after 30 s idle):
#   carry [".whl", ".fa3/part1"]  bash lab/h200/workload.sh start WORKLOAD BUDGET [BUCKET...]
#       `fa-tune tune --workload WORKLOAD --timeout BUDGET` in the background (BUDGET per
#       bucket: mistral-7b has 4 buckets, gemma-2-9b 6, gpt-oss-20b 6; e.g. 60s), only the
#       named buckets when given; FA3's first half parked
#   carry [".fa3/part2"]          bash lab/h200/workload.sh after WORKLOAD
#       installs FA3, waits for the tune (up to 500 s; call it again while it runs)
#   bash lab/h200/workload.sh cmp WORKLOAD [BUCKET...]
#       `fa-tune compare --study WORKLOAD-BUCKET --backends fa3` per bucket (each study's pick,
#       the config the library ships for that bucket, on the bucket's own problems; 1 s settle,
#       50 + 3 x 200 launches, 5 + 3 x 20 for buckets past 8k tokens, whose full-causal problems
#       run tens of milliseconds), its table in $OUT/cmp_BUCKET.log
# The tune's log lands in $OUT/tune_WORKLOAD.log.
set -uo pipefail
FIRST_CALL="start"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
wl=${2:?workload}
buckets() {
  $E python3 -c "import sys; from tuner.ship.workload import load_workload
print(' '.join(p.bucket.name for p in load_workload(sys.argv[1]).plan()))" "$wl"
}
case "${1:?start|after|cmp}" in
start)
  budget=${3:?budget per bucket, e.g. 60s}
  shift 3
  only=(); for b in "$@"; do only+=(--bucket "$b"); done
  rm -f "$DEV/tune.rc"
  bash "$LAB/snapshot.sh" "$DEV/tree"
  setsid nohup bash -c "cd '$DEV/tree' && FA_TUNE_STUDIES='$PWD/studies' $E python3 -m tuner.cli tune \
    --workload '$wl' --timeout '$budget' ${only[*]} > '$DEV/tune.log' 2>&1; echo \$? > '$DEV/tune.rc'" \
    < /dev/null > /dev/null 2>&1 &
  step "tune $wl started, $budget a bucket: ${*:-$(buckets)}"
  ;;
after)
  fa3_once
  [ -f "$DEV/tune.log" ] || { echo "no tune running (start failed?)"; exit 1; }
  for _ in $(seq 500); do [ -f "$DEV/tune.rc" ] && break; sleep 1; done
  cp "$DEV/tune.log" "$OUT/tune_$wl.log"
  cp studies/"$wl"-*.db "$OUT/" 2>/dev/null  # each trial's timings: where a bucket's time went
  step "tune exit $(cat "$DEV/tune.rc" 2>/dev/null || echo 'still running: call after again')"
  grep -E "^study |^best|^final|trials|tie|export|library" "$OUT/tune_$wl.log" | tail -24 | cut -c1-200
  ;;
cmp)
  fa3_once
  shift 2
  for b in ${*:-$(buckets)}; do
    left=$((570 - (SECONDS - t0)))
    [ $left -gt 40 ] || { step "$b: no time left in this call (cmp $wl $b)"; continue; }
    reps=(--warmup 50 --repeat 200); [[ "$b" == *s32k* ]] && reps=(--warmup 5 --repeat 20)
    timeout $((left < 200 ? left : 200)) $E python3 -m tuner.cli compare --study "$wl-$b" \
      --backends fa3 "${reps[@]}" --rounds 3 --settle-s 1 > "$OUT/cmp_$b.log" 2>&1
    step "$b exit $?"; grep -E "TFLOPS|x FA3|^│ |rror" "$OUT/cmp_$b.log" | tail -8 | cut -c1-200
  done
  ;;
*) echo "workload.sh: unknown call '$1': start, after or cmp" >&2; exit 2 ;;
esac
step done
