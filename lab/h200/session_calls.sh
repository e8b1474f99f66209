# What the session scripts' calls share (sourced by s20.sh, s21.sh and s22.sh, which set
# FIRST_CALL to the call that carries .whl): the .device folder, $OUT, fa-tune's wheels, step
# timestamps and gpu_tests. Each call runs on the same warm machine as the one before it, or says what is missing.
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$LAB/../.." && pwd)/.device}
mkdir -p "$DEV"
export FA_TUNE_DEVICE_DIR=$DEV
OUT=${OUT:-$DEV/out}
mkdir -p "$OUT"
E="bash $LAB/gpu_session.sh env --"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" .whl/*.whl
elif [ ! -d "$DEV/site/optuna" ]; then
  echo "fa-tune's wheels are not installed on this machine: run '$FIRST_CALL' with carry [\".whl\"] first"
  exit 2
fi
# FA3's first half, when carried beside .whl (they fit one call): parked for fa3_stage2.sh.
if compgen -G ".fa3/part1/*" > /dev/null; then bash "$LAB/fa3_stage1.sh" > /dev/null; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
t0=$SECONDS
step() { echo "[$((SECONDS - t0)) s] $*"; }
# The tests build into the prebuilt cache (lab/h200/prebuild.py; tests/conftest.py makes a
# fresh one otherwise, and the tests' fixtures build one kernel at a time).
export FA_TUNE_STUDIES=$PWD/studies
gpu_tests() {  # LOG TIMEOUT FILES...
  local log=$1 limit=$2; shift 2
  timeout "$limit" $E python3 -m pytest -q -s -m gpu -p no:cacheprovider --durations=6 "$@" \
    > "$OUT/$log" 2>&1
  step "$log: exit $?"; grep -E "passed|failed|FAILED|Error|s call" "$OUT/$log" | tail -12
}
fa3_once() {  # FA3's second half installed on this machine (after fa3_stage1.sh), once
  [ -f "$DEV/fa3.ok" ] && return 0
  FA3_SMOKE=0 bash "$LAB/fa3_stage2.sh" > "$OUT/fa3_install.log" 2>&1 \
    || { tail -5 "$OUT/fa3_install.log"; echo "FA3 install failed (carry .fa3/part2)"; exit 1; }
  touch "$DEV/fa3.ok"; step "FA3 installed"
}
lab() {  # LOG TIMEOUT ARGS...: kernel_lab without FA3, its table last, inside a call's 560 s
  local log=$1 limit=$2 left=$((560 - (SECONDS - t0))); shift 2
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -lt 20 ] && { step "$log: no time left in this call"; return; }
  OUT=$OUT timeout "$limit" $E python3 scripts/kernel_lab.py --no-fa3 --unchecked "$@" \
    > "$OUT/$log" 2>&1
  step "$log: exit $?"; grep -v '^  [0-9a-f]\{12\}: {' "$OUT/$log" | tail -n 14 | cut -c1-200
}
window_gate() {  # LOG TIMEOUT VARIANTS_FILE: the uneven window and sinks problems a window
  # variant passes before it is timed (the group sizes 8, 4, 6, 1 and MHA, S_q < S_k, windows
  # of 1 to 1000 keys), each at a few launches
  local log=$1 limit=$2 v=$3
  lab "$log" "$limit" --variants-file "$v" --shape 2x32/4x1000:d64:w100 \
    --shape 1x12/3x777:k1500:d64:w300 --shape 3x6/1x513:d64:w17 --shape 1x16/16x300:d64:w64 \
    --shape 1x16/1x1000:d64:w1 --shape 1x8/1x200:d64:w1000 --shape 2x12/3x333:k400:d64:w50:sinks \
    --warmup 2 --repeat 5 --rounds 1 --settle-s 0
}
wait_search() {  # STUDY: wait for the search gpu_session.sh search-start began; keep its log
  local study=$1
  [ -f "$DEV/search.log" ] || { echo "no search running (search-start failed?)"; return 1; }
  for _ in $(seq 450); do [ -f "$DEV/search.rc" ] && break; sleep 1; done
  cp "$DEV/search.log" "$OUT/search_$study.log"; cp "studies/$study.db" "$OUT/" 2>/dev/null
  step "search $study exit $(cat "$DEV/search.rc" 2>/dev/null || echo 'still running')"
  grep -E "^study |^best|^final|trials|GPU busy|tie" "$OUT/search_$study.log" | tail -8 | cut -c1-240
}
