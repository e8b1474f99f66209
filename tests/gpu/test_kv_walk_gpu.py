"""kv_walk on the GPU (cuda_src/fa_tune/walk.cuh): kernels that walk strips of query tiles and
keep the window's K/V tiles in their rings pass the gate against the FP32 reference: windows
below, at and above a KV tile, keys off the tiles' grid (S_q < S_k), strips cut short by the
last query tile, a strip of 2 and of 16, with and without early_next_qk and sinks. The same
kernels run tile by tile where a call's window needs more KV tiles than the rings hold, or has
none (the window library's plain causal call), and the varlen kernel of the same library (which
never walks): those pass too.

    pytest -s -m gpu tests/gpu/test_kv_walk_gpu.py
"""

from __future__ import annotations

import pytest
from gate_cases import case_id

from tuner.kernel import build
from tuner.kernel.config import KernelConfig, load_preset
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.problem import Problem

pytestmark = pytest.mark.gpu

BASE = load_preset("d64-window")
CONFIGS = {
    "walk8": BASE.replace(kv_walk=8, k_stages=4, v_stages=4),
    "walk2-k3": BASE.replace(kv_walk=2, k_stages=3, v_stages=3),
    "walk16-late": BASE.replace(kv_walk=16, k_stages=4, v_stages=4, early_next_qk=False,
                                q_release="at_end"),
}
# Each needs 3 KV tiles per query tile (1 for w1), the last two 4: walked by the 4-stage
# configs, tile by tile by the 3-stage one. Then no walk: a 200-key window (5 tiles), no window,
# a packed batch (the varlen kernel).
PROBLEMS = ["1x16/2x1000:d64:w128", "1x16/2x1000:d64:w129:sinks", "2x8/2x777:k1200:d64:w100",
            "1x8x640:d64:w1", "1x16/2x4096:d64:w128", "1x8/1x300:k301:d64:w64",
            "1x8x2000:d64:w150", "1x4/1x1500:k2000:d64:w160:sinks",
            "1x16/2x1000:d64:w200", "2x8/2x700:d64", "8/2x[300:1000,0:64,128,1:513]:d64:w128:sinks"]
CASES = [(name, Problem.parse(t)) for name in CONFIGS for t in PROBLEMS]


@pytest.fixture(scope="module")
def kernels() -> dict[str, KernelLaunch]:
    # One library per config, of the class with sinks and varlen: it serves every problem above.
    pclass = Problem.parse("8/2x[300,1]:d64:w128:sinks").problem_class
    out = {}
    for name, cfg in CONFIGS.items():
        res = build.build_config(cfg, pclass=pclass)
        res.require_timeable()
        out[name] = KernelLaunch(res.so_path)
    return out


@pytest.mark.parametrize(("name", "p"), CASES, ids=lambda x: case_id(x))
def test_walking_kernels_pass_the_gate(bench: Bench, kernels: dict, name: str, p: Problem) -> None:
    kernel = kernels[name]
    why = kernel.module.unsupported(p)
    assert why is None, why  # every window here fits the rings
    g = bench.gate(kernel, p)
    bench.release(p)
    print(f"{name:12s} {p!s:44s} {g.summary()}")
    assert g.passed, g.summary()


def test_the_walk_is_id_neutral_and_changes_only_its_own_configs() -> None:
    assert KernelConfig().config_id() == KernelConfig(kv_walk=1).config_id()
    assert CONFIGS["walk8"].config_id() != BASE.replace(k_stages=4, v_stages=4).config_id()
