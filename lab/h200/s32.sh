#!/usr/bin/env bash
# Session 32's calls (docs/PERF.md step 66).
#   carry [".whl"]:  bash lab/h200/s32.sh pagedsched
#     Is the paged kernel's 5 % (step 65) the pages or the device-side schedule? A paged row
#     runs the packed (device-scheduled) kernel, the unpaged fixed-length row the host's static
#     lists. llama3, no FA3, 1 s settle, 50 + 3 x 200, two processes that share the fixed row:
#     (1) a paged library: fixed 4x32/8x2048:k8192 against the same with pages of 128 and 64;
#     (2) a varlen library: the fixed row against its packed twin 32/8x[2048:8192*4].
#   carry [".whl", ".base/head"] (.base/head = `git archive 6ffcd30` without docs/):
#     (lab/patches/PATCH.patch applied in the device's copy; PATCH: varlen-tail-deal, or
#     varlen-pair-swaps, the evened deal of step 66's model)
#                                         bash lab/h200/s32.sh deal [PATCH]
#     the static varlen deal's tail dealt again, longest first (varlen.cuh, step 66): llama3
#     before (.base/head) and after, built per shape; the clustered presets gated on packed and
#     paged shapes whose lists are dealt (and one that is not); then A B B A in one process
#     (scripts/ab_libs.py: 3 turns, 0.5 s settle) at pages of 128, the packed twin, the mixed
#     batch over pages of 64, a short paged row (R = 2: the deal's own cost in sight) and eight
#     packed prompts of 1024 (the model's worst snake: 29 %) and four of 2048 without a prefix
#     (the model: 17 %); then the changed deal's task
#     clocks (variants/clocks_s32.txt) at the packed twin and the eight prompts
#   carry [".whl"]:  bash lab/h200/s32.sh gap
#     the fixed row against its packed twin per preset (llama3, default, dynamic, gqa-cluster,
#     multicast, static), no FA3, 1 s settle, 50 + 3 x 200: which schedulers lose when packed
#   carry [".whl"]:  bash lab/h200/s32.sh clocks
#     task clocks (FA_TUNE_LAB_TASK_CLOCKS: each CTA stamps its tasks' starts and its end;
#     scripts/task_clocks.py) of llama3, static and dynamic (variants/clocks_s32.txt), each
#     with the plain llama3 as the untouched reference, at the fixed row and its packed twin
#     (a varlen library; also 4x32/8x2048 and its packed twin, the model's 17 %), then at pages
#     of 128 (a paged library): does the device-side
#     schedule lose its 3.7-6.3 % in the tail (CTAs idle while others finish), in each task,
#     or at the start? (kernel_lab, 1 s settle, 50 + 3 x 200; the stamps: the last launch)
#   carry [".whl"]:  bash lab/h200/s32.sh dealtests [PATCH]   (the patch applied, as deal does)
#     test_varlen_gpu.py and test_paged_gpu.py on the changed schedule
#   after fa3_stage1.sh (carry [".whl", ".fa3/part1"]), carry [".fa3/part2"]:
#                                         bash lab/h200/s32.sh w128hc
#     the 128-key window at the power cap: d64-window3 against three static CTAs an SM with and
#     without 2-head clusters (K/V multicast), beside FA3 (variants/w128_hc_s32.txt; kernel_lab,
#     1 s settle, 50 + 3 x 200; each row's MHz and W), with and without sinks
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The timing protocol: 1 s settle, 50 + 3 x 200.
FULL=(--warmup 50 --repeat 200 --rounds 3 --settle-s 1 --jobs "$(nproc)")
apply_patch() {  # NAME: lab/patches/NAME.patch, applied in the device's copy only
  local fix=lab/patches/$1.patch
  git apply "$fix" 2>/dev/null || patch -p1 --forward -s < "$fix" || { echo "$fix: no apply"; exit 2; }
}
case "${1:?pagedsched | deal | gap | clocks | w128hc | dealtests}" in
pagedsched)
  FIRST_CALL="s32.sh pagedsched with .whl"
  source "$LAB/session_calls.sh"
  timeout 200 $E python3 scripts/kernel_lab.py --variant llama3 --no-fa3 "${FULL[@]}" \
    --shape 4x32/8x2048:k8192 --shape 4x32/8x2048:k8192:p128 --shape 4x32/8x2048:k8192:p64 \
    --shape 4x32/8x2048:k8192 > "$OUT/paged_lab.log" 2>&1
  step "paged library: exit $?"; grep -E "^[0-9]+x|^[0-9]+/" "$OUT/paged_lab.log" | cut -c1-120
  timeout 200 $E python3 scripts/kernel_lab.py --variant llama3 --no-fa3 "${FULL[@]}" \
    --shape 4x32/8x2048:k8192 --shape "32/8x[2048:8192*4]" --shape 4x32/8x2048:k8192 \
    > "$OUT/packed_lab.log" 2>&1
  step "varlen library: exit $?"; grep -E "^[0-9]+x|^[0-9]+/" "$OUT/packed_lab.log" | cut -c1-120
  ;;
