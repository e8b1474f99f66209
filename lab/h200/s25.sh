#!/usr/bin/env bash
# Issue 38's two unmeasured benchmarks (docs/PERF.md step 58), on one warm machine (any call
# carrying .whl may carry .fa3/part1 too: it is parked for `pair`'s FA3 install):
#   carry [".whl"]  bash lab/h200/s25.sh cores
#       compile-only workers beside a GPU worker: `2x32/1x8192` from an empty study and empty
#       compile caches, twice for 210 s each: (a) the GPU worker alone on cores 0-3; (b) the
#       same GPU worker on cores 0-3 and a `worker --compile-only` on cores 4-15 with its own
#       compile cache (a second "host"), both on one file artifact store. Prints each run's
#       trials per hour and GPU busy (about 9.5 min: the call's whole limit).
#   carry [".whl"]  bash lab/h200/s25.sh twin SEED
#       one 8-minute search of `1x32/8x8192` from an empty study with sampler seed SEED
#       (run it twice, SEED 1 and 2, in two calls)
#   carry [".fa3/part2"] after fa3_stage1.sh: bash lab/h200/s25.sh pair
#       installs FA3; the two twins' picks (what `fa-tune export` ships) timed in one process
#       beside FA3 (kernel_lab, 1 s settle, 50 + 3 x 200): within 1 % of each other, or tied?
#   carry [".whl", ".base"]  bash lab/h200/s25.sh ab-paged [PRESET]
#       (a new checkout keeps no branches: unlanded work waits in lab/patches/)
#       lab/patches/page-ahead.patch (the block table read before the ring's wait) against
#       main, both trees staged here first: for t in main page; do mkdir -p .base/$t &&
#       git archive HEAD | tar -x -C .base/$t; done; (cd .base/page && patch -p1 <
#       ../../lab/patches/page-ahead.patch). Then the paged
#       class of PRESET (default llama3) is built from each, gated and timed A B B A at pages of
#       64, 128 and 256 (`4x32/8x2048:k8192:pP`), then the paged GPU tests on the branch
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL="cores or twin"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
SHAPE=2x32/1x8192
summary() { grep -E "^study |^best:|^final:" "$1" | cut -c1-240; }
case "${1:?cores|twin SEED|pair|ab-paged}" in
cores)
  W=$DEV/cores && rm -rf "$W" && mkdir -p "$W"
  # (a) the GPU worker alone on 4 cores (its --jobs follows its affinity: 4 nvcc at a time)
  if [ -z "${CORES_PAIR_ONLY:-}" ]; then
    FA_TUNE_STUDIES=$W/hostA taskset -c 0-3 timeout 270 $E python3 -m tuner.cli search \
      --study alone --storage "sqlite:///$W/alone.db" --shape $SHAPE --timeout 210s \
      > "$OUT/cores_alone.log" 2>&1
    step "alone exit $?"; summary "$OUT/cores_alone.log"
  fi
  # (b) the same, with 12 more cores as a compile-only host (own cache, shared store)
  url="sqlite:///$W/pair.db"
  mkdir -p "$W/store"  # an artifact store is a folder every host mounts: it must exist
  FA_TUNE_STUDIES=$W/hostB $E python3 -m tuner.cli search --study pair --storage "$url" \
    --shape $SHAPE --create-only > "$OUT/cores_create.log" 2>&1 || { cat "$OUT/cores_create.log"; exit 1; }
  FA_TUNE_STUDIES=$W/hostC taskset -c 4-15 timeout 270 $E python3 -m tuner.cli worker \
    --study pair --storage "$url" --compile-only --artifacts "$W/store" --timeout 210s \
    > "$OUT/cores_compile_only.log" 2>&1 &
  FA_TUNE_STUDIES=$W/hostB taskset -c 0-3 timeout 270 $E python3 -m tuner.cli worker \
    --study pair --storage "$url" --artifacts "$W/store" --timeout 210s \
    > "$OUT/cores_gpu_worker.log" 2>&1
  step "GPU worker exit $?"; wait; step "compile-only worker done"
  summary "$OUT/cores_gpu_worker.log"; summary "$OUT/cores_compile_only.log"
  cp "$W"/*.db "$OUT/" 2>/dev/null
  ;;
twin)
  seed=${2:?seed}
  timeout 580 $E python3 -m tuner.cli search --study "twin$seed" --shape 1x32/8x8192 \
    --seed "$seed" --timeout 480s > "$OUT/twin$seed.log" 2>&1
  step "twin $seed exit $?"; summary "$OUT/twin$seed.log"
  cp "studies/twin$seed.db" "$OUT/" 2>/dev/null
  ;;
pair)
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; exit 3; }
  $E python3 - > "$DEV/twins.txt" <<'EOF' || exit 1
import json
from tuner.search.trials import pick_trial
for s in ("twin1", "twin2"):
    _, t = pick_trial(s, None, None)  # what export ships
    print(json.dumps(t.user_attrs["config"]))
EOF
  cp "$DEV/twins.txt" "$OUT/"
  timeout 540 $E python3 scripts/kernel_lab.py --variants-file "$DEV/twins.txt" \
    --shape 1x32/8x8192 --rounds 3 --settle-s 1 > "$OUT/pair.log" 2>&1
  step "pair exit $?"; tail -6 "$OUT/pair.log" | cut -c1-160
  ;;
ab-paged)
  preset=${2:-llama3}
  for tree in main page; do
    (cd .base/$tree && for pg in 64 128 256; do
       PYTHONPATH="$DEV/site:$PWD" timeout 200 python3 scripts/sass_snapshot.py \
         --shape "4x32/8x2048:k8192:p$pg" --out "$DEV/abp-$tree-$pg" --cache "$DEV/abpcache-$tree" \
         "$preset" > "$OUT/build_${tree}_$pg.log" 2>&1 || echo "$tree p$pg build failed"
     done; echo "$tree built") &
  done
  wait; step built
  for pg in 64 128 256; do
    timeout 150 $E python3 scripts/ab_libs.py "$DEV/abp-main-$pg" "$DEV/abp-page-$pg" --pairs 3 \
      --settle-s 0.5 --json "$OUT/ab_p$pg.json" > "$OUT/ab_p$pg.log" 2>&1
    step "p$pg exit $?"; tail -3 "$OUT/ab_p$pg.log"
  done
  (cd .base/page && PYTHONPATH="$DEV/site:$PWD" timeout $((570 - (SECONDS - t0))) python3 -m pytest \
    -q -m gpu -p no:cacheprovider tests/gpu/test_paged_gpu.py tests/gpu/test_paged_op_gpu.py > "$OUT/paged_tests.log" 2>&1)
  step "paged GPU tests exit $?"; tail -3 "$OUT/paged_tests.log"
  ;;
esac
step done
