#!/usr/bin/env bash
# Session 26's remaining lab call (docs/PERF.md step 60); kv_walk's calls went with it to
# lab/patches/kv-walk.patch (measured not to help).
#   carry [".whl"]  bash lab/h200/s26.sh softcap
#       softcap's two forms (softcap_tanh exact, approx) gated on seed, rising and peaky
#       (scores spread to the cap) and timed, at D 128 and D 256 (lab/h200/softcap_forms.py,
#       about 1 min on a warm machine).
# Logs land in $OUT.
set -uo pipefail
FIRST_CALL="softcap"
source "$(dirname "${BASH_SOURCE[0]}")/session_calls.sh"
case "${1:?softcap}" in
softcap)
  for spec in "default 1x16/8x8192" "d256 1x16/8x8192:d256"; do
    set -- $spec
    timeout 280 $E python3 lab/h200/softcap_forms.py --preset "$1" --shape "$2" \
      > "$OUT/softcap_$1.log" 2>&1
    step "softcap $1 exit $?"; tail -4 "$OUT/softcap_$1.log" | cut -c1-220
  done
  ;;
esac
step done
