#!/usr/bin/env bash
# Session 31's calls (docs/PERF.md step 65): where the 128-key window and the paged cache wait.
#   call 1, carry [".whl", ".fa3/part1"]:  bash lab/h200/s31.sh profile1
#     ncu (fa-tune profile, one launch, --set full) of d64-window3 and d64-window at
#     1x64/8x8192:d64:w128: pipe shares, L2 traffic and warp stalls of three CTAs against two
#   call 2, carry [".fa3/part2"]:  bash lab/h200/s31.sh profile2
#     the same beside FA3 (d64-window3 --vs fa3), then llama3 beside FA3 at
#     4x32/8x2048:k8192 with pages of 128 and 64 and unpaged (issue 37's rows)
#   carry [".whl"] (or after call 2 on its machine, FA3 then beside it): bash lab/h200/s31.sh sass
#     d64-window3 and FA3 at 1x64/8x8192:d64:w128, warp stalls per SASS instruction
#     (lab/h200/sass_profile.py: ncu's source page summed by opcode, phase and reason)
#   carry [".whl", ".base/operands"]:  bash lab/h200/s31.sh ab
#     step 65's two changes (the epilogue's deferred store wait, the dynamic scheduler's tile
#     published decoded) against HEAD before them (.base/operands = `git archive 1cc6c93`, docs
#     left out): gated on uneven shapes, then A B B A in one process (scripts/ab_libs.py) at the
#     128-key window (d64-window3, d64-window) and at 1x32/8x8192 (llama3, dynamic)
#   carry [".whl", ".base/s31a"]:  bash lab/h200/s31.sh ab2
#     a window's masked column groups skipped in the softmax (step 65's third change) against
#     the first two (.base/s31a): gated on uneven window shapes (causal, non-causal, softcap,
#     S_q < S_k, sinks), then A B B A at the 128-key window (d64-window3, d64-window)
#   carry [".whl", ".base/head"] (.base/head = `git archive HEAD` without docs/):
#                                         bash lab/h200/s31.sh skip
#     lab/patches/masked-skip.patch (a masked window tile folded in as two halves, a half
#     skipped by a branch where no row of the warp sees a key in it) applied in the device's
#     copy: d64-window gated on uneven window shapes, then A B B A against HEAD's at the
#     128-key window. d64-window3 spills with the patch (136 registers), so only d64-window.
#   carry [".whl"]:  bash lab/h200/s31.sh sasspaged
#     llama3's warp stalls per SASS instruction at 4x32/8x2048:k8192 with pages of 128 and
#     unpaged (sass_profile.py), to find the paged kernel's 5 % more cycles (step 65)
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
snap() {  # TREE NAME SHAPE PRESETS...: one snapshot (libraries + SASS) per tree and class
  local tree=$1 name=$2 shape=$3; shift 3
  (cd "$tree" && PYTHONPATH="$DEV/site:$PWD" timeout 200 python3 scripts/sass_snapshot.py \
     --fixed --shape "$shape" --out "$DEV/ab-$name" --cache "$DEV/abcache-$name" "$@" \
     > "$OUT/build_$name.log" 2>&1; echo "$name built: exit $?")
}
# A change at the 128-key window: BASE's libraries of PRESETS against this tree's, gated on
# uneven window shapes (causal, non-causal, softcap, S_q < S_k, sinks), then A B B A in one
# process (scripts/ab_libs.py); logs $OUT/TAG_gate.log and $OUT/TAG.log.
window_ab() {  # BASE TAG PRESETS...
  local base=$1 tag=$2; shift 2
  local presets=("$@")
  snap "$base" "$tag-before" 1x64/8x8192:d64:w128 "${presets[@]}" &
  snap . "$tag-after" 1x64/8x8192:d64:w128 "${presets[@]}" &
  wait; step built
  local quick=(--no-fa3 --warmup 1 --repeat 2 --rounds 1 --settle-s 0 --jobs "$(nproc)") v=() sh x
  for x in "${presets[@]}"; do v+=(--variant "$x"); done
  for sh in "1x3x1152:d64:w128:sinks 2x5x1000:d64:w128 1x2/1x77:k300:d64:w128:sinks 2x16x2000:d64:w100" \
            "2x5x1000:d64:w128:full 1x4/2x700:k1500:d64:w77:full" "2x6/2x999:d64:w128:cap50 1x8/8x3000:d64:w60:cap50"; do
    local args=(); for x in $sh; do args+=(--shape "$x"); done
    timeout 120 $E python3 scripts/kernel_lab.py "${v[@]}" "${quick[@]}" "${args[@]}" \
      >> "$OUT/${tag}_gate.log" 2>&1
  done
  step "gate: $(grep -c "'gate': 'ok'" "$OUT/${tag}_gate.log") ok"
  grep -E "FAIL|rror" "$OUT/${tag}_gate.log" | cut -c1-240 || echo "all passed"
  timeout 150 $E python3 scripts/ab_libs.py "$DEV/ab-$tag-before" "$DEV/ab-$tag-after" --pairs 3 \
    --settle-s 0.5 > "$OUT/$tag.log" 2>&1
  step "$tag exit $?"; tail -5 "$OUT/$tag.log"
}
prof() {  # NAME ARGS...: one fa-tune profile, its table in $OUT/prof_NAME.log
  local name=$1; shift
  timeout 200 $E python3 -m tuner.cli profile "$@" > "$OUT/prof_$name.log" 2>&1
  step "profile $name: exit $?"; tail -n 40 "$OUT/prof_$name.log" | cut -c1-160
}
case "${1:?profile1 | profile2 | sass | sasspaged | ab | ab2 | skip}" in
profile1)
  FIRST_CALL="s31.sh profile1 with .whl"
  source "$LAB/session_calls.sh"
  prof w3 --preset d64-window3 --shape 1x64/8x8192:d64:w128
  prof w2 --preset d64-window --shape 1x64/8x8192:d64:w128
  ;;
