"""Issue 3 on an H200: a few configs of the knob-coverage sample pass the gate on all three seed
shapes (the CPU test compiles the whole sample; this one runs the first configs it adds to the
D 128 presets, which cover the most knob values; the presets pass the gate in
test_planted_bugs_gpu.py). Same path as `fa-tune run`: the cached .so through its C ABI,
tuner.measure.oracle's gate with every default input set."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the knob_sample helper
from knob_sample import gpu_sample  # noqa: E402

from tuner.kernel import build
from tuner.kernel.config import KernelConfig  # noqa: E402
from tuner.kernel.runtime import AttnBuffers, Device, KernelModule  # noqa: E402
from tuner.kernel.support import unsupported  # noqa: E402
from tuner.measure import oracle  # noqa: E402
from tuner.problem import SEED_PROBLEMS, Problem  # noqa: E402

pytestmark = pytest.mark.gpu

SAMPLE = gpu_sample(4)


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device.open(0)


@pytest.fixture(scope="module")
def built(dev: Device) -> Iterator[dict[KernelConfig, build.BuildOutcome]]:
    outcomes = build.build_many(SAMPLE, jobs=len(SAMPLE))
    yield {o.config: o for o in outcomes}


def runnable(shape: Problem, cfg: KernelConfig) -> Problem:
    """The seed problem as cfg can run it: a config that shares K/V across a head cluster needs
    that many query heads per K/V head, so an MHA seed becomes GQA of that group."""
    if unsupported(shape, cfg) is None:
        return shape
    return dataclasses.replace(shape, Hkv=shape.Hq // cfg.head_cluster)


@pytest.mark.parametrize("shape", SEED_PROBLEMS, ids=str)
@pytest.mark.parametrize("cfg", SAMPLE, ids=lambda c: c.config_id())
def test_sample_config_passes_gate(
    dev: Device, built: dict[KernelConfig, build.BuildOutcome], cfg: KernelConfig, shape: object
) -> None:
    o = built[cfg]
    assert o.ok, f"{cfg.diff_from_default()}: {o.error}"
    assert o.result is not None
    o.result.require_timeable()
    kernel = KernelModule(o.result.so_path)
    shape = runnable(shape, cfg)
    assert unsupported(shape, cfg) is None
    with AttnBuffers(dev, shape) as bufs:
        g = oracle.gate(dev, kernel, shape, bufs)
    assert g.passed, f"{cfg.config_id()} {cfg.diff_from_default()}: {g.summary()}"
