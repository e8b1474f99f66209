#!/usr/bin/env bash
# Copy the repository tree (without the carried and git-ignored bulk) to DEST, for background
# jobs that outlive the device call that starts them. Each later call re-syncs the repository
# copy on the host, and a compile that reads cuda_src/ while that happens fails ("config.cuh:
# No such file", 2026-12-01 s7: 165 GPU-test errors); a job run from the snapshot is immune.
#   bash lab/h200/snapshot.sh DEST     (run from the repository root)
set -euo pipefail
dest=${1:?usage: snapshot.sh DEST}
rm -rf "$dest" && mkdir -p "$dest"
tar -c --exclude=./.device --exclude=./studies --exclude=./.whl --exclude=./.fa3 \
  --exclude=./.hfwhl --exclude=./.git . | tar -x -C "$dest"
mkdir -p "$dest/studies"
# The carried build cache (same nvcc) still saves the compiles.
[ -d studies/cache ] && cp -a studies/cache "$dest/studies/" || true
