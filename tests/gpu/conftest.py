"""What the GPU tests share: one Bench per module, kernel libraries built per class, and the
oracle's device, library and stream per module."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tuner.kernel import build
from tuner.kernel.config import KernelConfig
from tuner.kernel.runtime import Device, OracleModule, Stream
from tuner.measure import oracle as O
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.problem import ProblemClass


@pytest.fixture(scope="module")
def bench() -> Iterator[Bench]:
    b = Bench(0)
    yield b
    b.close()


def build_launches(configs: dict[int, list[KernelConfig]], *, varlen: bool = False,
                   ) -> dict[tuple[KernelConfig, ProblemClass], KernelLaunch]:
    """Every config of each head dim built for both masks (with the varlen kernel when asked),
    each refused unless it compiles without local memory or serialized wgmma."""
    out = {}
    for d, cfgs in configs.items():
        for causal in (True, False):
            pclass = ProblemClass(d, causal, varlen)
            for o in build.build_many(cfgs, pclass=pclass):
                assert o.ok and o.result is not None, f"{o.config.diff_from_default()}: {o.error}"
                o.result.require_timeable()
                out[(o.config, pclass)] = KernelLaunch(o.result.so_path)
    return out


@pytest.fixture(scope="module")
def launches_for() -> Callable[..., dict[tuple[KernelConfig, ProblemClass], KernelLaunch]]:
    """build_launches, as a fixture (test modules cannot import a conftest)."""
    return build_launches


@pytest.fixture(scope="module")
def dev() -> Device:
    return Device.open(0)


@pytest.fixture(scope="module")
def orc(dev: Device) -> OracleModule:
    return O.get_oracle()


@pytest.fixture(scope="module")
def stream(dev: Device) -> Iterator[Stream]:
    s = dev.stream()
    yield s
    s.destroy()
