#!/usr/bin/env bash
# FA3 install, call 1 of 2 (GPU host, no network). Run from the repo root with carry [".fa3/part1"].
# The flash-attn-4 wheel set is ~98 MB, over one call's 64 MiB transfer limit, so it travels in
# two halves; this call parks the first half in .device/fa3_stage (git-ignored, so the host's
# repository copy keeps it between calls; not under .fa3, which each call's carry replaces),
# where call 2 finds it.
# Call 2 (lab/h200/fa3_stage2.sh) must follow while the machine is still warm (30 s idle limit).
set -euo pipefail
SRC=.fa3/part1
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.device}
STAGE=${FA3_STAGE:-$DEV/fa3_stage}
[ -d "$SRC" ] || { echo "fa3_stage1: $SRC missing: carry it ([\".fa3/part1\"])" >&2; exit 2; }
mkdir -p "$STAGE"
cp -f "$SRC"/* "$STAGE"/
echo "fa3_stage1: staged $(ls "$STAGE" | wc -l) files ($(du -sh "$STAGE" | cut -f1)) in $STAGE"
ls -la "$STAGE"
