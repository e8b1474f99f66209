#!/usr/bin/env bash
# Session 48's kernel experiments (docs/PERF.md step 82's next steps), each a patch in
# lab/patches/ timed against main in one process. Calls on one warm machine, the first
# carrying [".whl"]:
#   (`pages`, page-lookup.patch against main at pages of 16-128, landed in step 85)
#   bash lab/h200/s48.sh qpf         q-prefetch.patch (the next task's Q prefetched into L2 while
#       its buffer is busy; issue 36): d64-window-shared and d64-window-packed at the 128-key
#       window, `static` at the short packed batch, llama3 at `1x32/8x8192` (a control: long
#       tasks, nothing to gain)
#   bash lab/h200/s48.sh qpfw        the window row alone, 8 pairs (step 85: 0.974 over 3)
#   bash lab/h200/s48.sh tests PATCH FILES...   GPU tests on a patched copy, e.g.
#       `tests q-prefetch tests/gpu/test_pack_gqa_gpu.py tests/gpu/test_varlen_gpu.py`
# Each A/B: main's tree and a patched copy (.device/patched-PATCH) build the named presets for
# a problem's class (scripts/sass_snapshot.py), then scripts/ab_libs.py gates both and times
# them A B A B (3 pairs, 8 for qpfw; 0.5 s settle); its table last. Logs land in $OUT.
set -uo pipefail
FIRST_CALL="s48.sh qpf with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
stage() {  # PATCH: a copy of this tree with lab/patches/PATCH.patch applied, once
  local copy=$DEV/patched-$1
  [ -f "$copy/.patched" ] && return 0
  rm -rf "$copy" && mkdir -p "$copy"
  cp -r cuda_src tuner scripts tests templates search_spaces workloads pyproject.toml setup.py \
    "$copy/" && (cd "$copy" && patch -p1 -s < "$LAB/../patches/$1.patch") \
    && touch "$copy/.patched" || { echo "staging $1 failed"; exit 1; }
}
ab() {  # PATCH SHAPE PRESET...: main against the patch on SHAPE's class, A B A B
  local patch=$1 shape=$2 tag=${2//[:\/\[\],*]/_}; shift 2
  stage "$patch"
  for tree in main "$patch"; do
    local dir=$PWD; [ "$tree" = main ] || dir=$DEV/patched-$patch
    (cd "$dir" && PYTHONPATH="$DEV/site:$dir" timeout 240 python3 scripts/sass_snapshot.py \
       --shape "$shape" --out "$DEV/ab-$tree-$tag" --cache "$DEV/abcache-$tree" "$@" \
       > "$OUT/build_${tree}_$tag.log" 2>&1 || echo "$tree $shape: build failed") &
  done
  wait
  timeout 150 $E python3 scripts/ab_libs.py "$DEV/ab-main-$tag" "$DEV/ab-$patch-$tag" --pairs "$PAIRS" \
    --settle-s 0.5 --json "$OUT/ab_${patch}_$tag.json" > "$OUT/ab_${patch}_$tag.log" 2>&1
  step "$patch at $shape: exit $?"; tail -n $(($# + 2)) "$OUT/ab_${patch}_$tag.log" | cut -c1-160
}
PAIRS=3
case "${1:?qpf | qpfw | tests PATCH FILES...}" in
qpfw)  # the window row alone, 8 pairs (step 85's 0.974 over 3 pairs, to settle)
  PAIRS=8 ab q-prefetch 1x64/8x8192:d64:w128 d64-window-shared d64-window-packed ;;
qpf)
  ab q-prefetch 1x64/8x8192:d64:w128 d64-window-shared d64-window-packed
  ab q-prefetch "32/8x[1024*8,512*16,256*32,128*64]" static
  ab q-prefetch 1x32/8x8192 llama3 ;;
tests)
  patch=${2:?patch}; shift 2
  stage "$patch"
  (cd "$DEV/patched-$patch" && PYTHONPATH="$DEV/site:$PWD" timeout 540 python3 -m pytest -q -s \
    -m gpu -p no:cacheprovider --durations=5 "$@" > "$OUT/tests_$patch.log" 2>&1)
  step "$patch GPU tests exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests_$patch.log" | tail -8 ;;
*) echo "s48.sh: unknown call '$1': qpf, qpfw or tests" >&2; exit 2 ;;
esac
step done
