#!/usr/bin/env python3
"""`fa-tune` with the search loop's own time counted: the parent's time per ask (sampler and
storage reads) and per tell (storage writes), printed to stderr when the command ends. For
issue 38's question whether 16 nvcc on 16 cores starve the loop (docs/PERF.md steps 70-71):

    python3 lab/search_timed.py search --study S --shape 1x32/8x8192 --timeout 240s --jobs 14
"""

from __future__ import annotations

import atexit
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.search import loop  # noqa: E402

spent: dict[str, list[float]] = {"_ask": [], "_tell": []}


def timed(f: Callable[..., Any], times: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            times.append(time.perf_counter() - t0)
    return wrapper


def report() -> None:
    parts = [f"{name[1:]} {len(v)} x {1e3 * statistics.mean(v):.0f} ms "
             f"(median {1e3 * statistics.median(v):.0f}, sum {sum(v):.1f} s)"
             for name, v in spent.items() if v]
    print("loop time: " + "; ".join(parts), file=sys.stderr)


if __name__ == "__main__":  # the GPU worker is spawned: it re-imports this file as a module
    for name, times in spent.items():
        setattr(loop.Search, name, timed(getattr(loop.Search, name), times))
    atexit.register(report)
    from tuner.cli import main

    main()
