"""Issue 37 on an H200: the kernel over a paged KV cache. A paged class's varlen kernel reads K
and V through the block table (tuner.paging: pages in random order, every odd sequence's first
page shared with sequence 0) and passes the gate against the FP32 reference on the dense keys,
at page sizes 8 to 256 (pages smaller than a tile, a tile per page, several tiles per page),
fixed-length and packed queries, with the models' masks, on configs whose K/V boxes differ
(block_n 80 and 112: 16-row boxes; multicast and head clusters: boxes shared by TMA multicast).
A bad block table gives NaN outputs and one status sentence, and the next call works.

    pytest -s -m gpu tests/gpu/test_paged_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
from gate_cases import case_id, case_kernels, gate_case

from tuner.kernel.config import KernelConfig, load_preset
from tuner.kernel.runtime import KernelError
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.problem import Problem, ProblemClass

pytestmark = pytest.mark.gpu

CASES: list[tuple[str, list[str]]] = [
    ("default", ["4x8/2x256:k2000:p64", "2x8/2x300:k1500:p8", "2x8/2x300:k1500:p16",
                 "2x8/2x1000:k1000:p128", "3x8/2x200:k3000:p256", "1x8x64:k64:p32",
                 "8/2x[300:1000,0:64,128,1:513,77:2000]:p16",
                 "8/2x[300:1000,0:64,128]:w200:sinks:p64", "2x8/2x300:k1500:cap30:p32"]),
    ("d256", ["2x4/2x300:k1000:d256:p16", "2x4/2x300:k1000:d256:p128"]),
    ("d64-static", ["2x16/2x500:k2000:d64:p32", "16/2x[500:2000,1:300]:d64:p256"]),
    ("multicast", ["2x8/2x700:k2000:p64", "2x8/2x700:k2000:p16"]),
    ("gqa-cluster", ["2x8/2x500:k1500:p32"]),
    ("full-pair192", ["2x8/2x300:k1000:full:p16", "2x8/2x1000:k300:full:p64"]),
]
ALL = [(name, Problem.parse(t)) for name, texts in CASES for t in texts]


@pytest.fixture(scope="module")
def kernels() -> dict[tuple[KernelConfig, ProblemClass], KernelLaunch]:
    return case_kernels(ALL)


@pytest.mark.parametrize(("name", "p"), ALL, ids=lambda x: case_id(x))
def test_paged_problems_pass_the_gate(bench: Bench, kernels: dict, name: str, p: Problem) -> None:
    g = gate_case(bench, kernels, load_preset(name), p)
    assert g.passed, g.summary()


def test_a_paged_library_runs_plain_fixed_problems(bench: Bench, kernels: dict) -> None:
    cfg = load_preset("default")
    kernel = kernels[(cfg, Problem.parse("4x8/2x256:k2000:p64").problem_class)]
    plain = Problem.parse("2x8/2x300:k1500")
    g = bench.gate(kernel, plain)
    bench.release(plain)
    assert g.passed, g.summary()


@pytest.mark.parametrize(("what", "entry"), [("past the pool", 1 << 20), ("negative", -3)])
def test_a_bad_block_table_never_faults(bench: Bench, kernels: dict, what: str,
                                        entry: int) -> None:
    """One entry a sequence needs points outside the pool: the schedule kernel refuses the
    batch (NaN o and lse, status FA_TUNE_BAD_BLOCK_TABLE), and a good table works after it."""
    from tuner.kernel.runtime import AttnBuffers

    cfg = load_preset("default")
    p = Problem.parse("4x8/2x256:k2000:p64")
    launch = kernels[(cfg, p.problem_class)]
    km = launch.module
    with AttnBuffers(bench.dev, p) as bufs:
        table = p.pages.block_table.copy()
        table[2, 5] = entry
        assert bufs.block_table is not None
        bufs.block_table.copy_from_host(np.ascontiguousarray(table))
        km.forward(bufs, None)
        bench.dev.synchronize()
        with pytest.raises(KernelError, match="block table entry lies outside") as ei:
            km.check_status()
        assert "first at sequence 2" in str(ei.value) and "\n" not in str(ei.value)
        o = bufs.o.copy_to_host(np.uint16)
        assert ((o & 0x7F80) == 0x7F80).all()  # every output NaN
    g = bench.gate(launch, p)  # the context survived: the good table passes
    bench.release(p)
    assert g.passed, g.summary()


def test_a_table_too_short_for_the_keys_is_one_line(bench: Bench, kernels: dict) -> None:
    """Fewer pages per row than seqlen_k needs is refused on the host before any launch."""
    from tuner.kernel.runtime import AttnBuffers

    p = Problem.parse("4x8/2x256:k2000:p64")
    km = kernels[(load_preset("default"), p.problem_class)].module
    with AttnBuffers(bench.dev, p) as bufs:
        a = km.args_for(bufs)
        a.max_pages = 8  # 512 keys' worth for 2000 keys
        with pytest.raises(KernelError, match="more keys than max_pages x page_size") as ei:
            km.forward_args(a, None)
        assert "\n" not in str(ei.value)
