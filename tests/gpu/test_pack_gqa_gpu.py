"""pack_gqa on the GPU (docs/PERF.md step 76): a GQA group's query heads in one tile's rows
(P, the largest power of two up to 8 dividing Hq/Hkv, chosen at launch), Q and O through a 5-D
TMA view, each task's key tiles from its first key. Every packed kernel passes the gate (every
input set, the BF16 budget) on problems no tile divides: groups of 8, 4, 6 (P 2), 16 (P 8) and
MHA (P 1), queries over a longer cache, windows of 1 to 1000 keys, sinks (one per query head:
a row's head comes from its row), a window library called without one, a packed batch (the
library's varlen kernel runs unpacked), and at D 128 causal and non-causal without a window.

    pytest -s -m gpu tests/gpu/test_pack_gqa_gpu.py
"""

from __future__ import annotations

import pytest
from gate_cases import case_id

from tuner.kernel import build
from tuner.kernel.config import KernelConfig, load_preset
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.problem import Problem, ProblemClass

pytestmark = pytest.mark.gpu

W2_80 = load_preset("d64-window").replace(block_n=80, k_stages=2, v_stages=2, pack_gqa=True)
W2_144 = load_preset("d64-window").replace(block_n=144, k_stages=2, v_stages=2, pack_gqa=True)
W3_48 = load_preset("d64-window-packed")  # d64-window3 packed at block_n 48 (the 64 x 48 atom)
SHARED = load_preset("d64-window-shared")  # two warpgroups a packed tile, two CTAs an SM
D128 = KernelConfig().replace(scheduler="static", producer_regs=24, q_release="after_last_qk",
                              q_in_regs=True, pack_gqa=True)

WINDOW = ["2x32/4x1000:d64:w100", "1x12/3x777:k1500:d64:w300", "3x6/1x513:d64:w17",
          "1x16x300:d64:w64", "1x16/1x1000:d64:w1", "1x8/1x200:d64:w1000",
          "1x64/8x1000:d64:w128:sinks", "2x12/3x333:k400:d64:w50:sinks",
          "16/2x[300:1000,128,1:513]:d64:w128"]
PLAIN = ["1x32/8x1000", "2x12/4x777:k2000", "1x6/1x300", "1x32/8x1000:full",
         "2x12/3x333:k500:full"]
CASES = ([(c, Problem.parse(t)) for c in (W2_80, W2_144, W3_48, SHARED) for t in WINDOW]
         + [(D128, Problem.parse(t)) for t in PLAIN])


@pytest.fixture(scope="module")
def kernels() -> dict[tuple[KernelConfig, ProblemClass], KernelLaunch]:
    out: dict[tuple[KernelConfig, ProblemClass], KernelLaunch] = {}
    for cfg, p in CASES:
        # A varlen library for the window class, so its unpacked varlen kernel is built too.
        pc = p.problem_class
        if pc.window:
            pc = ProblemClass(64, True, True, window=True, sinks=pc.sinks)
        if (cfg, pc) not in out:
            res = build.build_config(cfg, pclass=pc)
            res.require_timeable()
            out[(cfg, pc)] = KernelLaunch(res.so_path)
    return out


def _kernel(kernels: dict, cfg: KernelConfig, p: Problem) -> KernelLaunch:
    return next(k for (c, pc), k in kernels.items()
                if c == cfg and pc.head_dim == p.D and pc.causal == p.causal
                and pc.window == (p.window > 0 or p.D == 64) and pc.sinks == p.sinks)


@pytest.mark.parametrize(("cfg", "problem"), CASES, ids=case_id)
def test_packed_kernels_pass_the_gate(bench: Bench, kernels: dict, cfg: KernelConfig,
                                      problem: Problem) -> None:
    g = bench.gate(_kernel(kernels, cfg, problem), problem)
    bench.release(problem)
    print(f"{case_id(cfg):36s} {problem!s:40s} {g.summary()}")
    assert g.passed, g.summary()


def test_a_packed_window_library_runs_problems_without_one(bench: Bench,
                                                           kernels: dict) -> None:
    plain = Problem.parse("1x16/2x1000:d64")
    kernel = next(k for (c, pc), k in kernels.items() if c == W2_80 and not pc.sinks)
    g = bench.gate(kernel, plain)
    bench.release(plain)
    assert g.passed, g.summary()
