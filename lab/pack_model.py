"""pack_gqa's tile arithmetic, modelled on the CPU (docs/PERF.md step 76).

Mirrors cuda_src/fa_tune/params.cuh (task_keys, num_unmasked_kv_blocks,
first_unmasked_kv_block), the consumer's diagonal (kernel.cuh) and softmax.cuh's masks, and
checks on random problems, for every row of every task: each key the row must see lies in
exactly one visited tile and survives the masks, no other key does, and no tile left unmasked
holds a key the row must not see.

    python3 lab/pack_model.py [--problems N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import sys

NO_WINDOW = 1 << 30


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tdiv(a: int, b: int) -> int:
    """C's integer division (toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def check(Sq: int, Sk: int, G: int, BM: int, BN: int, window: int, causal: bool,
          has_window: bool) -> str | None:
    """Why the arithmetic is wrong for this problem (None: it is right)."""
    shift = 0
    while shift < 3 and (G >> shift) % 2 == 0:
        shift += 1
    off = Sk - Sq
    W = window - 1 if has_window and window > 0 else NO_WINDOW  # Launcher::window_of
    for m in range(cdiv(Sq << shift, BM)):
        p0, p1 = (m * BM) >> shift, ((m + 1) * BM) >> shift
        last = min(p1 - 1 + off, Sk - 1) if causal else Sk - 1
        base = max(0, min(p0 + off - W, last)) if has_window else 0
        n = max(last - base, 0) // BN + 1
        for wg in range(BM // 64):
            first_row = m * BM + wg * 64
            fp, lp = first_row >> shift, (first_row + 63) >> shift
            n_unmasked = (max(0, min(n, tdiv(fp + off + 1 - base, BN))) if causal
                          else min(n, tdiv(Sk - base, BN)))
            key = lp + off - W - base
            n_unmasked_lo = (cdiv(key, BN) if key > 0 else 0) if has_window else 0
            for r in range(64):
                pos = (first_row + r) >> shift
                if pos >= Sq:
                    continue
                row0 = first_row + r - r % 16 + r % 8  # the thread's first row
                diag = (row0 >> shift) + off + (8 >> shift) * (r % 16 // 8)
                if diag != pos + off:
                    return f"task {m} row {first_row + r}: diagonal {diag}, not {pos + off}"
                want = {k for k in range(Sk) if (not causal or k <= pos + off)
                        and k >= pos + off - W}
                got: set[int] = set()
                for t in range(n):
                    masked = t >= n_unmasked or t < n_unmasked_lo
                    for k in range(base + t * BN, base + (t + 1) * BN):
                        bad = (k >= Sk or (causal and k > pos + off) or k < pos + off - W)
                        if not masked and bad:
                            return f"task {m} row {first_row + r}: unmasked tile {t} has key {k}"
                        cut = ((causal and k > diag) or (not causal and k >= Sk)
                               or (has_window and k < diag - W))
                        if not cut:
                            if k >= Sk:
                                return f"task {m} row {first_row + r}: key {k} past the end"
                            got.add(k)
                if got != want:
                    return (f"task {m} row {first_row + r}: keys missed "
                            f"{sorted(want - got)[:4]}, extra {sorted(got - want)[:4]}")
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    for i in range(args.problems):
        Sq = rng.randint(1, 300)
        case = dict(Sq=Sq, Sk=Sq + rng.choice([0, 0, rng.randint(0, 300)]),
                    G=rng.choice([1, 2, 3, 4, 6, 8, 16]), BM=rng.choice([64, 128, 192]),
                    BN=rng.choice(range(48, 193, 16)),
                    window=rng.choice([1, 2, 17, 64, 128, 200, 1000]),
                    causal=rng.random() < 0.8, has_window=rng.random() < 0.7)
        why = check(**case)  # type: ignore[arg-type]
        if why:
            print(f"problem {i} {case}: {why}")
            return 1
    print(f"{args.problems} problems: every row's keys in exactly one tile, masked right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
