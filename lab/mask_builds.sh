#!/bin/bash
# The models' masks (issue 36), compiled on the CPU: each preset rendered for a mask class with the
# product's flags (tuner.kernel.build.KERNEL_FLAGS), then HGMMA, LDL/STL and CALL counts in the
# attention kernels' SASS, ptxas's C75xx warnings (serialized wgmma) and its spill report
# (docs/PERF.md step 50). Run from anywhere with nvcc and cuobjdump on PATH:
#   bash lab/mask_builds.sh [OUT_DIR]
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-/tmp/mask_builds}
mkdir -p "$OUT" && cd "$OUT" || exit 1
PYTHONPATH="$ROOT" python3 - <<'PY'
import dataclasses
from pathlib import Path
from tuner.kernel import build, config as C
from tuner.problem import ProblemClass as PC
cases = {
    "default_all_varlen": ("default", {}, PC(128, True, True, window=True, softcap=True, sinks=True)),
    "multicast_window_varlen": ("multicast", {}, PC(128, True, True, window=True)),
    "d64-sumpv_window_sinks_varlen": ("d64-sumpv", {}, PC(64, True, True, window=True, sinks=True)),
    "full-qregs_window": ("full-qregs", {}, PC(128, False, False, window=True)),
    "static_window_softcap": ("static", {}, PC(128, True, False, window=True, softcap=True)),
    "d256_window": ("d256", {}, PC(256, True, False, window=True)),
    "d256_bn64_window_softcap": ("d256", {"block_n": 64}, PC(256, True, False, window=True, softcap=True)),
}
for tag, (preset, tweak, pc) in cases.items():
    cfg = dataclasses.replace(C.load_preset(preset), **tweak)
    Path(f"{tag}.cu").write_text(build.render(cfg, pclass=pc))
Path("flags").write_text(" ".join(build._resolve_flags(build.KERNEL_FLAGS)))
PY
for f in *.cu; do
  n=${f%.cu}
  t0=$(date +%s)
  nvcc $(cat flags) "$f" -o "$n.so" > "$n.log" 2>&1 || { echo "$n FAILED"; grep -m5 error "$n.log"; continue; }
  t1=$(date +%s)
  cuobjdump -sass "$n.so" > "$n.sass"
  awk -v n="$n" -v t=$((t1 - t0)) -v w="$(grep -c C75 "$n.log")" '
    /Function :/ {att = ($3 ~ /attention_fwd/)}
    att && /HGMMA/ {h++} att && /LDL|STL/ {l++} att && /CALL/ {c++}
    END {printf "%-32s %3ds C75xx=%d HGMMA=%d LDL/STL=%d CALL=%d  ", n, t, w, h, l, c}' "$n.sass"
  grep -o "[0-9]* bytes spill stores" "$n.log" | sort -u | tr '\n' ' '; echo
done
