"""The balance model of the clustered device-side schedule (docs/PERF.md step 66).

varlen.cuh lists a packed batch's tasks (sequences by their costliest tile; in each, L2 sections
of K/V heads, last query tile first) and VarlenStaticScheduler deals the list to the grid's
clusters round by round, snake order. This prints, per shape, the heaviest cluster over the mean
(task cost = 2 x KV tiles + fixed_cost, task_list.h's units) for that deal, for a greedy counter,
and for the tail's last rounds dealt again longest first to the least loaded cluster
(lab/patches/varlen-tail-deal.patch), and for pair swaps after the snake (the next patch). The
model said 3.8 % -> 2.7 % for the tail's LPT at 4x32/8x2048:k8192, and the patch measured a tie;
the task clocks measured 3.8 % idle in that tail (docs/PERF.md step 66).

    python3 lab/varlen_deal_model.py
"""

from __future__ import annotations

import heapq
import math

CLUSTERS = 66          # 132 SMs, clusters of two
FIXED_COST = 9         # llama3's fixed_cost
L2_SECTION_KEYS = 58593  # ~60 % of a 50 MB L2 over 512 bytes of K and V per key row (D 128)


def device_list(batch: int, heads: int, kv_heads: int, tiles: int, s_k: int) -> list[int]:
    """Task costs in the schedule kernel's order for `batch` equal sequences of tiles x 128
    queries over s_k keys (packed_list for mixed ones)."""
    return packed_list([(tiles * 128, s_k)] * batch, heads, kv_heads)


def packed_list(seqs: list[tuple[int, int]], heads: int, kv_heads: int) -> list[int]:
    """Task costs in the schedule kernel's order: sequences (s_q, s_k) by their costliest tile,
    most first (equal costs keep arrival order), each as L2 sections of heads, a section's tiles
    last first (varlen.cuh, causal, 128-row tasks over 128-key tiles)."""
    group = heads // kv_heads

    def cost(s_q: int, s_k: int, m: int) -> int:
        return 2 * math.ceil(min((m + 1) * 128 + s_k - s_q, s_k) / 128) + FIXED_COST

    order = sorted(range(len(seqs)), key=lambda b: -cost(*seqs[b], math.ceil(seqs[b][0] / 128) - 1))
    out: list[int] = []
    for b in order:
        s_q, s_k = seqs[b]
        tiles = math.ceil(s_q / 128)
        per = max(1, min(L2_SECTION_KEYS // s_k, kv_heads)) * group
        seq = [0] * (heads * tiles)
        for m in range(tiles):
            rank = tiles - 1 - m
            for h in range(heads):
                h0 = h // per * per
                hn = min(heads - h0, per)
                seq[h0 * tiles + rank * hn + (h - h0)] = cost(s_q, s_k, m)
        out += seq
    return out


def snake(costs: list[int], g: int) -> list[int]:
    load = [0] * g
    for i, c in enumerate(costs):
        r, j = divmod(i, g)
        load[g - 1 - j if r & 1 else j] += c
    return load


def counter(costs: list[int], g: int) -> list[int]:
    """A shared counter: each cluster takes the next task when it finishes."""
    heap = [(0, c) for c in range(g)]
    for cost in costs:
        t, c = heapq.heappop(heap)
        heapq.heappush(heap, (t + cost, c))
    return [t for t, _ in heap]


def tail_dealt(costs: list[int], g: int, rounds: int = 3) -> list[int]:
    """The snake, then the last `rounds` rounds' tasks longest first to the least loaded."""
    r = math.ceil(len(costs) / g)
    head = max(0, r - rounds) * g
    heap = [(t, c) for c, t in enumerate(snake(costs[:head], g))]
    heapq.heapify(heap)
    for cost in sorted(costs[head:], reverse=True):
        t, c = heapq.heappop(heap)
        heapq.heappush(heap, (t + cost, c))
    return [t for t, _ in heap]


def snake_grid(costs: list[int], g: int) -> list[list[int | None]]:
    """grid[c][r]: the cost of cluster c's round-r task (None: past the list's end)."""
    rounds = math.ceil(len(costs) / g)
    grid: list[list[int | None]] = [[None] * rounds for _ in range(g)]
    for i, cost in enumerate(costs):
        r, j = divmod(i, g)
        grid[g - 1 - j if r & 1 else j][r] = cost
    return grid


def pair_swaps(costs: list[int], g: int, passes: int = 4, window: int = 2,
               swaps: int = 4) -> list[int]:
    """The snake, then `passes` times: the clusters sorted by load, the i-th heaviest paired with
    the i-th lightest, and in each pair up to `swaps` swaps of tasks, each the one (rounds at most
    `window` apart; an empty last-round slot is a task of cost 0, swapped only within its round)
    that leaves the two closest. Pairs are disjoint, so a pass is one step for the whole block
    on the device (a warp a pair)."""
    grid = snake_grid(costs, g)
    rounds = len(grid[0])
    load = [sum(x or 0 for x in row) for row in grid]
    for _ in range(passes):
        order = sorted(range(g), key=lambda c: (load[c], c))
        for i in range(g // 2):
            lo, hi = order[i], order[g - 1 - i]
            for _ in range(swaps):
                best, pick = load[hi] - load[lo], None
                for rh in range(rounds):
                    for rl in range(max(0, rh - window), min(rounds, rh + window + 1)):
                        a, b = grid[hi][rh], grid[lo][rl]
                        if a is None or ((b is None) and rh != rl):
                            continue
                        d = a - (b or 0)
                        if 0 < d and abs(load[hi] - load[lo] - 2 * d) < best:
                            best, pick = abs(load[hi] - load[lo] - 2 * d), (rh, rl, d)
                if pick is None:
                    break
                rh, rl, d = pick
                grid[hi][rh], grid[lo][rl] = grid[lo][rl], grid[hi][rh]
                load[hi] -= d
                load[lo] += d
    return load


def excess(load: list[int]) -> float:
    return max(load) / (sum(load) / len(load)) - 1


def main() -> None:
    rows = [("4x32/8x2048:k8192", [(2048, 8192)] * 4), ("1x32/8x2048:k8192", [(2048, 8192)]),
            ("8x32/8x2048:k8192", [(2048, 8192)] * 8), ("2x32/8x8192", [(8192, 8192)] * 2),
            ("16x32/8x1024:k4096", [(1024, 4096)] * 16), ("8x32/8x1024", [(1024, 1024)] * 8),
            ("[8192,4096*2,2048*4,1024*8]",
             [(8192, 8192)] + [(4096, 4096)] * 2 + [(2048, 2048)] * 4 + [(1024, 1024)] * 8),
            ("[2048*4]", [(2048, 2048)] * 4),
            ("[512*16]", [(512, 512)] * 16), ("[3072,1024*5]", [(3072, 3072)] + [(1024, 1024)] * 5)]
    print(f"{'shape':28s} {'tasks':>6s} {'snake':>7s} {'counter':>8s} {'tail LPT':>9s} "
          f"{'pair swaps':>11s}")
    for name, seqs in rows:
        costs = packed_list(seqs, 16, 8)  # head_cluster 2: 16 task heads, 8 K/V heads
        print(f"{name:28s} {len(costs):6d} {excess(snake(costs, CLUSTERS)):7.1%} "
              f"{excess(counter(costs, CLUSTERS)):8.1%} {excess(tail_dealt(costs, CLUSTERS)):9.1%} "
              f"{excess(pair_swaps(costs, CLUSTERS)):11.2%}")


if __name__ == "__main__":
    main()
