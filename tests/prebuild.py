"""The kernels the tests compile, built ahead of them in the background (tests/conftest.py).

Test helper, not a test module. A test that compiles real kernels says which with the marker

    @pytest.mark.builds(Artifact(cfg, pclass), ...)   # or a KernelConfig (default class), or a
                                                      # callable returning an iterable of them

and conftest.py, when the run starts, hands every marked artifact of the selected tests to a
pool of ``usable_cpus()`` background processes (niced, so the tests running meanwhile keep
their CPU) that compile them into the session's build cache, in test order. Before a marked
test runs, conftest waits for its artifacts; the test's own build_config / build_many then
finds them in the cache. The test still builds, and checks, exactly what it did: the marker
only moves the compile earlier and beside other compiles (two nvcc on two cores), and a test
whose artifact was not prebuilt (a failure, or a marker that names another one) compiles it
itself as before. FA_TUNE_TEST_PREBUILD=0 turns the background builds off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tuner.kernel import build
from tuner.kernel.config import KernelConfig
from tuner.problem import DEFAULT_CLASS, ProblemClass

NICE = 10  # background compiles yield the CPU to the tests running meanwhile


@dataclass(frozen=True)
class Artifact:
    """One build_config call: a config for a problem class, with -D defines, validated or not
    (build.build_config's arguments)."""

    config: KernelConfig
    pclass: ProblemClass = DEFAULT_CLASS
    defines: tuple[tuple[str, str | int], ...] = ()
    check: bool = True

    @classmethod
    def of(cls, config: KernelConfig, pclass: ProblemClass = DEFAULT_CLASS,
           defines: dict[str, str | int] | None = None, check: bool = True) -> Artifact:
        return cls(config, pclass, tuple(sorted((defines or {}).items())), check)


Spec = Artifact | KernelConfig | Callable[[], Iterable[Artifact | KernelConfig]]


def artifacts_of(specs: Iterable[Spec]) -> list[Artifact]:
    """A builds marker's arguments as Artifacts (callables called, configs at the default
    class)."""
    out: list[Artifact] = []
    for s in specs:
        if isinstance(s, (Artifact, KernelConfig)):
            items: Iterable[Any] = (s,)
        else:
            items = s()
        for a in items:
            out.append(a if isinstance(a, Artifact) else Artifact(a))
    return out


def start_worker() -> None:
    """Pool initializer: lower this worker's priority (its nvcc inherit it)."""
    try:
        os.nice(NICE)
    except OSError:
        pass


def build_one(a: Artifact, cache_root: str) -> tuple[str, Any, str | None]:
    """Build one artifact into the cache (in a pool worker); errors come back flattened, as
    build._worker gives them (the test that needs the artifact reports them)."""
    return build._worker(a.config.to_dict(), None, cache_root, dict(a.defines) or None,
                         a.pclass, a.check)