deal)
  FIRST_CALL="s32.sh deal with .whl"
  source "$LAB/session_calls.sh"
  # Applied in the device's copy only: varlen-tail-deal (measured, not merged: docs/PERF.md
  # step 66) or, named as $2, varlen-pair-swaps (landed in step 67; the patch as it was:
  # git show b99b919:lab/patches/varlen-pair-swaps.patch).
  apply_patch "${2:-varlen-tail-deal}"
  snap() {  # TREE NAME SHAPE: llama3's library for SHAPE's class, from TREE (its log in
    # $DEV/builds, printed on failure: $OUT returns at most 8 files, step 67 lost the A/B's)
    mkdir -p "$DEV/builds"
    (cd "$1" && PYTHONPATH="$DEV/site:$PWD" timeout 240 python3 scripts/sass_snapshot.py \
       --shape "$3" --out "$DEV/ab-$2" --cache "$DEV/abcache-$2" llama3 > "$DEV/builds/$2.log" 2>&1 \
       || { echo "$2: build exit $?"; tail -5 "$DEV/builds/$2.log"; })
  }
  shapes=("4x32/8x2048:k8192:p128" "32/8x[2048:8192*4]" "4x32/8x256:k2048:p128"
          "32/8x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,3072:4096,6144:14336]:p64"
          "32/8x[1024*8]" "32/8x[2048*4]")
  for i in "${!shapes[@]}"; do
    snap .base/head "b$i" "${shapes[$i]}" &
    snap . "a$i" "${shapes[$i]}" &
  done
  wait; step built
  quick=(--no-fa3 --warmup 1 --repeat 2 --rounds 1 --settle-s 0 --jobs "$(nproc)")
  for sh in "32/8x[2048:8192*4] 32/8x[3000:7001,100:9000,2500,4096*3] 32/8x[1024*8,512*16] 2x32/8x3000:k9000" \
            "4x32/8x2048:k8192:p128 32/8x[2048:8192,512:4096*2,3000:9000]:p16 32/8x[2048:8192*3,100:20000]:p64 8x32/8x1000:k5000:p256 4x32/8x256:k2048:p128"; do
    args=(); for x in $sh; do args+=(--shape "$x"); done
    timeout 150 $E python3 scripts/kernel_lab.py --variant llama3 --variant gqa-cluster \
      --variant multicast "${quick[@]}" "${args[@]}" >> "$OUT/deal_gate.log" 2>&1
  done
  step "gate: $(grep -c "'gate': 'ok'" "$OUT/deal_gate.log") ok"
  grep -E "FAIL|rror" "$OUT/deal_gate.log" | cut -c1-240 || echo "all passed"
  for i in "${!shapes[@]}"; do
    timeout 100 $E python3 scripts/ab_libs.py "$DEV/ab-b$i" "$DEV/ab-a$i" --pairs 3 \
      --settle-s 0.5 >> "$OUT/deal_ab.log" 2>&1
    step "A/B ${shapes[$i]}: exit $?"
  done
  grep -E "^llama3" "$OUT/deal_ab.log"
  # The changed deal's own task clocks (one launch after 30 + 100) at the packed twin.
  timeout 100 $E python3 scripts/kernel_lab.py --variants-file lab/h200/variants/clocks_s32.txt \
    --no-fa3 --warmup 30 --repeat 100 --rounds 1 --settle-s 0.5 --jobs "$(nproc)" \
    --shape "32/8x[2048:8192*4]" --shape "32/8x[1024*8]" --shape "32/8x[2048*4]" \
    > "$OUT/deal_clocks.log" 2>&1
  step "clocks: exit $?"; grep -E "task clocks" "$OUT/deal_clocks.log" | cut -c1-230
  ;;
