#!/usr/bin/env bash
# Which variants of a lab file finish on a given shape: each one in its own process under a
# timeout, so one hang does not hide the others. Usage (GPU host, repo root, .whl carried):
#   bash lab/h200/probe.sh VARIANTS_FILE [SECONDS] [SHAPE...]
set -uo pipefail
file=${1:?variants file}; secs=${2:-45}; shift 2 || shift $#
shapes=("${@:-1x8x4096}")
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.device}
SITE=$DEV/site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" .whl/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-$DEV/out}; mkdir -p "$OUT"
python3 scripts/kernel_lab.py --variants-file "$file" --build-only --jobs "$(nproc)" \
  > "$OUT/probe_build.log" 2>&1 || { tail -20 "$OUT/probe_build.log"; exit 1; }
sargs=(); for s in "${shapes[@]}"; do sargs+=(--shape "$s"); done
i=0
grep -v '^#' "$file" | sed '/^\s*$/d' | while IFS= read -r v; do
  i=$((i + 1))
  t0=$(date +%s%N)
  timeout -s KILL "$secs" python3 scripts/kernel_lab.py --variant "$v" --no-fa3 "${sargs[@]}" \
    --warmup 1 --repeat 3 --rounds 1 > "$OUT/probe_$i.log" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))  # no bc on the GPU host
  if [ $rc -eq 137 ]; then st=HANG; elif grep -q FAIL "$OUT/probe_$i.log"; then st=FAIL
  elif [ $rc -ne 0 ]; then st="rc=$rc"; else st=ok; fi
  printf '%-5s %4d.%01ds  %s\n' "$st" $((ms / 1000)) $((ms % 1000 / 100)) "$v"
done
