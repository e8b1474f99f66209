#!/usr/bin/env bash
# One GPU session on a lent H200 in two back-to-back device calls (the machine stays warm
# 30 s). A call carries at most 64 MiB with the repo: the repo (6 MB), .whl (6 MB) and FA3's
# first half (46 MB) fit one call.
#
#   call 1, carry [".whl", ".fa3/part1"]:  bash lab/h200/gpu_session.sh start VARIANTS_FILE
#       installs our wheels, starts building VARIANTS_FILE with all cores in the background
#       and stages FA3's first half (or, carrying .whl alone, a third call with
#       carry [".fa3/part1"]: bash lab/h200/fa3_stage1.sh)
#   call 2, carry [".fa3/part2"]:          bash lab/h200/gpu_session.sh lab VARIANTS_FILE [SHAPE...]
#       installs FA3, waits for the builds, gates every variant on uneven shapes, then times them
#       beside FA3 at the seed shapes (or SHAPEs); logs and JSON land in $OUT
#   search instead of the lab: search-start STUDY TIMEOUT [fa-tune search args] as call 1,
#   then search-wait STUDY as call 3; lab/h200/after_search.sh STUDY on the warm machine
#   next (compare, the multicast GPU tests, the export timed against the tuner)
#   FlashInfer (a peer of compare, issue 37), one more call, carry [".fi"]:
#                                          bash lab/h200/flashinfer_stage.sh
#       (~18 MB: with the repo it fits one call, beside .whl or an FA3 half it does not)
#   later calls on the same warm machine:  bash lab/h200/gpu_session.sh env -- COMMAND...
#       runs COMMAND with PYTHONPATH set for fa-tune, its wheels, FA3 and FlashInfer when
#       installed (PATH with its ninja, its JIT cache in .device/.cache/flashinfer)
#
# Keep the timing protocol of the lab at LAB_PROTOCOL (default "20 100 2": warm-up, repeat,
# rounds) while exploring; use "50 200 3" (the seeds') for numbers that go into docs/PERF.md.
#
# Run from the repository root. What the host keeps between the calls of one session (our
# wheels, FA3, the background build's and search's logs) lives in .device/ of the repository
# copy there (git-ignored; the device keeps ignored outputs between calls); FA_TUNE_DEVICE_DIR
# moves it.
set -euo pipefail
cmd=${1:?usage: gpu_session.sh start|lab|search-start|search-wait|env ...}
shift
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
mkdir -p "$DEV" && DEV=$(cd "$DEV" && pwd)
export FA_TUNE_DEVICE_DIR=$DEV  # the FA3 scripts install where this one looks
SITE=$DEV/site
FA3=$DEV/fa3site
export PYTHONPATH="$FA3:$FA3/nvidia_cutlass_dsl/dsl_packages:$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
FI=$DEV/fisite  # lab/h200/flashinfer_stage.sh: FlashInfer, and the `ninja` its JIT runs
if [ -d "$FI" ]; then
  export PYTHONPATH="$PYTHONPATH:$FI" PATH="$FI/bin:$PATH"
fi
# FlashInfer's JIT cache (nvcc builds, minutes each) in .device/: kept between calls.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$DEV}
export PYTHONUNBUFFERED=1
OUT=${OUT:-$DEV/out}
mkdir -p "$OUT"

case "$cmd" in
start)
  variants=${1:?variants file}
  if [ -d .fa3/part1 ]; then bash lab/h200/fa3_stage1.sh > /dev/null; fi
  # Later calls on a warm machine carry no wheels: those installed by the first stay.
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl
  fi
  rm -f "$DEV/build.log"
  # Background jobs run from a snapshot of the tree (lab/h200/snapshot.sh: the next call
  # re-syncs the repository copy under them); studies and the build cache stay the repo's.
  bash "$LAB/snapshot.sh" "$DEV/tree"
  (cd "$DEV/tree" && FA_TUNE_STUDIES="$OLDPWD/studies" setsid nohup python3 scripts/kernel_lab.py \
    --variants-file "$variants" --build-only --jobs "$(nproc)" > "$DEV/build.log" 2>&1 < /dev/null &)
  echo "building $variants in the background; FA3 part 1 staged"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
  ;;
