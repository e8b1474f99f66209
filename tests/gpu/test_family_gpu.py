"""Issue 14 on an H200: the kernel family. Hkv is a run-time argument (MHA, GQA, MQA); the head
dim (64, 128, 256) and the mask are the problem class, compiled in. Every variant passes the
gate (every input set, the BF16 budget) on problems no tile divides, with Hq/Hkv in
{1, 2, 4, 8, 32}, MQA and B > 1: at D 128 the presets of every scheduler, at D 64 and 256 the
head dim's presets and its search space's seeds (static and multicast among them), and at every
head dim the clustered kernels: K/V shared by TMA multicast along a pair of query tiles
(kv_multicast) and along the query heads of one GQA group (head_cluster 2 or 4), alone and
combined, on the static and grid schedulers (D 64, and 4-CTA clusters at D 128, cut each
64-column box into row slices); each on the problems it can run (Hq/Hkv a multiple of
head_cluster). A library refuses a problem of another class, or a group its head_cluster does
not divide, before launching; planted bug 8 (the GQA head mapping) fails on a cluster.

    pytest -s -m gpu tests/gpu/test_family_gpu.py
"""

from __future__ import annotations

import pytest
from gate_cases import case_id, gate_case

from tuner.errors import ShapeError
from tuner.kernel import build
from tuner.kernel.config import KernelConfig, list_presets, load_preset, preset_head_dim
from tuner.kernel.runtime import KernelError
from tuner.kernel.support import check_problem
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.problem import Problem, ProblemClass
from tuner.search.loop import seed_params
from tuner.search.sampler import config_from_params
from tuner.search.space import default_space_name, load_space

pytestmark = pytest.mark.gpu


_STATIC = {"scheduler": "static", "fixed_cost": 4, "producer_regs": 24,
           "consumer_regs": 240, "q_release": "after_last_qk"}


def _cluster(**knobs: object) -> KernelConfig:
    return KernelConfig().replace(**{**_STATIC, **knobs})


# Clustered kernels beyond the presets and seeds (docs/PERF.md step 37).
CLUSTERS: dict[int, list[KernelConfig]] = {
    128: [
        _cluster(head_cluster=4),
        KernelConfig().replace(head_cluster=2),  # grid: clusters along the heads
        _cluster(kv_multicast=True, head_cluster=2, q_in_regs=True),
        _cluster(kv_multicast=True, head_cluster=4),  # 8 CTAs: 4 row slices of 32
    ],
    64: [
        _cluster(kv_multicast=True),  # one 64-column box: each CTA loads half its rows
        _cluster(kv_multicast=True, head_cluster=2),
        _cluster(block_m=192, consumer_regs=160, head_cluster=2),
    ],
    256: [  # Q and O share one buffer at D 256 (shared memory): q_release at_end
        _cluster(block_n=80, q_release="at_end", kv_multicast=True, head_cluster=2,
                 lazy_rescale=True),
        _cluster(block_n=80, q_release="at_end", head_cluster=2),
    ],
}


def _configs(d: int) -> list[KernelConfig]:
    if d == 128:
        out = [load_preset(n) for n in ("default", "baseline", "static", "dynamic", "multicast",
                                        "gqa-cluster")]
    else:
        out = [load_preset(n) for n in list_presets() if preset_head_dim(n) == d]
        space = load_space(default_space_name(d))
        out += [config_from_params(p, space) for _, p in seed_params(space, d) if p is not None]
    return list(dict.fromkeys(out + CLUSTERS[d]))


def _runs(cfg: KernelConfig, problem: Problem) -> bool:
    try:
        check_problem(cfg, problem)
    except ShapeError:
        return False
    return True


CONFIGS = {d: _configs(d) for d in (64, 128, 256)}
# Uneven problems; groups 4, 6 (MQA), 1, 4, 1, 2, and for head_cluster 4 also 8 (MQA) and 4.
PROBLEMS = [Problem(2, 8, 1000, Hkv=2), Problem(1, 6, 333, Hkv=1), Problem(3, 4, 777),
            Problem(1, 32, 1500, Hkv=8), Problem(2, 32, 600, Hkv=32), Problem(1, 8, 2048, Hkv=4)]
CLUSTER_PROBLEMS = [Problem(1, 8, 333, Hkv=1), Problem(2, 8, 600, Hkv=2)]
# Queries over a longer KV (issue 34: prefix caching, chunked prefill; the causal mask aligned
# bottom-right): a few queries over many keys, an offset no tile divides, S_k = S_q + 1, and
# (non-causal only) more queries than keys.
KV_PROBLEMS = [Problem(2, 8, 333, Hkv=2, Sk=1000), Problem(1, 6, 1000, Hkv=1, Sk=2777),
               Problem(1, 32, 64, Hkv=8, Sk=1500), Problem(3, 4, 777, Sk=778)]
NONCAUSAL_KV_PROBLEMS = [Problem(1, 4, 777, Sk=300, causal=False)]
CASES = [(c, q) for d, cfgs in CONFIGS.items() for c in cfgs for causal in (True, False)
         for p in (PROBLEMS if causal else PROBLEMS[::2])
                  + (CLUSTER_PROBLEMS if c.head_cluster == 4 else [])
                  + (KV_PROBLEMS if causal else KV_PROBLEMS[::2] + NONCAUSAL_KV_PROBLEMS)
         for q in [Problem(p.B, p.Hq, p.S, Hkv=p.Hkv, D=d, causal=causal, Sk=p.S_k)]
         if _runs(c, q)]


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


def test_library_refuses_a_group_head_cluster_does_not_divide(bench: Bench,
                                                              kernels: dict) -> None:
    kernel = kernels[(CLUSTERS[128][0], ProblemClass(128, True))]  # head_cluster 4
    problem = Problem(1, 6, 256, Hkv=3)  # group 2
    assert "head_cluster 4 runs that many query heads" in (kernel.supports(problem) or "")
    with pytest.raises(KernelError, match="Hq/Hkv is 2; use a config with head_cluster 1 or 2"):
        kernel.forward(bench.load_inputs(problem), bench.stream)
    bench.release(problem)


def test_gate_rejects_wrong_gqa_head_mapping_on_a_cluster(bench: Bench) -> None:
    cfg = CLUSTERS[128][2]  # kv_multicast + head_cluster 2: 4 CTAs
    r = build.build_config(cfg, defines={"FA_TUNE_PLANT_BUG": 8},
                           pclass=ProblemClass(128, True))
    r.require_timeable()
    kernel = KernelLaunch(r.so_path)
    problem = Problem(2, 8, 1000, Hkv=2)
    g = bench.gate(kernel, problem)
    bench.release(problem)
    print(f"bug 8 {case_id(cfg)} {problem} {g.summary()}")
    assert not g.passed, g.summary()
