"""Issue 14 on an H200: fa-tune's kernel on GQA/MQA (Hkv a run-time argument) and non-causal
problems (the mask compiled in), at head dim 128, for every scheduler: every variant passes the
gate (every input set, the BF16 budget) on problems whose tiles do not divide evenly; a library
refuses a problem of the other mask before launching."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tuner import build
from tuner.config import KernelConfig, load_preset
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.problem import Problem
from tuner.runtime import KernelError

pytestmark = pytest.mark.gpu

CONFIGS = [load_preset("default"), load_preset("baseline"), load_preset("static"),
           load_preset("dynamic"), load_preset("multicast")]
CAUSAL = [Problem(2, 8, 1000, Hkv=2), Problem(1, 6, 333, Hkv=1), Problem(2, 4, 1000),
          Problem(3, 16, 2000, Hkv=4)]
FULL = [Problem(2, 4, 1000, causal=False), Problem(1, 8, 777, Hkv=2, causal=False),
        Problem(2, 16, 2000, Hkv=1, causal=False), Problem(1, 1, 77, causal=False)]


def _id(c: KernelConfig) -> str:
    return (f"{c.scheduler}" + ("-multicast" if c.kv_multicast else "")
            + ("-baseline" if c.k_stages == 1 else ""))


@pytest.fixture(scope="module")
def bench() -> Iterator[Bench]:
    b = Bench(0)
    yield b
    b.close()


@pytest.fixture(scope="module")
def kernels() -> dict[tuple[KernelConfig, bool], KernelLaunch]:
    out = {}
    for causal in (True, False):
        for o in build.build_many(CONFIGS, jobs=len(CONFIGS), causal=causal):
            assert o.ok and o.result is not None, f"{o.config.diff_from_default()}: {o.error}"
            o.result.require_timeable()
            out[(o.config, causal)] = KernelLaunch(o.result.so_path)
    return out


@pytest.mark.parametrize("problem", [*CAUSAL, *FULL], ids=str)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
def test_family_passes_gate(bench: Bench, kernels: dict, cfg: KernelConfig,
                            problem: Problem) -> None:
    kernel = kernels[(cfg, problem.causal)]
    assert kernel.module.causal is problem.causal
    g = bench.gate(kernel, problem)
    bench.release(problem)
    print(f"{_id(cfg):40s} {problem!s:16s} {g.summary()}")
    assert g.passed, g.summary()


def test_library_refuses_the_other_mask(bench: Bench, kernels: dict) -> None:
    causal_lib = kernels[(CONFIGS[0], True)]
    p = Problem(1, 4, 256, causal=False)
    assert causal_lib.supports(p) is not None
    with pytest.raises(KernelError, match="runs D 128, causal problems"):
        causal_lib.forward(bench.load_inputs(p), bench.stream)
    bench.release(p)
