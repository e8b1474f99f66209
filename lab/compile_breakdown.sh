#!/bin/bash
# Where one candidate's compile goes (docs/PERF.md steps 48-49): `nvcc --time` per phase of a
# few presets' rendered template with the product's flags, then the real build path end to end
# (tuner.kernel.build.build_config into a fresh cache: nvcc, the SASS check, the smem read).
# Each is run RUNS times (default 3) and the medians printed: wall, and CPU (user + sys of nvcc
# and its children, less sensitive than wall to other work on the machine). Given several
# checkouts, their runs alternate, so they share whatever else the machine is doing.
#   bash lab/compile_breakdown.sh                                 # this checkout
#   FA_ROOT="/path/before /path/after" bash lab/compile_breakdown.sh
#   RUNS=1 SPECS="default:0 d64:1" bash lab/compile_breakdown.sh    # preset:varlen
ROOTS=${FA_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
RUNS=${RUNS:-3}
SPECS=${SPECS:-"default:0 default:1 multicast:1 d64:1 d256:1"}
WORK=$(mktemp -d /tmp/compile_breakdown.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
read -ra TREES <<< "$ROOTS"
for i in "${!TREES[@]}"; do
  rev=$(git -C "${TREES[$i]}" rev-parse --short HEAD 2>/dev/null || echo "no git")
  echo "tree $i: ${TREES[$i]} ($rev)"
done
echo "$RUNS runs each; load average $(cut -d' ' -f1-3 /proc/loadavg)"

median_report() {  # LABEL FILE...: "wall cpu" per line of each file -> medians
  python3 - "$@" <<'PY'
import statistics as st, sys
label, files = sys.argv[1], sys.argv[2:]
rows = [tuple(map(float, open(f).read().split()[-2:])) for f in files]
wall, cpu = [r[0] for r in rows], [r[1] for r in rows]
print(f"{label}: {st.median(wall):.1f} s wall, {st.median(cpu):.1f} s CPU (median of {len(rows)}; "
      f"walls {' '.join(f'{w:.1f}' for w in wall)})")
PY
}

for spec in $SPECS; do
  name=${spec%:*} varlen=${spec#*:}
  for i in "${!TREES[@]}"; do
    mkdir -p "t$i"
    PYTHONPATH="${TREES[$i]}" python3 - "$name" "$varlen" "$WORK/t$i" <<'PY'
import sys
from pathlib import Path
from tuner.kernel import build, config as C
from tuner.problem import ProblemClass
name, varlen, work = sys.argv[1], sys.argv[2] == "1", Path(sys.argv[3])
d = C.preset_head_dim(name)
src = build.render(C.load_preset(name), pclass=ProblemClass(d, True, varlen))
(work / f"{name}_{int(varlen)}.cu").write_text(src)
(work / "flags").write_text(" ".join(build._resolve_flags(build.KERNEL_FLAGS)))
PY
  done
  for r in $(seq "$RUNS"); do
    for i in "${!TREES[@]}"; do
      (cd "t$i" && /usr/bin/time -f "%e %U %S" -o "time_${spec}_$r" nvcc $(cat flags) \
        --time "t_${spec}_$r.csv" "${name}_${varlen}.cu" -o "${name}_${varlen}.so" \
        > /dev/null 2>&1) || { echo "nvcc failed: tree $i $spec"; exit 1; }
      awk '{print $1, $2 + $3}' "t$i/time_${spec}_$r" > "t$i/nvcc_${spec}_$r"
    done
  done
  for i in "${!TREES[@]}"; do
    median_report "tree $i nvcc $name varlen=$varlen" t$i/nvcc_${spec}_*
    python3 - "t$i" "$spec" <<'PY'
import glob, statistics as st, sys
phases: dict[str, list[float]] = {}
for path in sorted(glob.glob(f"{sys.argv[1]}/t_{sys.argv[2]}_*.csv")):
    run: dict[str, float] = {}  # a phase that runs twice (gcc compiling: also the dlink stub) adds
    for line in open(path).readlines()[1:]:
        f = [x.strip() for x in line.split(",")]
        run[f[1]] = run.get(f[1], 0.0) + float(f[6])
    for p, ms in run.items():
        phases.setdefault(p, []).append(ms)
print("   " + ", ".join(f"{p} {st.median(v):.0f}" for p, v in phases.items() if st.median(v) >= 20)
      + " (ms, nvcc --time)")
PY
  done
done

# The build path a candidate takes: build_config into a fresh cache (so no hit), one process per
# run; wall, and CPU of the process and its children.
for spec in $SPECS; do
  for r in $(seq "$RUNS"); do
    for i in "${!TREES[@]}"; do
      PYTHONPATH="${TREES[$i]}" python3 - "$spec" "$WORK/t$i/cache_${spec}_$r" \
        > "$WORK/t$i/build_${spec}_$r" <<'PY' || { echo "build failed: tree $i $spec"; exit 1; }
import os, sys, time
from pathlib import Path
from tuner.kernel import build, config as C
from tuner.problem import ProblemClass
name, varlen = sys.argv[1].split(":")
cfg = C.load_preset(name)
pclass = ProblemClass(C.preset_head_dim(name), True, varlen == "1")
t0, c0 = time.monotonic(), os.times()
res = build.build_config(cfg, cache_root=Path(sys.argv[2]), pclass=pclass)
c1 = os.times()
assert not res.cache_hit and res.sass_checked, res.sass_note
cpu = sum(c1[k] - c0[k] for k in range(4))  # user + sys, own and children's
print(f"{time.monotonic() - t0:.3f} {cpu:.3f}")
PY
    done
  done
  for i in "${!TREES[@]}"; do
    median_report "tree $i build_config $spec" "$WORK"/t$i/build_${spec}_*
  done
done
