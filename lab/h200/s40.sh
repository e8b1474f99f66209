#!/usr/bin/env bash
# GPU calls of docs/PERF.md steps 74 (host code at -O1, lab/patches/host-o1.patch) and 75.
#   carry [".whl"]:  bash lab/h200/s40.sh hostopt [SHAPE...]
#   carry [".whl"]:  bash lab/h200/s40.sh wslope   (step 75: a window task's cost, split)
# The presets built from this tree and from a copy with the patch, at each SHAPE's class (one
# nvcc per core, as a search builds: the wall of each set is the compile's A/B on this host),
# their SASS compared (it must be the same), then both libraries timed A B B A in one process
# (scripts/ab_libs.py) at the short shapes, where a slower launch would show first: a kernel of
# tens of microseconds is fed by launches of a few.
set -uo pipefail
FIRST_CALL="s40.sh hostopt with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?hostopt | wslope}" in
hostopt)
  shift
  shapes=("$@"); [ ${#shapes[@]} -gt 0 ] || shapes=(1x32/8x512 1x64/8x512:d64)
  after=$DEV/host_o1
  rm -rf "$after"; mkdir -p "$after"
  cp -a tuner cuda_src scripts templates search_spaces workloads pyproject.toml "$after"/
  pf=$PWD/lab/patches/host-o1.patch
  (cd "$after" && { patch -p1 -s < "$pf" 2>/dev/null || git apply "$pf"; }) \
    || { echo "host-o1.patch did not apply"; exit 1; }
  grep -q '"-O1"' "$after/tuner/kernel/build.py" || { echo "host-o1.patch not applied"; exit 1; }
  for s in "${shapes[@]}"; do
    tag=$(echo "$s" | tr '/:' '__')
    presets="llama3 default"; [[ "$s" == *:d64* ]] && presets="d64 d64-window3"
    for side in before after; do
      root=$PWD; [ $side = after ] && root=$after
      start=$SECONDS
      $E bash -c 'PYTHONPATH=$0:$PYTHONPATH python3 "$0/scripts/sass_snapshot.py" --out "$1" \
        --cache "$2" --shape "$3" $4' "$root" "$DEV/snap_${side}_$tag" \
        "$DEV/cache_${side}_$tag" "$s" "$presets" > "$OUT/snap_${side}_$tag.log" 2>&1
      step "$s $side: snapshot exit $? in $((SECONDS - start)) s"
    done
    $E python3 scripts/sass_snapshot.py --compare "$DEV/snap_before_$tag" "$DEV/snap_after_$tag" \
      2>&1 | tee "$OUT/sass_$tag.txt" | tail -5
    timeout $((560 - (SECONDS - t0))) $E python3 scripts/ab_libs.py "$DEV/snap_before_$tag" \
      "$DEV/snap_after_$tag" --pairs 2 --json "$OUT/ab_$tag.json" > "$OUT/ab_$tag.log" 2>&1
    step "$s: ab exit $?"; tail -8 "$OUT/ab_$tag.log" | cut -c1-160
  done
  ;;
wslope)
  # Step 75: d64-window3 at windows of 64 to 384 keys (2 to 7 KV tiles a 64-row task, the
  # task count fixed): the slope is a tile's cost, the intercept a task's own (Q, the
  # epilogue, the schedule). Their ratio says how much a task of fewer key columns (step 75's
  # queries of a GQA group packed into one tile) can gain. No FA3: only the kernel's times.
  shapes=(); for w in 64 128 192 256 384; do shapes+=(--shape "1x64/8x8192:d64:w$w"); done
  printf 'd64-window3\nd64-window\n' > "$DEV/wslope.txt"
  OUT=$OUT timeout 500 $E python3 scripts/kernel_lab.py --variants-file "$DEV/wslope.txt" \
    --no-fa3 "${shapes[@]}" --warmup 50 --repeat 200 --rounds 3 --settle-s 1 \
    > "$OUT/wslope.log" 2>&1
  step "wslope: exit $?"; grep -v '^  [0-9a-f]\{12\}: {' "$OUT/wslope.log" | tail -n 20
  ;;
*)
  echo "s40.sh: unknown call '$1': hostopt | wslope" >&2; exit 2 ;;
esac