profile2)
  FIRST_CALL="s31.sh profile1"
  source "$LAB/session_calls.sh"
  fa3_once
  prof w3fa3 --preset d64-window3 --shape 1x64/8x8192:d64:w128 --vs fa3
  for s in 4x32/8x2048:k8192:p128 4x32/8x2048:k8192:p64 4x32/8x2048:k8192; do
    prof "${s//[:\/]/_}" --preset llama3 --shape "$s" --vs fa3
  done
  ;;
sass)
  FIRST_CALL="s31.sh profile1"
  source "$LAB/session_calls.sh"
  peer=(); [ -f "$DEV/fa3.ok" ] && peer=(--fa3)  # FA3's page too where call 2 installed it
  OUT=$OUT timeout 300 $E python3 lab/h200/sass_profile.py lab/h200/variants/w128_s31.txt \
    1x64/8x8192:d64:w128 0 "${peer[@]}" > "$OUT/sass_w128.log" 2>&1
  step "sass: exit $?"; xz -9 "$OUT"/sass_*.csv; tail -n 60 "$OUT/sass_w128.log" | cut -c1-200
  ;;
ab)
  FIRST_CALL="s31.sh ab with .whl"
  source "$LAB/session_calls.sh"
  snap .base/operands old-w 1x64/8x8192:d64:w128 d64-window3 d64-window &
  snap . new-w 1x64/8x8192:d64:w128 d64-window3 d64-window &
  snap .base/operands old-l 1x32/8x8192 llama3 dynamic &
  snap . new-l 1x32/8x8192 llama3 dynamic &
  wait; step built
  quick=(--no-fa3 --warmup 1 --repeat 2 --rounds 1 --settle-s 0 --jobs "$(nproc)")
  for sh in "1x3x1152:d64:w128:sinks 2x5x1000:d64:w128 1x2/1x77:k300:d64:w128:sinks 2x16x2000:d64:w128" \
            "2x5x1000 3x4/1x777 1x3x77 2x8/2x1000:k3000"; do
    args=(); for x in $sh; do args+=(--shape "$x"); done
    v=(--variant dynamic); [[ "$sh" == *d64* ]] && v=(--variant d64-window3 --variant d64-window)
    [[ "$sh" != *d64* ]] && v+=(--variant llama3)
    timeout 120 $E python3 scripts/kernel_lab.py "${v[@]}" "${quick[@]}" "${args[@]}" \
      >> "$OUT/ab_gate.log" 2>&1
  done
  step "gate: $(grep -c "'gate': 'ok'" "$OUT/ab_gate.log") ok"
  grep -E "FAIL|rror" "$OUT/ab_gate.log" | cut -c1-240 || echo "all passed"
  for c in w l; do
    $E python3 scripts/sass_snapshot.py --compare "$DEV/ab-old-$c" "$DEV/ab-new-$c" | tail -3
    timeout 150 $E python3 scripts/ab_libs.py "$DEV/ab-old-$c" "$DEV/ab-new-$c" --pairs 2 \
      --settle-s 0.5 --json "$OUT/ab_$c.json" > "$OUT/ab_$c.log" 2>&1
    step "ab $c exit $?"; tail -8 "$OUT/ab_$c.log"
  done
  ;;
ab2)
  FIRST_CALL="s31.sh ab2 with .whl"
  source "$LAB/session_calls.sh"
  window_ab .base/s31a ab2 d64-window3 d64-window
  ;;
sasspaged)
  FIRST_CALL="s31.sh sasspaged with .whl"
  source "$LAB/session_calls.sh"
  for sh in 4x32/8x2048:k8192:p128 4x32/8x2048:k8192; do
    OUT=$OUT timeout 250 $E python3 lab/h200/sass_profile.py lab/h200/variants/paged_s31.txt \
      "$sh" 0 > "$OUT/sass_${sh//[:\/]/_}.log" 2>&1
    step "sass $sh: exit $?"; tail -n 30 "$OUT/sass_${sh//[:\/]/_}.log" | cut -c1-200
    # sass_profile.py names its page by the variants file: one page per shape here.
    mv "$OUT/sass_paged_s31_0.csv" "$OUT/page_${sh//[:\/]/_}.csv" 2>/dev/null
    rm -f "$OUT"/sass_paged_s31_0.ncu-rep
  done
  xz -9 "$OUT"/page_*.csv
  ;;
skip)
  FIRST_CALL="s31.sh skip with .whl"
  source "$LAB/session_calls.sh"
  git apply lab/patches/masked-skip.patch 2>/dev/null || patch -p1 --forward -s < lab/patches/masked-skip.patch
  window_ab .base/head skip d64-window
  ;;
*)
  echo "s31.sh: unknown call '$1': profile1, profile2, sass, sasspaged, ab, ab2 or skip" >&2; exit 2 ;;
esac
