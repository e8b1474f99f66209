#!/usr/bin/env bash
# GPU calls of docs/PERF.md step 78 (issue 36: the packed window kernel's per-task chain).
#   carry [".whl"]:  bash lab/h200/s44.sh prof   (ncu's source page of d64-window-packed at the
#                    128-key window, summed by lab/h200/sass_profile.py; the page and the
#                    details page kept under $OUT)
#   carry [".whl", ".base/head"]:  bash lab/h200/s44.sh ab   (the masks' per-row limits: .base/head =
#                    `git archive` of the commit before, without docs/; the window presets
#                    built from both trees, this tree's gated on uneven window, sinks, softcap,
#                    non-causal and S_q < S_k problems, then A B B A in one process)
#   bash lab/h200/s44.sh tests   (after ab, same machine: the masks' and the packed kernels'
#                    GPU tests, their kernels prebuilt on every core)
#   carry [".whl"]:  bash lab/h200/s44.sh share   (variants/share_s44.txt: two warpgroups sharing
#                    each K/V tile at the 128-key window, gated on uneven problems, then timed
#                    beside d64-window-packed with and without sinks; no FA3; run from a copy of
#                    the tree with lab/patches/regs104.patch)
set -uo pipefail
FIRST_CALL="s44.sh prof with .whl"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
snap() {  # TREE NAME SHAPE PRESETS...: one snapshot (libraries + SASS) per tree and class
  local tree=$1 name=$2 shape=$3; shift 3
  (cd "$tree" && PYTHONPATH="$DEV/site:$PWD" timeout 200 python3 scripts/sass_snapshot.py \
     --fixed --shape "$shape" --out "$DEV/ab-$name" --cache "$DEV/abcache-$name" "$@" \
     > "$OUT/build_$name.log" 2>&1; echo "$name built: exit $?")
}
case "${1:?prof | ab | tests | share}" in
prof)
  OUT=$OUT timeout 400 $E python3 lab/h200/sass_profile.py lab/h200/variants/prof_s44.txt \
    1x64/8x8192:d64:w128 0 > "$OUT/sass_prof.log" 2>&1
  step "sass: exit $?"
  ncu=$($E python3 -c "from tuner.analysis.profile import find_ncu; print(find_ncu())")
  $ncu --import "$OUT/sass_prof_s44_0.ncu-rep" --csv --page details > "$OUT/details.csv" 2>&1
  rm -f "$OUT"/*.ncu-rep; xz -9 "$OUT"/*.csv
  tail -n 45 "$OUT/sass_prof.log" | cut -c1-200 ;;
ab)
  [ -d .base/head/cuda_src ] || { echo "carry .base/head (git archive of the commit before)"; exit 2; }
  presets=(d64-window-packed d64-window3)
  snap .base/head before 1x64/8x8192:d64:w128 "${presets[@]}" &
  snap . after 1x64/8x8192:d64:w128 "${presets[@]}" &
  wait; step built
  $E python3 scripts/sass_snapshot.py --compare "$DEV/ab-before" "$DEV/ab-after" | tail -3
  quick=(--no-fa3 --warmup 1 --repeat 2 --rounds 1 --settle-s 0 --jobs "$(nproc)"); v=()
  for x in "${presets[@]}"; do v+=(--variant "$x"); done
  for sh in "2x32/4x1000:d64:w100 1x12/3x777:k1500:d64:w300 3x6/1x513:d64:w17 1x16x300:d64:w64" \
            "1x16/1x1000:d64:w1 1x8/1x200:d64:w1000 2x12/3x333:k400:d64:w50:sinks 1x2/1x77:k300:d64:w128:sinks" \
            "2x5x1000:d64:w128:full 1x4/2x700:k1500:d64:w77:full 2x6/2x999:d64:w128:cap50 2x16x2000:d64"; do
    args=(); for x in $sh; do args+=(--shape "$x"); done
    timeout 150 $E python3 scripts/kernel_lab.py "${v[@]}" "${quick[@]}" "${args[@]}" \
      >> "$OUT/gate.log" 2>&1
  done
  step "gate: $(grep -c "'gate': 'ok'" "$OUT/gate.log") ok"
  grep -E "FAIL|rror|refuse" "$OUT/gate.log" | cut -c1-240 | head -8
  timeout 200 $E python3 scripts/ab_libs.py "$DEV/ab-before" "$DEV/ab-after" --pairs 4 \
    --settle-s 0.5 > "$OUT/ab.log" 2>&1
  step "ab exit $?"; tail -5 "$OUT/ab.log" ;;
tests)
  timeout 240 $E python3 lab/h200/prebuild.py masks > "$OUT/prebuild_masks.log" 2>&1
  step "prebuild masks: exit $?"; tail -2 "$OUT/prebuild_masks.log"
  gpu_tests masks_gpu.log $((400 - (SECONDS - t0))) tests/gpu/test_masks_gpu.py
  gpu_tests pack_gqa_gpu.log $((575 - (SECONDS - t0))) tests/gpu/test_pack_gqa_gpu.py ;;
share)
  # consumer_regs 104 is outside the knob's range (every value of a knob must be one validate()
  # admits somewhere: tests/knob_sample.py), so the variants run from a copy of the tree with
  # lab/patches/regs104.patch, which widens it.
  tree=$DEV/regs104
  bash "$LAB/snapshot.sh" "$tree"
  (cd "$tree" && patch -p1 -s < "$LAB/../patches/regs104.patch") || { echo "regs104.patch did not apply"; exit 1; }
  V=$PWD/lab/h200/variants/share_s44.txt
  cd "$tree"
  window_gate share_gate.log 200 $V
  lab share_w128.log 250 --variants-file $V --shape 1x64/8x8192:d64:w128 \
    --shape 1x64/8x8192:d64:w128:sinks --warmup 50 --repeat 200 --rounds 3 --settle-s 1 ;;
*) echo "s44.sh: unknown call '$1': prof, ab, tests or share" >&2; exit 2 ;;
esac
