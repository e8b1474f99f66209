"""Score columns a sliding window's tiles compute against those its mask keeps (docs/PERF.md
step 75). Counting only, no GPU: how much of the 128-key window's tensor-core and exp2 work a
tile layout wastes.

- today: a 64-row warpgroup tile holds 64 consecutive queries of one head; key tiles are
  block_n wide and aligned to block_n, so a task computes every tile its band touches;
- packed: a tile holds 64 / G consecutive positions x the G query heads of one K/V head (a GQA
  group, gpt-oss's 8), so the band is 64 / G + window keys wide; key tiles start at the task's
  first key (TMA takes any coordinate), block_n a multiple of 16 (PV's k-step); aligned tiles
  for comparison.

    python3 lab/window_tiles.py [--window 128] [--seq 8192] [--groups 8 4]
"""

from __future__ import annotations

import argparse

ROWS = 64  # one consumer warpgroup's wgmma M


def kept_keys(q: int, window: int) -> int:
    """Keys query q sees: its window to the left, itself, none past the sequence's start."""
    return min(q, window) + 1


def packed(
    window: int, group: int, block_n: int, seq: int, aligned: bool = False
) -> tuple[int, int]:
    """(computed, kept) score columns. aligned: key tiles on multiples of block_n, as today's
    kernel places them; today's tiles are group 1, aligned."""
    positions = ROWS // group
    computed = kept = 0
    for s0 in range(0, seq, positions):
        lo, hi = max(0, s0 - window), s0 + positions
        tiles = -(-hi // block_n) - lo // block_n if aligned else -(-(hi - lo) // block_n)
        computed += tiles * block_n * ROWS
        kept += group * sum(kept_keys(q, window) for q in range(s0, s0 + positions))
    return computed, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--groups", type=int, nargs="+", default=[8, 4])
    a = ap.parse_args()
    if a.window < 0 or a.seq < ROWS:
        ap.error(f"--window must be >= 0 and --seq >= {ROWS}")
    if any(g < 1 or ROWS % g for g in a.groups):
        ap.error(f"each --groups value must divide {ROWS} (a GQA group of 1, 2, 4, 8, ...)")
    base_c, base_k = packed(a.window, 1, 64, a.seq, aligned=True)
    print(f"window {a.window}, {a.seq} queries, per (query, key) pair the mask keeps:")
    print(f"  today, 64 x 64 tiles:            {base_c / base_k:.3f} computed")
    for g in a.groups:
        for bn in (48, 64, 80, 144):
            c, k = packed(a.window, g, bn, a.seq)
            print(
                f"  packed G {g} ({ROWS // g} positions), block_n {bn:3d}: {c / k:.3f} computed"
                f" ({c / k / (base_c / base_k):.3f} of today's)"
            )
        c, k = packed(a.window, g, 48, a.seq, aligned=True)
        print(f"  the same at block_n 48, tiles aligned to 48: {c / k:.3f} computed")


if __name__ == "__main__":
    main()
