"""Two or more launchables timed against each other in one process: each gated first, then
timed in turn, the order reversed every other pair (A B, B A, ...), so clock drift and heat
hit all alike. What scripts/export_timing.py (the export against the tuner's artifact) and
scripts/ab_libs.py (one kernel before and after a refactor) measure with."""

from __future__ import annotations

from typing import Any

from tuner.kernel.runtime import ShapeLike
from tuner.measure import timing


def gate_all(bench: Any, launches: dict[str, Any], shape: ShapeLike) -> dict[str, str]:
    """{name: the gate's summary} of each launch that fails the gate at ``shape``."""
    out = {}
    for name, launch in launches.items():
        verdict = bench.gate(launch, shape)
        if not verdict.passed:
            out[name] = verdict.summary()
    return out


def interleaved(bench: Any, launches: dict[str, Any], shape: ShapeLike,
                protocol: timing.Protocol, pairs: int) -> dict[str, list[float]]:
    """Median ms of each launch's timed rounds under ``protocol``, ``pairs`` times each, in
    alternating order: {name: [ms per turn]}."""
    names = list(launches)
    per: dict[str, list[float]] = {k: [] for k in names}
    for i in range(pairs):
        for name in names if i % 2 == 0 else names[::-1]:
            per[name].append(bench.time(launches[name], shape, protocol).median_ms)
    return per