lab)
  variants=${1:?variants file}
  shift
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed: timing without it"; }
  for _ in $(seq 300); do grep -q '^built' "$DEV/build.log" 2>/dev/null && break; sleep 2; done
  cp "$DEV/build.log" "$OUT/build.log"
  tail -n 30 "$DEV/build.log"
  read -r warm rep rounds <<< "${LAB_PROTOCOL:-20 100 2}"
  # Correctness first, on shapes no tile size divides (2x16x2000: several tiles per persistent
  # CTA, which the smaller ones never reach); quick, no timing worth keeping.
  timeout 150 python3 scripts/kernel_lab.py --variants-file "$variants" --no-fa3 \
    --shape 1x3x1152 --shape 2x5x1000 --shape 1x1x77 --shape 2x16x2000 \
    --warmup 1 --repeat 2 --rounds 1 --settle-s 0 \
    > "$OUT/gate_small.log" 2>&1 || rc=$?
  grep -E "FAIL|Error" "$OUT/gate_small.log" | cut -c1-300 || echo "small shapes: all variants passed"
  if [ "${rc:-0}" = 124 ]; then  # a hang at small shapes would hang the seed shapes too
    tail -n 5 "$OUT/gate_small.log"
    echo "small-shape gate timed out: some variant hangs (probe with lab/h200/probe.sh)"
    exit 1
  fi
  shapes=()
  for s in "${@:-4x32x4096 4x32x8192 4x32x16384}"; do
    for x in $s; do shapes+=(--shape "$x"); done
  done
  timeout "${LAB_TIMEOUT:-420}" python3 scripts/kernel_lab.py --variants-file "$variants" \
    "${shapes[@]}" --warmup "$warm" --repeat "$rep" --rounds "$rounds" > "$OUT/lab.log" 2>&1 \
    || echo "lab exited $?"
  cp -f "$OUT/kernel_lab.json" "$OUT/kernel_lab_seed.json" 2>/dev/null || true
  grep -v '^  [0-9a-f]\{12\}: {' "$OUT/lab.log" | tail -n 60
  ;;
search-start)
  # call 1 of a search session, carry [".fa3/part1", ".whl"]: search-start STUDY TIMEOUT [ARGS...]
  study=${1:?study}; budget=${2:?timeout, e.g. 7m}; shift 2
  if [ -d .fa3/part1 ]; then bash lab/h200/fa3_stage1.sh > /dev/null; fi
  # Later calls on a warm machine carry no wheels: those installed by the first stay.
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl
  fi
  rm -f "$DEV/search.log" "$DEV/search.rc"
  # From the snapshot, as above: the seeds of 2026-12-01 s8's GQA search failed to compile
  # ("config.cuh: No such file") while the next call re-synced the repository copy.
  bash "$LAB/snapshot.sh" "$DEV/tree"
  setsid nohup bash -c "cd '$DEV/tree' && FA_TUNE_STUDIES='$PWD/studies' python3 -m tuner.cli search --study '$study' --timeout '$budget' $* \
    > '$DEV/search.log' 2>&1; echo \$? > '$DEV/search.rc'" < /dev/null > /dev/null 2>&1 &
  echo "search $study started for $budget"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
  ;;
search-wait)
  # call 2, carry [".fa3/part2"]: installs FA3 while the search runs, waits for it, keeps logs
  study=${1:?study}
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; }
  # A search that never started (no log) would otherwise keep this call for its whole limit.
  [ -f "$DEV/search.log" ] || { echo "no search running (search-start failed?)"; exit 1; }
  for _ in $(seq 580); do [ -f "$DEV/search.rc" ] && break; sleep 1; done
  cp "$DEV/search.log" "$OUT/search.log"
  cp "studies/$study.db"* "$OUT/" 2>/dev/null || true  # with -wal/-shm if a WAL is left
  echo "search exit: $(cat "$DEV/search.rc" 2>/dev/null || echo still running)"
  tail -c 6000 "$DEV/search.log"
  ;;
env)
  [ "${1:-}" = "--" ] && shift
  exec "$@"
  ;;
*)
  echo "unknown subcommand $cmd" >&2
  exit 2
  ;;
esac
