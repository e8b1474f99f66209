#!/usr/bin/env bash
# Issue 36's last benchmark: a model's workload library as `fa-tune tune` builds it, measured per
# bucket beside FA3 (docs/PERF.md step 61's next steps). Two calls on one warm machine:
#   carry [".whl", ".fa3/part1"]  bash lab/h200/workload.sh start WORKLOAD BUDGET
#       `fa-tune tune --workload WORKLOAD --timeout BUDGET` in the background (BUDGET per
#       bucket: mistral-7b has 4 buckets, gemma-2-9b 6, gpt-oss-20b 6; e.g. 90s), FA3's first
#       half parked
#   carry [".fa3/part2"]          bash lab/h200/workload.sh after WORKLOAD
#       installs FA3, waits for the tune, then `fa-tune compare --study WORKLOAD-BUCKET
#       --backends fa3` per bucket (each study's pick, the config the library ships for that
#       bucket, on the bucket's own problems; 1 s settle, 50 + 3 x 200) and prints one table
# Logs land in $OUT (per bucket: cmp_BUCKET.log).
set -uo pipefail
FIRST_CALL="start"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
wl=${2:?workload}
buckets() {
  $E python3 -c "import sys; from tuner.ship.workload import load_workload
print(' '.join(p.bucket.name for p in load_workload(sys.argv[1]).plan()))" "$wl"
}
case "${1:?start|after}" in
start)
  budget=${3:?budget per bucket, e.g. 90s}
  rm -f "$DEV/tune.rc"
  bash "$LAB/snapshot.sh" "$DEV/tree"
  setsid nohup bash -c "cd '$DEV/tree' && FA_TUNE_STUDIES='$PWD/studies' $E python3 -m tuner.cli tune \
    --workload '$wl' --timeout '$budget' > '$DEV/tune.log' 2>&1; echo \$? > '$DEV/tune.rc'" \
    < /dev/null > /dev/null 2>&1 &
  step "tune $wl started, $budget a bucket: $(buckets)"
  ;;
after)
  FA3_SMOKE=0 bash "$LAB/fa3_stage2.sh" > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; exit 1; }
  step "FA3 installed"
  [ -f "$DEV/tune.log" ] || { echo "no tune running (start failed?)"; exit 1; }
  for _ in $(seq 540); do [ -f "$DEV/tune.rc" ] && break; sleep 1; done
  cp "$DEV/tune.log" "$OUT/tune_$wl.log"
  step "tune exit $(cat "$DEV/tune.rc" 2>/dev/null || echo 'still running')"
  grep -E "^study |^best:|^final:" "$OUT/tune_$wl.log" | cut -c1-200
  for b in $(buckets); do
    timeout 150 $E python3 -m tuner.cli compare --study "$wl-$b" --backends fa3 --warmup 50 \
      --repeat 200 --rounds 3 --settle-s 1 > "$OUT/cmp_$b.log" 2>&1
    step "$b exit $?"; grep -E "^│ fa-tune|^│ FlashAttention" "$OUT/cmp_$b.log" | cut -c1-200
  done
  ;;
esac
step done