gap)
  FIRST_CALL="s32.sh gap with .whl"
  source "$LAB/session_calls.sh"
  # Which presets lose on the device-scheduled kernel: each preset at the fixed row and its
  # packed twin in one process (a varlen library serves both).
  for vs in "llama3 default dynamic" "gqa-cluster multicast static"; do
    v=(); for x in $vs; do v+=(--variant "$x"); done
    timeout 200 $E python3 scripts/kernel_lab.py "${v[@]}" --no-fa3 "${FULL[@]}" \
      --shape 4x32/8x2048:k8192 --shape "32/8x[2048:8192*4]" >> "$OUT/gap.log" 2>&1
    step "$vs: exit $?"
  done
  grep -E "^4x32|^32/8" "$OUT/gap.log" | cut -c1-110
  ;;
clocks)
  FIRST_CALL="s32.sh clocks with .whl"
  source "$LAB/session_calls.sh"
  v=(--variants-file lab/h200/variants/clocks_s32.txt --variant llama3)
  timeout 280 $E python3 scripts/kernel_lab.py "${v[@]}" --no-fa3 "${FULL[@]}" \
    --shape 4x32/8x2048:k8192 --shape "32/8x[2048:8192*4]" --shape "32/8x[1024*8]" \
    --shape 4x32/8x2048 --shape "32/8x[2048*4]" > "$OUT/clocks_varlen.log" 2>&1
  step "varlen library: exit $?"
  timeout 200 $E python3 scripts/kernel_lab.py "${v[@]}" --no-fa3 "${FULL[@]}" \
    --shape 4x32/8x2048:k8192:p128 > "$OUT/clocks_paged.log" 2>&1
  step "paged library: exit $?"
  grep -hE "task clocks|^4x32|^32/8" "$OUT"/clocks_*.log | cut -c1-230
  ;;
w128hc)
  FIRST_CALL="s32.sh w128hc after fa3_stage1.sh with .whl"
  source "$LAB/session_calls.sh"
  fa3_once
  timeout 400 $E python3 scripts/kernel_lab.py --variants-file lab/h200/variants/w128_hc_s32.txt \
    "${FULL[@]}" --shape 1x64/8x8192:d64:w128 --shape 1x64/8x8192:d64:w128:sinks \
    > "$OUT/w128hc.log" 2>&1
  step "w128hc: exit $?"; grep -E "^1x64|FAIL" "$OUT/w128hc.log" | cut -c1-140
  ;;
dealtests)
  FIRST_CALL="s32.sh dealtests with .whl"
  source "$LAB/session_calls.sh"
  apply_patch "${2:-varlen-tail-deal}"
  timeout 200 $E python3 lab/h200/prebuild.py paged > "$OUT/prebuild_paged.log" 2>&1
  step "prebuild paged exit $?"
  gpu_tests deal_tests.log 380 tests/gpu/test_varlen_gpu.py tests/gpu/test_paged_gpu.py
  ;;
*)
  echo "s32.sh: unknown call '$1': pagedsched, deal, gap, clocks, w128hc or dealtests" >&2; exit 2 ;;
esac
