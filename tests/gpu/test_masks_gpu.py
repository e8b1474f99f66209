"""Issue 36 on an H200: the models' masks in the kernel. A sliding window (causal and not, S_q
< S_k, a window narrower than a KV tile and one wider than the keys, varlen), a logit softcap
and attention sinks, each on its own and together, pass the gate against the FP32 reference
on every input set, for the schedulers and the cluster kinds that build them differently
(grid, static with its window-aware cost model, dynamic, a multicast pair with wg_skip, and
D 64's sum_in_pv, whose row sums the sinks join). A library of a class without a mask refuses a
problem that needs it in one sentence, and a window library runs problems without a window.

    pytest -s -m gpu tests/gpu/test_masks_gpu.py
"""

from __future__ import annotations

import pytest
from gate_cases import case_id, case_kernels, gate_case

from tuner.kernel import build
from tuner.kernel.config import KernelConfig, load_preset
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.problem import Problem, ProblemClass

pytestmark = pytest.mark.gpu

# (preset, problems): each problem's class is built for that preset. Lengths off the tiles,
# GQA/MQA, windows below a tile (64 keys), near one (128), far wider (4096 over 3000 keys).
CASES: list[tuple[str, list[str]]] = [
    ("default", ["2x8/2x1000:w128", "1x8/2x333:k1500:w200", "2x4x700:w4096", "1x8x300:w1",
                 "1x8/2x1000:w64:cap50", "1x8/2x1000:sinks", "1x8/2x1000:w128:cap30:sinks",
                 "8/2x[300:1000,0:64,128,1:513]:w100:sinks"]),
    ("static", ["2x8/2x1000:w128", "1x8/1x2048:k4096:w512", "1x8/2x1000:cap50:sinks"]),
    ("dynamic", ["2x8/2x1000:w128:sinks", "1x8/2x1000:cap50"]),
    ("multicast", ["2x8/2x1000:w128", "1x8/2x2000:w300:sinks"]),
    ("full-qregs", ["2x8/2x1000:full:w128", "1x8/2x300:k1000:full:w64:sinks",
                    "1x8x500:k200:full:w50"]),
    ("d64-sumpv", ["1x16/2x1000:d64:w128:sinks", "1x16/2x1000:d64:sinks",
                   "16/2x[300:1000,128,1:513]:d64:w128:sinks"]),
    ("d256", ["1x4/2x600:d256:cap50", "1x4/2x600:d256:sinks"]),
]
ALL = [(name, Problem.parse(t)) for name, texts in CASES for t in texts]


@pytest.fixture(scope="module")
def kernels() -> dict[tuple[KernelConfig, ProblemClass], KernelLaunch]:
    return case_kernels(ALL)


@pytest.mark.parametrize(("name", "p"), ALL, ids=lambda x: case_id(x))
def test_masks_pass_the_gate(bench: Bench, kernels: dict, name: str, p: Problem) -> None:
    g = gate_case(bench, kernels, load_preset(name), p)
    assert g.passed, g.summary()


def test_a_window_library_runs_problems_without_one(bench: Bench, kernels: dict) -> None:
    """The window class with no window: the plain causal problem, gated."""
    cfg = load_preset("default")
    pc = Problem.parse("2x8/2x1000:w128").problem_class
    plain = Problem.parse("2x8/2x1000")
    kernel = kernels[(cfg, pc)]
    g = bench.gate(kernel, plain)
    bench.release(plain)
    assert g.passed, g.summary()


def test_a_library_without_the_mask_refuses_in_one_line(kernels: dict) -> None:
    cfg = load_preset("default")
    kernel = kernels[(cfg, Problem.parse("2x8/2x1000:w128").problem_class)]
    why = kernel.module.unsupported(Problem.parse("1x8/2x1000:cap50"))
    assert why is not None and "without softcapping" in why and "\n" not in why


@pytest.mark.parametrize(("bug", "text"), [(9, "2x8/2x1000:w128"), (9, "1x8/2x300:k1500:w200"),
                                           (10, "1x8/2x1000:sinks")])
def test_the_gate_catches_planted_mask_bugs(bench: Bench, bug: int, text: str) -> None:
    """cuda_src/lab/hooks.cuh: 9 keeps the key just left of each row's window, 10 takes the
    sink to base 2. Both must fail the gate on the problems they change."""
    p = Problem.parse(text)
    res = build.build_config(load_preset("default"), defines={"FA_TUNE_PLANT_BUG": bug},
                             pclass=p.problem_class)
    res.require_timeable()
    g = bench.gate(KernelLaunch(res.so_path), p)
    bench.release(p)
    print(f"bug {bug} {p}: {g.summary()}")
    assert not g.passed, f"planted bug {bug} passed the gate on {p}"
