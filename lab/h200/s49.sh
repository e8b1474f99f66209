#!/usr/bin/env bash
# The first call of the next GPU session (docs/PERF.md step 83), for whichever card comes: a call
# that names nvidia-h200 mostly gets an H100, and the searches that could close issues 37 and 34
# need the H200 their bars are measured on, while the producer patches' A/B is a ratio in one
# process on any card.
#   carry [".whl", ".fa3/part1"]:  bash lab/h200/s49.sh first
#       H200: the p128 search starts (gpu_session.sh search-start h-p128 300s); next call
#             `s28.sh next h-p128 4x32/8x2048:k8192:p64 4x32/8x2048:k8192:p256 -- h-chunk 300s
#             1x32/8x2048:k8192` with carry [".fa3/part2"]
#       else: gemma-2-9b's four longer buckets start tuning (workload.sh start, 60 s a bucket;
#             its two 2k buckets were measured on an H100 in step 85); next `workload.sh after
#             gemma-2-9b` with carry [".fa3/part2"], then `workload.sh cmp gemma-2-9b`
# Logs land in $OUT.
set -uo pipefail
LAB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
case "${1:?first}" in
first)
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "card: $card"
  if [[ "$card" == *H200* ]]; then
    bash "$LAB/gpu_session.sh" search-start h-p128 300s --shape 4x32/8x2048:k8192:p128
    echo "next: s28.sh next h-p128 ... with carry [.fa3/part2]"
  else
    bash "$LAB/workload.sh" start gemma-2-9b 60s local-s4k local-s8k global-s4k global-s8k
    echo "next: workload.sh after gemma-2-9b with carry [.fa3/part2], then workload.sh cmp gemma-2-9b"
  fi ;;
*) echo "s49.sh: unknown call '$1': first" >&2; exit 2 ;;
esac
