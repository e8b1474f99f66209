"""Issue 14 on an H200: the kernel family. Hkv is a run-time argument (MHA, GQA, MQA); the head
dim (64, 128, 256) and the mask are the problem class, compiled in. Every variant passes the
gate (every input set, the BF16 budget) on problems no tile divides, with Hq/Hkv in
{1, 2, 4, 8, 32}, MQA and B > 1: at D 128 the presets of every scheduler, at D 64 and 256 the
head dim's presets and its search space's seeds (static and multicast among them). A library
refuses a problem of another class before launching.

    pytest -s -m gpu tests/gpu/test_family_gpu.py
"""

from __future__ import annotations

import pytest
from gate_cases import case_id, gate_case

from tuner.config import KernelConfig, list_presets, load_preset, preset_head_dim
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.problem import Problem, ProblemClass
from tuner.runtime import KernelError
from tuner.sampler import config_from_params
from tuner.search import seed_params
from tuner.space import default_space_name, load_space

pytestmark = pytest.mark.gpu


def _configs(d: int) -> list[KernelConfig]:
    if d == 128:
        return [load_preset(n) for n in ("default", "baseline", "static", "dynamic", "multicast")]
    out = [load_preset(n) for n in list_presets() if preset_head_dim(n) == d]
    space = load_space(default_space_name(d))
    out += [config_from_params(p, space) for _, p in seed_params(space, d) if p is not None]
    return list(dict.fromkeys(out))


CONFIGS = {d: _configs(d) for d in (64, 128, 256)}
# Uneven problems; groups 4, 6 (MQA), 1, 4, 1, 2.
PROBLEMS = [Problem(2, 8, 1000, Hkv=2), Problem(1, 6, 333, Hkv=1), Problem(3, 4, 777),
            Problem(1, 32, 1500, Hkv=8), Problem(2, 32, 600, Hkv=32), Problem(1, 8, 2048, Hkv=4)]
CASES = [(c, Problem(p.B, p.Hq, p.S, Hkv=p.Hkv, D=d, causal=causal))
         for d, cfgs in CONFIGS.items() for c in cfgs for causal in (True, False)
         for p in (PROBLEMS if causal else PROBLEMS[::2])]


@pytest.fixture(scope="module")
def kernels(launches_for) -> dict[tuple[KernelConfig, ProblemClass], KernelLaunch]:
    return launches_for(CONFIGS)


@pytest.mark.parametrize(("cfg", "problem"), CASES, ids=case_id)
def test_family_passes_gate(bench: Bench, kernels: dict, cfg: KernelConfig,
                            problem: Problem) -> None:
    g = gate_case(bench, kernels, cfg, problem)
    assert g.passed, g.summary()


@pytest.mark.parametrize(("lib", "problem", "needle"), [
    (ProblemClass(128, True), Problem(1, 4, 256, causal=False), "runs D 128, causal problems"),
    (ProblemClass(256, True), Problem(1, 4, 256), "runs D 256, causal problems"),
    (ProblemClass(64, False), Problem(1, 4, 256, D=128, causal=False), "runs D 64, non-causal"),
], ids=str)
def test_library_refuses_another_class(bench: Bench, kernels: dict, lib: ProblemClass,
                                       problem: Problem, needle: str) -> None:
    kernel = kernels[(CONFIGS[lib.head_dim][0], lib)]
    assert kernel.supports(problem) is not None
    with pytest.raises(KernelError, match=needle):
        kernel.forward(bench.load_inputs(problem), bench.stream)
    bench.release(problem)
