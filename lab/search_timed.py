#!/usr/bin/env python3
"""`fa-tune` with the search loop's own time counted, printed to stderr when the command ends:
the parent's time per ask (sampler and storage reads) and per tell (storage writes), and where
the GPU worker's idle time went (docs/PERF.md steps 70-72, issue 38):

    python3 lab/search_timed.py search --study S --shape 1x32/8x8192 --timeout 240s --jobs 14

The idle split, from the parent's side of each GPU request (sent, reply read, the worker's own
seconds): a reply that waited for the parent (a background ask still running when it came),
the parent's work between a reply and the next request (waiting for a compile, asks, the
rest: tells, storage writes, progress), and before the first request. lab/pipeline_model.py
uses the same counters.
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

from tuner.search import loop, worker_client  # noqa: E402

# (sent, reply read, worker seconds) per GPU request; (start, end) per ask and per tell;
# (start, end, a candidate was ready on entry) per _next_ready.
requests: list[tuple[float, float, float]] = []
asks: list[tuple[float, float]] = []
tells: list[tuple[float, float]] = []
waits: list[tuple[float, float, bool]] = []
started = [0.0]  # when record_timeline() ran


def _spans(f: Callable[..., Any], out: list[tuple[float, float]]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            out.append((t0, time.perf_counter()))
    return wrapper


def record_timeline() -> None:
    """Patch the GPU worker's request, the ask, the tell and _next_ready to log their spans."""
    started[0] = time.perf_counter()
    request, next_ready = worker_client.GpuWorker.request, loop.Search._next_ready

    def timed_request(self: Any, msg: dict[str, Any], *args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        reply = request(self, msg, *args, **kw)
        own = reply.get("worker_s") if isinstance(reply, dict) else None
        requests.append((t0, time.perf_counter(), float(own or 0.0)))
        return reply

    def timed_next_ready(self: Any) -> Any:
        t0 = time.perf_counter()
        ready = any(c.future.done() for c in self.queue)
        try:
            return next_ready(self)
        finally:
            waits.append((t0, time.perf_counter(), ready))

    worker_client.GpuWorker.request = timed_request  # type: ignore[method-assign]
    loop.Search._next_ready = timed_next_ready  # type: ignore[method-assign]
    loop.Search._ask = _spans(loop.Search._ask, asks)  # type: ignore[method-assign]
    loop.Search._tell = _spans(loop.Search._tell, tells)  # type: ignore[method-assign]


def loop_times() -> dict[str, list[float]]:
    """The parent's seconds per ask (sampler, storage reads) and per tell (storage writes)."""
    return {"ask": [e - s for s, e in asks], "tell": [e - s for s, e in tells]}


def _overlap(a0: float, a1: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a1, s1) - max(a0, s0)) for s0, s1 in spans)


def idle_split() -> dict[str, float]:
    """Seconds of the search's wall from record_timeline() to its last GPU reply, by where the
    GPU worker waited (its own seconds are "busy")."""
    if not requests:
        return {}
    out = {"before the first request": requests[0][0] - started[0],
           "busy": sum(w for _, _, w in requests),
           "reply waited for the parent": sum(max(0.0, r - s - w) for s, r, w in requests),
           "waiting for a compile": 0.0, "asks between requests": 0.0, "other loop work": 0.0}
    no_ready = [(s, e) for s, e, ready in waits if not ready]
    for (_, r0, _), (s1, _, _) in zip(requests, requests[1:], strict=False):
        gap = max(0.0, s1 - r0)
        wait = min(gap, _overlap(r0, s1, no_ready))
        # asks inside the gap, less their part inside a wait for a compile (counted there)
        clipped = [(max(a0, r0), min(a1, s1)) for a0, a1 in asks if a1 > r0 and a0 < s1]
        asked = sum(a1 - a0 - _overlap(a0, a1, no_ready) for a0, a1 in clipped)
        asked = min(gap - wait, max(0.0, asked))
        out["waiting for a compile"] += wait
        out["asks between requests"] += asked
        out["other loop work"] += gap - wait - asked
    return out


def report() -> None:
    parts = [f"{name} {len(v)} x {1e3 * statistics.mean(v):.0f} ms "
             f"(median {1e3 * statistics.median(v):.0f}, sum {sum(v):.1f} s)"
             for name, v in loop_times().items() if v]
    print("loop time: " + "; ".join(parts), file=sys.stderr)
    split = idle_split()
    if split:
        print("GPU worker's time to its last request: " + ", ".join(
            f"{k} {v:.1f} s" for k, v in split.items()), file=sys.stderr)


if __name__ == "__main__":  # the GPU worker is spawned: it re-imports this file as a module
    record_timeline()
    atexit.register(report)
    from tuner.cli import main

    main()
