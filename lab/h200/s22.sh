#!/usr/bin/env bash
# The kernel with less of CuTe's layout algebra (issue 38's compile time, docs/PERF.md step 53),
# before against after on the H200, in back-to-back calls on one warm machine. Two changes to
# check, each against the tree before it:
#   main          the epilogue's stmatrix by hand (o_stage.cuh); .base = ae90c71
#   wip/operands  also the operands and fragments by hand (operands.cuh); .base = main
# (`git archive REV tuner cuda_src templates search_spaces pyproject.toml
#  scripts/sass_snapshot.py | tar -x -C .base`, with the other one checked out):
#   1  carry [".whl", ".base"]   bash lab/h200/s22.sh ab [BEFORE [AFTER]]
#        BEFORE, AFTER: source trees (default .base and this checkout; .base/NAME folders let
#        one call compare two pairs, e.g. `ab .base/ae90c71 .base/main` then `ab .base/main .`
#        with wip/operands checked out). Installs our wheels; builds every preset from both
#        trees with all cores (scripts/sass_snapshot.py; a tree built before is a cache hit),
#        compares their SASS, gates both kernels of each preset and times them A B B A in one
#        process (scripts/ab_libs.py)
#   2  (no carry)                bash lab/h200/s22.sh tests
#        the GPU tests of the kernel's pieces: the oracle and planted bugs, every scheduler and
#        cluster kind, q_in_regs and sum_in_pv among them, varlen, the models' masks, the op
# Then issue 37's calls (lab/h200/s21.sh) on the same warm machine. Logs land in $OUT.
set -uo pipefail
FIRST_CALL=ab
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?ab [BEFORE [AFTER]]|tests}" in
ab)
  BEFORE=${2:-.base} AFTER=${3:-.}
  [ -d "$BEFORE/cuda_src" ] || { echo "$BEFORE is not a source tree: carry [\".whl\", \".base\"]"; exit 2; }
  name_of() {  # a tree's snapshot name: its folder's, "checkout" for this one
    if [ "$(cd "$1" && pwd)" = "$PWD" ]; then echo checkout; else basename "$(cd "$1" && pwd)"; fi
  }
  snap() {  # TREE -> builds its snapshot into $DEV/sass-NAME
    local tree name; tree=$(cd "$1" && pwd); name=$(name_of "$1")
    (cd "$tree" && PYTHONPATH="$DEV/site:$tree" timeout 200 python3 scripts/sass_snapshot.py \
       --out "$DEV/sass-$name" --cache "$DEV/cache-$name" > "$OUT/build_$name.log" 2>&1)
    step "$name built: exit $?"; tail -1 "$OUT/build_$name.log"
  }
  snap "$BEFORE"; snap "$AFTER"
  B=$DEV/sass-$(name_of "$BEFORE") A=$DEV/sass-$(name_of "$AFTER")
  tag=$(basename "$B")_vs_$(basename "$A")
  $E python3 scripts/sass_snapshot.py --compare "$B" "$A" > "$OUT/${tag}_sass.txt" 2>&1
  timeout $((580 - (SECONDS - t0))) $E python3 scripts/ab_libs.py "$B" "$A" --pairs 3 \
    --settle-s 0.5 --json "$OUT/${tag}_ab.json" > "$OUT/${tag}_ab.log" 2>&1
  step "ab_libs exit $?"
  tail -22 "$OUT/${tag}_ab.log"
  ;;
tests)
  timeout 150 $E python3 lab/h200/prebuild.py plain masks > "$OUT/prebuild.log" 2>&1
  step "prebuild exit $?"; grep -E "FAILED|local memory|built in|builds on" "$OUT/prebuild.log"
  gpu_tests kernel.log $((580 - (SECONDS - t0))) tests/gpu/test_planted_bugs_gpu.py \
    tests/gpu/test_oracle_gpu.py tests/gpu/test_schedulers_gpu.py tests/gpu/test_masks_gpu.py \
    tests/gpu/test_varlen_gpu.py tests/gpu/test_inference_op_gpu.py
  ;;
esac
step done
