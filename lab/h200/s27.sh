#!/usr/bin/env bash
# Session 27's lab calls (docs/PERF.md step 61), on one warm machine:
#   carry [".whl", ".fa3/part1"]  bash lab/h200/s27.sh ties
#       issue 38's 3-minute bar judged side by side: s26-busy's pick and the 8 earliest configs
#       within 3 % of it (lab/h200/variants/s26_ties.txt), 1 s settle, 50 + 3 x 200, no FA3;
#       then the mask rows' kernels built in the background for `masks`
#   carry [".fa3/part2"]          bash lab/h200/s27.sh masks [STUDY]
#       installs FA3; with STUDY, waits for the search that `gpu_session.sh search-start STUDY
#       240s --shape ...` started (carry [".whl", ".fa3/part1"]) and compares its pick; then
#       issue 36's six rows through `fa-tune compare --backends fa3` (1 s settle, 50 + 3 x 200)
#       with presets and the softcap_tanh=approx configs of lab/h200/variants/s27
#   per search after that: bash lab/h200/gpu_session.sh search-start STUDY 240s --shape ...
#       and          bash lab/h200/s27.sh after STUDY   (waits, then compare --backends fa3)
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL="ties"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
V=lab/h200/variants/s27
cmp() {  # LOG CONFIG-ARGS... -- SHAPES...
  local log=$1; shift
  timeout 200 $E python3 -m tuner.cli compare --backends fa3 --warmup 50 --repeat 200 \
    --rounds 3 --settle-s 1 --results-dir "$DEV/results" "$@" > "$OUT/$log.log" 2>&1
  step "$log exit $?"; grep -E "fa-tune|fa3|FAIL|rror|ratio|x FA3" "$OUT/$log.log" | tail -8 | cut -c1-200
}
after() {  # STUDY: wait for the search, then its pick beside FA3
  wait_search "$1" || return 1
  cmp "after_$1" --study "$1"
}
case "${1:?ties|masks [STUDY]|after STUDY}" in
ties)
  timeout 400 $E python3 scripts/kernel_lab.py --variants-file lab/h200/variants/s26_ties.txt \
    --shape 2x32/1x8192 --warmup 50 --repeat 200 --rounds 3 --settle-s 1 --no-fa3 \
    --jobs "$(nproc)" > "$OUT/ties.log" 2>&1
  step "ties exit $?"; grep -v '^  [0-9a-f]\{12\}: {' "$OUT/ties.log" | tail -n 16
  cp -f "$OUT/kernel_lab.json" "$OUT/ties.json" 2>/dev/null
  (setsid nohup $E python3 - > "$DEV/prebuild27.log" 2>&1 < /dev/null <<'PY' &
from concurrent.futures import ThreadPoolExecutor
from tuner.kernel import build
from tuner.kernel.config import load_config, load_preset
from tuner.problem import Problem
V = "lab/h200/variants/s27/"
jobs = [(load_preset("llama3"), "1x32/8x16384:w4096"), (load_preset("default"), "1x32/8x16384:w4096"),
        (load_preset("d64-wgskip"), "1x64/8x8192:d64:sinks"), (load_preset("d64"), "1x64/8x8192:d64:sinks"),
        (load_preset("d64-window"), "1x64/8x8192:d64:w128"), (load_preset("d64-window"), "1x64/8x8192:d64:w128:sinks"),
        (load_config(None, V + "d256-approx.yaml")[0], "1x16/8x8192:d256:cap50"),
        (load_config(None, V + "d256-multicast-approx.yaml")[0], "1x16/8x8192:d256:cap50"),
        (load_config(None, V + "d256-bn64-approx.yaml")[0], "1x16/8x8192:d256:w4096:cap50")]
def one(j):
    try:
        build.build_config(j[0], pclass=Problem.parse(j[1]).problem_class)
        return f"built {j[1]}"
    except Exception as e:
        return f"FAILED {j[1]}: {e}"
with ThreadPoolExecutor(16) as ex:
    for line in ex.map(one, jobs):
        print(line, flush=True)
PY
  )
  ;;
masks)
  FA3_SMOKE=0 bash lab/h200/fa3_stage2.sh > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed"; exit 1; }
  step "FA3 installed"; cat "$DEV/prebuild27.log" 2>/dev/null | tail -9
  if [ -n "${2:-}" ]; then after "$2"; fi
  cmp w4096_llama3 -p llama3 -s 1x32/8x16384:w4096
  cmp w4096_default -p default -s 1x32/8x16384:w4096
  cmp sinks_wgskip -p d64-wgskip -s 1x64/8x8192:d64:sinks
  cmp sinks_d64 -p d64 -s 1x64/8x8192:d64:sinks
  cmp w128_window -p d64-window -s 1x64/8x8192:d64:w128 -s 1x64/8x8192:d64:w128:sinks
  cmp cap_d256 -c $V/d256-approx.yaml -s 1x16/8x8192:d256:cap50
  cmp cap_d256mc -c $V/d256-multicast-approx.yaml -s 1x16/8x8192:d256:cap50
  cmp capw_d256 -c $V/d256-bn64-approx.yaml -s 1x16/8x8192:d256:w4096:cap50
  (cd "$DEV" && tar -cJf "$OUT/masks_results.tar.xz" results) 2>/dev/null
  ;;
after)
  after "${2:?study}"
  ;;
esac
step done
