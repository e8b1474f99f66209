"""Issue 15 on an H200: the varlen (packed) kernel. Every library built with the varlen kernel
passes the gate (every input set, the BF16 budget, poisoned outputs) on packed batches with
lengths 0 and 1, sequences shorter than a tile, uneven lengths, GQA and MQA, at D 64, 128 and
256, causal and not; the reference computes each sequence on its own, so a tile that reads or
writes across a sequence boundary fails. multicast (clusters dealt a snake over the task
list) is among the configs. A library without the varlen kernel refuses a varlen problem
before launching; a varlen library still runs fixed-length problems.

    pytest -s -m gpu tests/gpu/test_varlen_gpu.py
"""

from __future__ import annotations

import dataclasses

import pytest
from gate_cases import case_id, case_kernels, gate_case

from tuner.kernel import build
from tuner.kernel.config import KernelConfig, load_preset
from tuner.kernel.runtime import KernelError
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.measure.reference_numpy import RISING_MAX_S
from tuner.problem import Problem, ProblemClass

pytestmark = pytest.mark.gpu

# Per head dim, configs whose varlen kernel compiles without local memory (config.check_varlen:
# the warp-uniform varlen producer needs 24 registers, so every preset's does); at D 256 also
# multicast at 128x80, which the 24-register producer made possible.
CONFIGS: dict[int, list[KernelConfig]] = {
    64: [load_preset("d64-static"), load_preset("d64")],
    128: [load_preset(n) for n in ("default", "dynamic", "static", "baseline", "multicast")],
    256: [load_preset("d256"),
          dataclasses.replace(load_preset("d256"), scheduler="static", fixed_cost=4,
                              kv_multicast=True)],
}
LENGTHS = [
    [1000, 333, 0, 1, 17, 64, 129],   # 0 and 1, shorter than a tile, tile edges, uneven
    [2048, 1, 1500, 777],
    [5] * 40 + [300],                # many short sequences and one longer
]
HEADS = [(8, 2), (6, 1), (4, 4)]      # GQA, MQA, MHA
# Separate key lengths (issue 34: each sequence's new queries over its cached prefix, causal
# aligned bottom-right): longer keys, equal, a sequence with keys and no query, one query.
KEY_LENGTHS = [
    [1500, 333, 5, 100, 17, 1000, 129],
    [4096, 1, 1500, 2000],
    [5 + i for i in range(40)] + [300],
]
CASES = [(c, Problem.varlen(lens, hq, Hkv=hkv, D=d, causal=causal, seqlens_k=klens))
         for d, cfgs in CONFIGS.items() for c in cfgs for causal in (True, False)
         for lens, (hq, hkv) in zip(LENGTHS, HEADS, strict=True)
         for klens in (None, KEY_LENGTHS[LENGTHS.index(lens)])]


@pytest.fixture(scope="module")
def kernels(launches_for) -> dict[tuple[KernelConfig, ProblemClass], KernelLaunch]:
    return launches_for(CONFIGS, varlen=True)


@pytest.mark.parametrize(("cfg", "problem"), CASES, ids=case_id)
def test_varlen_passes_gate(bench: Bench, kernels: dict, cfg: KernelConfig,
                            problem: Problem) -> None:
    g = gate_case(bench, kernels, cfg, problem)
    assert g.passed, g.summary()


def test_default_gates_a_packed_batch_over_32768_keys(bench: Bench) -> None:
    """A realistic mixed batch (8 prompts, 55552 packed keys): more keys in all than one rising
    trend holds, each sequence within it, so every input set (rising too: its trend per
    sequence, oracle ABI 9) gates the default preset's varlen kernel."""
    problem = Problem.parse("32/8x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,"
                            "3072:4096,6144:14336]")
    assert problem.tokens_k > RISING_MAX_S >= max(problem.seqlens_k)
    kernels = case_kernels([("default", problem)])
    g = gate_case(bench, kernels, load_preset("default"), problem)
    assert "rising" in [s.input_set for s in g.sets]
    assert g.passed, g.summary()


def test_varlen_library_runs_fixed_length_too(bench: Bench, kernels: dict) -> None:
    kernel = kernels[(CONFIGS[128][0], ProblemClass(128, True, varlen=True))]
    problem = Problem(2, 8, 1000, Hkv=2)
    g = bench.gate(kernel, problem)
    bench.release(problem)
    assert g.passed, g.summary()


def test_fixed_library_refuses_varlen(bench: Bench) -> None:
    problem = Problem.varlen([300, 100], 8, Hkv=2)
    fixed = build.build_config(load_preset("default"), pclass=ProblemClass(128, True))
    kernel = KernelLaunch(fixed.so_path)
    assert kernel.supports(problem) is not None
    with pytest.raises(KernelError, match="no varlen kernel"):
        kernel.forward(bench.load_inputs(problem), bench.stream)
    bench.release(problem)


def test_oracle_varlen_reference_is_each_sequence_on_its_own(bench: Bench) -> None:
    """The gate's varlen reference (oracle_reference_varlen) equals, bit for bit, the fixed
    reference of each sequence alone: the packed indexing (rows, K/V heads, LSE [Hq, total])
    is the reference's, not borrowed from the kernel under test."""
    import numpy as np

    from tuner.kernel.runtime import AttnBuffers
    from tuner.measure.oracle import inputs_to_host

    for causal in (True, False):
        p = Problem.varlen([300, 0, 1, 130, 64], 8, Hkv=2, causal=causal)
        bufs = bench.load_inputs(p)
        dev, orc, st = bench.dev, bench.oracle, bench.stream
        with dev.alloc(bufs.n * 4) as o_ref, dev.alloc(bufs.n_lse * 4) as lse_ref:
            orc.reference_for(bufs, o_ref.ptr, lse_ref.ptr, st)
            st.synchronize()
            o_all = o_ref.copy_to_host(np.float32).reshape(p.tokens, p.Hq, p.D)
            lse_all = lse_ref.copy_to_host(np.float32).reshape(p.Hq, p.tokens)
        q, k, v = (x[0] for x in inputs_to_host(bufs))
        cu = p.cu_seqlens()
        for b, n in enumerate(p.seqlens):
            if n == 0:
                continue
            rows = slice(cu[b], cu[b + 1])
            with AttnBuffers(dev, Problem(1, p.Hq, n, Hkv=p.Hkv, causal=causal)) as one, \
                    dev.alloc(one.n * 4) as o1, dev.alloc(one.n_lse * 4) as l1:
                for buf, x in ((one.q, q), (one.k, k), (one.v, v)):
                    buf.copy_from_host(np.ascontiguousarray(x[rows]))
                orc.reference_for(one, o1.ptr, l1.ptr, st)
                st.synchronize()
                assert np.array_equal(o1.copy_to_host(np.float32).reshape(n, p.Hq, p.D),
                                      o_all[rows]), (causal, b)
                assert np.array_equal(l1.copy_to_host(np.float32).reshape(p.Hq, n),
                                      lse_all[:, rows]), (causal, b)
        bench.release(p)
