#!/usr/bin/env bash
# Session 48's kernel experiment (docs/PERF.md step 82's next steps, issue 37): the paged
# producer's page lookups, one per lane at once (lab/patches/page-lookup.patch), against main.
# Two calls on one warm machine:
#   carry [".whl"]  bash lab/h200/s48.sh pages
#       main's tree and a copy with the patch (.device/page-lookup), the paged class of llama3
#       built from each at pages of 16, 32, 64 and 128 (`4x32/8x2048:k8192:pP`), gated and timed
#       A B A B (scripts/ab_libs.py, 3 pairs, 0.5 s settle); its table last per page size
#   bash lab/h200/s48.sh pagetests   the paged GPU tests on the patched copy (page sizes 8 to
#       256, fixed and packed, multicast and head clusters, masks over pages, bad tables)
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL="s48.sh pages with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
COPY=$DEV/page-lookup
stage() {  # the patched copy of this tree, once
  [ -f "$COPY/.patched" ] && return 0
  rm -rf "$COPY" && mkdir -p "$COPY"
  cp -r cuda_src tuner scripts tests templates search_spaces workloads pyproject.toml setup.py \
    "$COPY/" && (cd "$COPY" && patch -p1 -s < "$LAB/../patches/page-lookup.patch") \
    && touch "$COPY/.patched" || { echo "staging the patched copy failed"; exit 1; }
}
case "${1:?pages | pagetests}" in
pages)
  stage
  for tree in main page; do
    dir=$PWD; [ $tree = page ] && dir=$COPY
    (cd "$dir" && for pg in 16 32 64 128; do
       PYTHONPATH="$DEV/site:$dir" timeout 240 python3 scripts/sass_snapshot.py \
         --shape "4x32/8x2048:k8192:p$pg" --out "$DEV/abl-$tree-$pg" --cache "$DEV/ablcache-$tree" \
         llama3 > "$OUT/build_${tree}_$pg.log" 2>&1 || echo "$tree p$pg build failed"
     done; echo "$tree built") &
  done
  wait; step built
  for pg in 16 32 64 128; do
    timeout 120 $E python3 scripts/ab_libs.py "$DEV/abl-main-$pg" "$DEV/abl-page-$pg" --pairs 3 \
      --settle-s 0.5 --json "$OUT/ab_p$pg.json" > "$OUT/ab_p$pg.log" 2>&1
    step "p$pg exit $?"; tail -3 "$OUT/ab_p$pg.log" | cut -c1-160
  done ;;
pagetests)
  stage
  (cd "$COPY" && PYTHONPATH="$DEV/site:$COPY" timeout 540 python3 -m pytest -q -s -m gpu \
    -p no:cacheprovider --durations=5 tests/gpu/test_paged_gpu.py tests/gpu/test_paged_op_gpu.py \
    > "$OUT/paged_tests.log" 2>&1)
  step "paged GPU tests exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/paged_tests.log" | tail -8 ;;
*) echo "s48.sh: unknown call '$1': pages or pagetests" >&2; exit 2 ;;
esac
step done
