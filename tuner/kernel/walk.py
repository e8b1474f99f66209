"""Whether a kv_walk kernel walks a problem (cuda_src/fa_tune/walk.cuh), for reports.

The kernel decides per call: the dynamic scheduler's prepare walks strips only where each query
tile's KV tiles fit the rings at once (``KvWalk::most_tiles <= k_stages``); otherwise the same
kernel runs tile by tile. This is that count, so a lab table can say which rows walked;
tests/test_kv_walk.py checks it against the C++ on every shape it replays.
"""

from __future__ import annotations

from tuner.kernel.config import KernelConfig
from tuner.problem import Problem, ProblemClass


def most_tiles(problem: Problem, block_m: int, block_n: int) -> int:
    """The most KV tiles one query tile of a fixed-length causal problem reads (a problem
    without a window: all keys up to its diagonal)."""
    off = problem.Sk - problem.S
    window = problem.window - 1 if problem.window > 0 else 1 << 30  # the kernel's kNoWindow
    most = 0
    for m in range(-(-problem.S // block_m)):
        keys = min((m + 1) * block_m + off, problem.Sk)
        hi = -(-keys // block_n) if keys > 0 else 1
        first = m * block_m + off - window
        lo = min(first // block_n, hi - 1) if first > 0 else 0
        most = max(most, hi - lo)
    return most


def walks(cfg: KernelConfig, problem: Problem, pclass: ProblemClass) -> bool:
    """Whether cfg's kernel of class pclass walks strips on this problem."""
    if cfg.kv_walk <= 1 or not (pclass.window and pclass.causal) or problem.device_scheduled:
        return False
    return most_tiles(problem, cfg.block_m, cfg.block_n) <= cfg.k_stages
