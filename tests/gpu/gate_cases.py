"""What the gate-every-config GPU test files share (imported by name: tests/gpu is on sys.path):
the parametrize ids and one gated case."""

from __future__ import annotations

from tuner.config import KernelConfig
from tuner.measure.bench import Bench
from tuner.measure.oracle import GateResult
from tuner.problem import Problem


def case_id(x: object) -> str:
    """A config as '<config id>-<scheduler>[-multicast][-heads<N>]', anything else as its
    text."""
    if isinstance(x, KernelConfig):
        return (f"{x.config_id()}-{x.scheduler}" + ("-multicast" if x.kv_multicast else "")
                + (f"-heads{x.head_cluster}" if x.head_cluster > 1 else ""))
    return str(x)


def gate_case(bench: Bench, kernels: dict, cfg: KernelConfig, problem: Problem) -> GateResult:
    """Gate cfg's kernel (built for the problem's class) on the problem; print the summary."""
    kernel = kernels[(cfg, problem.problem_class)]
    assert kernel.module.problem_class == problem.problem_class
    g = bench.gate(kernel, problem)
    bench.release(problem)
    print(f"{case_id(cfg):36s} {problem!s:40s} {g.summary()}")
    return g
