#!/bin/bash
# nvcc --time for a few presets: where one candidate's compile goes (docs/PERF.md step 48).
# Run from anywhere with nvcc on PATH: bash lab/compile_breakdown.sh
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p /tmp/ct && cd /tmp/ct
for spec in "default 0" "default 1" "multicast 1" "d64 1" "d256 1"; do
  set -- $spec
  PYTHONPATH="$ROOT" python3 - "$1" "$2" <<'PY'
import sys
from pathlib import Path
from tuner.kernel import build, config as C
from tuner.problem import ProblemClass
name, varlen = sys.argv[1], sys.argv[2] == "1"
d = C.preset_head_dim(name)
src = build.render(C.load_preset(name), pclass=ProblemClass(d, True, varlen))
Path(f"/tmp/ct/{name}_{int(varlen)}.cu").write_text(src)
Path("/tmp/ct/flags").write_text(" ".join(build._resolve_flags(build.KERNEL_FLAGS)))
PY
  /usr/bin/time -f "%e s wall %U s user" nvcc $(cat flags) --time /tmp/ct/t_$1_$2.csv $1_$2.cu -o /tmp/ct/$1_$2.so > /dev/null 2> /tmp/ct/time_$1_$2.txt
  echo "$1 varlen=$2 $(tail -1 /tmp/ct/time_$1_$2.txt)"
  awk -F' , ' 'NR>1 {gsub(/ /,"",$7); printf "   %-24s %8.0f ms\n", $2, $7}' /tmp/ct/t_$1_$2.csv
done
