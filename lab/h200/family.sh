#!/usr/bin/env bash
# Kernel-family session on a lent H200 (issue 14: head dims 64 and 256, non-causal): the
# workloads of lab/h200/variants/*.txt, each built for its problem class.
#
#   call 1, carry [".whl"]:        bash lab/h200/family.sh build
#       installs our wheels; builds (background, all cores) the presets of every class, the
#       planted bugs and every variants file for its class
#   call 2, carry [".fa3/part1"]:  bash lab/h200/fa3_stage1.sh
#   call 3, carry [".fa3/part2"]:  bash lab/h200/family.sh run [WORKLOAD...]
#       installs FA3, waits for the builds, runs the head-dim GPU tests and the planted-bug
#       tests, then times each workload's variants beside FA3 (first and last) in one process
#
# Workloads: name -> variants file, problem (SHAPE below); FAMILY_WORKLOADS="d64b ..." picks
# which ones the build step builds, SKIP_PREBUILD=1 skips the presets and planted bugs, and
# SKIP_TESTS=1 the GPU tests of the run step. GPU_SUITE="tests/gpu/a.py ..." makes the build
# step also run those GPU tests in the background (they need no FA3; the run step waits for
# them instead of running its own). Timing protocol LAB_PROTOCOL (default the seeds'
# "50 200 3" with 2 s settle). LAB_ARGS: more kernel_lab.py arguments for the build and the
# timing, e.g. LAB_ARGS=--unchecked for configs config.validate refuses until they ran on a GPU
# (each is still gated first). Logs and JSON land in $OUT.
set -euo pipefail
cmd=${1:?usage: family.sh build|run [WORKLOAD...]}
shift
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
mkdir -p "$DEV"
declare -A SHAPE=([d64]=4x32x8192:d64 [d64b]=4x32x8192:d64 [d256]=4x16x8192:d256
               [full128]=4x32x8192:full [poly_d64]=4x32x8192:d64 [s7_d256]=4x16x8192:d256
               [s7_full]=4x32x8192:full [wide_full]=4x32x8192:full
               [gqa70b]=1x64/8x8192 [s9_gqa]="1x32/8x8192 1x64/8x8192" [s9_d64]=4x32x8192:d64
               [s9_full]=4x32x8192:full [s10_d64]=4x32x8192:d64 [s10_full]=4x32x8192:full
               [s10_gqa]=1x32/8x8192 [s11_d64mc]=4x32x8192:d64 [s11_sumpv]=4x32x8192:d64
               [s12_d64]=4x32x8192:d64 [s12_full]=4x32x8192:full [s12_seed]=4x32x8192
               [s12_gqa]=1x32/8x8192 [s12_qdesc]=4x32x8192:d64 [s12_best]=4x32x8192:d64
               [s13_d64]=4x32x8192:d64 [s13_full]=4x32x8192:full
               [s14_d64]=4x32x8192:d64 [s14_full]=4x32x8192:full [s14_d256]=4x16x8192:d256
               [s14b_d64]=4x32x8192:d64 [s14b_full]=4x32x8192:full
               [s15_d64]=4x32x8192:d64 [s15_full]=4x32x8192:full
               [s15b_d64]=4x32x8192:d64 [s15b_full]=4x32x8192:full)
# A workload's problems (several, space-separated) as kernel_lab.py arguments.
shape_args() { local s; for s in ${SHAPE[$1]}; do printf -- '--shape %s ' "$s"; done; }
ORDER=(${FAMILY_WORKLOADS:-d256 d64 full128})

case "$cmd" in
build)
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
  rm -f "$DEV/family_build.log"
  # The background jobs run from a snapshot of the tree (the later calls re-sync the repository
  # copy under them: lab/h200/snapshot.sh); the builds land in this copy's studies/cache.
  bash "$LAB/snapshot.sh" "$DEV/tree"
  E="bash $LAB/gpu_session.sh env --"
  cmds="cd $DEV/tree && export FA_TUNE_STUDIES=$PWD/studies &&"
  [ -n "${SKIP_PREBUILD:-}" ] || cmds+=" $E python3 lab/h200/prebuild.py;"
  # The workloads build side by side (each file holds a few variants, fewer than the cores).
  for w in "${ORDER[@]}"; do
    cmds+=" ( $E python3 scripts/kernel_lab.py --build-only --variants-file lab/h200/variants/$w.txt"
    cmds+=" $(shape_args "$w") --jobs $(nproc) ${LAB_ARGS:-} ) &"
  done
  setsid nohup bash -c "$cmds wait; echo FAMILY-BUILT" > "$DEV/family_build.log" 2>&1 < /dev/null &
  echo "building in the background"
  rm -f "$DEV/gpu_suite.log" "$DEV/gpu_suite.done"
  if [ -n "${GPU_SUITE:-}" ]; then
    setsid nohup bash -c "cd $DEV/tree && timeout ${GPU_SUITE_TIMEOUT:-900} $E python3 -m pytest \
      -q -s -m gpu $GPU_SUITE -p no:cacheprovider; echo \"exit \$?\" > $DEV/gpu_suite.done" \
      > "$DEV/gpu_suite.log" 2>&1 < /dev/null &
    echo "GPU tests in the background: $GPU_SUITE"
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
  ;;
run)
  OUT=${OUT:-$DEV/out}
  # A later call on the same machine finds FA3 installed (and need not carry part 2 again).
  [ -d "$DEV/fa3site/flash_attn" ] || FA3_SMOKE=0 bash "$LAB/fa3_stage2.sh" > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed: timing without it"; }
  for _ in $(seq 200); do grep -q '^FAMILY-BUILT' "$DEV/family_build.log" 2>/dev/null && break; sleep 3; done
  grep -E "^built|NO |error|Error" "$DEV/family_build.log" | head -20 || true
  cp "$DEV/family_build.log" "$OUT/"
  E="bash $LAB/gpu_session.sh env --"
  if [ -f "$DEV/gpu_suite.log" ]; then
    for _ in $(seq 300); do [ -f "$DEV/gpu_suite.done" ] && break; sleep 2; done
    cp "$DEV/gpu_suite.log" "$OUT/gpu_tests.log"
    cat "$DEV/gpu_suite.done" 2>/dev/null || echo "GPU tests still running"
    grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -25
  elif [ -z "${SKIP_TESTS:-}" ]; then
    timeout 240 $E python3 -m pytest -q -s -m gpu tests/gpu/test_family_gpu.py \
      tests/gpu/test_planted_bugs_gpu.py -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1 || true
    grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -15
  fi
  read -r warm rep rounds <<< "${LAB_PROTOCOL:-50 200 3}"
  for w in "${@:-${ORDER[@]}}"; do
    timeout "${LAB_TIMEOUT:-200}" $E python3 scripts/kernel_lab.py \
      --variants-file "$LAB/variants/$w.txt" $(shape_args "$w") ${LAB_ARGS:-} \
      --warmup "$warm" --repeat "$rep" --rounds "$rounds" > "$OUT/lab_$w.log" 2>&1 \
      || echo "lab $w exited $?"
    mv -f "$OUT/kernel_lab.json" "$OUT/kernel_lab_$w.json" 2>/dev/null || true
    grep -A40 "^shape " "$OUT/lab_$w.log" | grep -v "^$" || tail -5 "$OUT/lab_$w.log"
  done
  ;;
*)
  echo "usage: family.sh build|run [WORKLOAD...]" >&2; exit 2 ;;
esac
